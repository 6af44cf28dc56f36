#!/usr/bin/env bash
# Nsight Compute of the default kernels against SDPA-flash at N=16k, B=4, H=16, causal bf16
# (`scripts/ncu_bwd_driver.py`): TAPA's forward at D=64 and D=128, its two D=64 backward kernels,
# flash's forward at both and its D=64 backward. Each report's details page and raw page (the
# stall table: `python3 scripts/ncu_stalls.py WORK/ncu/*_raw.txt`) go under WORK/ncu. Run as a
# device script's step, after `source scripts/device_steps.sh` (its ncu_details):
#   step ncu 130 bash scripts/ncu_defaults.sh "$WORK"
set -uo pipefail
work=$1
sections="SpeedOfLight ComputeWorkloadAnalysis WarpStateStats SchedulerStats InstructionStats LaunchStats Occupancy"
for case in "tapa 64 _fwd_kernel fwd" "flash 64 flash_fwd fwd" "tapa 128 _fwd_kernel fwd" \
            "flash 128 flash_fwd fwd" "tapa 64 _bwd_dkdv_kernel dkdv" "tapa 64 _bwd_dq_kernel dq" \
            "flash 64 flash_bwd_dq_dk_dv bwd"; do
    set -- $case
    stem="$work/ncu/$4_$1_$2"
    ncu_details "$stem" "$3" "$sections" python3 scripts/ncu_bwd_driver.py "$1" "$2"
    ncu --import "$stem.ncu-rep" --page raw > "${stem}_raw.txt"
done
