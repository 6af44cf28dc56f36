for case in "tapa 64 _fwd_kernel" "flash 64 flash_fwd" "tapa 128 _fwd_kernel" "flash 128 flash_fwd"; do
    set -- $case
    ncu_details "$WORK/ncu/fwd_$1_$2" "$3" \
        "SpeedOfLight ComputeWorkloadAnalysis WarpStateStats InstructionStats LaunchStats Occupancy" \
        python3 "$WORK/fwd_driver.py" "$1" "$2"
done
