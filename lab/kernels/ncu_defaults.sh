#!/usr/bin/env bash
# Nsight Compute of the shipped kernels against SDPA-flash at N=16k, B=4, H=16, causal bf16
# (lab/kernels/ncu_bwd_driver.py): TAPA's forward at D=64 and D=128, its two D=64 backward kernels,
# flash's forward at both and its D=64 backward. Each report's details page and raw page (the
# stall table: `python3 lab/kernels/ncu_stalls.py WORK/ncu/*_raw.txt`) go under WORK/ncu. From the
# repository root, on a GPU machine with ncu:
#   bash lab/kernels/ncu_defaults.sh "$WORK"
set -uo pipefail
work=$1
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"

ncu_details() {  # ncu_details STEM KERNEL_REGEX "SECTION ..." COMMAND...: Nsight Compute of the first
    # matching launch of COMMAND (SM clock untouched) to STEM.ncu-rep, its details page to STEM_details.txt
    local stem=$1 regex=$2 section sections=()
    for section in $3; do sections+=(--section "$section"); done
    shift 3
    mkdir -p "$(dirname "$stem")"
    ncu --clock-control none --kernel-name "regex:$regex" --launch-count 1 "${sections[@]}" \
        -f -o "$stem" "$@" &&
        ncu --import "$stem.ncu-rep" --page details > "${stem}_details.txt"
}

sections="SpeedOfLight ComputeWorkloadAnalysis WarpStateStats SchedulerStats InstructionStats LaunchStats Occupancy"
for case in "tapa 64 _fwd_kernel fwd" "flash 64 flash_fwd fwd" "tapa 128 _fwd_kernel fwd" \
            "flash 128 flash_fwd fwd" "tapa 64 _bwd_dkdv_kernel dkdv" "tapa 64 _bwd_dq_kernel dq" \
            "flash 64 flash_bwd_dq_dk_dv bwd"; do
    set -- $case
    stem="$work/ncu/$4_$1_$2"
    ncu_details "$stem" "$3" "$sections" python3 -m lab.kernels.ncu_bwd_driver "$1" "$2"
    ncu --import "$stem.ncu-rep" --page raw > "${stem}_raw.txt"
done
