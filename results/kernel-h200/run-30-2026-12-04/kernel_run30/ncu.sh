for case in "tapa 64 _fwd_kernel fwd" "flash 64 flash_fwd fwd" "tapa 128 _fwd_kernel fwd"             "flash 128 flash_fwd fwd" "tapa 64 _bwd_dkdv_kernel dkdv" "tapa 64 _bwd_dq_kernel dq"             "flash 64 flash_bwd_dq_dk_dv bwd"; do
    set -- $case
    ncu_details "/tmp/kernel_run30/ncu/$4_$1_$2" "$3" "SpeedOfLight ComputeWorkloadAnalysis WarpStateStats SchedulerStats InstructionStats LaunchStats Occupancy" python3 scripts/ncu_bwd_driver.py "$1" "$2"
    ncu --import "/tmp/kernel_run30/ncu/$4_$1_$2.ncu-rep" --page raw > "/tmp/kernel_run30/ncu/$4_$1_$2_raw.txt"
done
