for case in "tapa 64 _bwd_dkdv_kernel dkdv" "tapa 64 _bwd_dq_kernel dq" "flash 64 flash_bwd_dq_dk_dv flash"; do
    set -- $case
    ncu_details "$WORK/ncu/bwd_$4_$2" "$3" \
        "SpeedOfLight ComputeWorkloadAnalysis WarpStateStats InstructionStats LaunchStats Occupancy" \
        python3 "$WORK/bwd_driver.py" "$1" "$2"
done
