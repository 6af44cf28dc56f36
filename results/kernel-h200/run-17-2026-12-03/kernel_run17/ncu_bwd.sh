for kernel in _bwd_dkdv_kernel _bwd_dq_kernel; do
    ncu_details "/tmp/kernel_run17/ncu/all_${kernel}_64" "$kernel"         "SpeedOfLight ComputeWorkloadAnalysis WarpStateStats InstructionStats LaunchStats Occupancy"         python3 scripts/ncu_bwd_driver.py tapa 64 dq_cos_radians=1,dkdv_cos_radians=1,bwd_fast_scalars=1,dq_split_s=1,dkdv_split_s=1
done
