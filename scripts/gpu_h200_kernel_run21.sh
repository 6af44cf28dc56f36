#!/usr/bin/env bash
# Issue 13, Run 21 in one call (step caps 130 + 100 + 40 s), written 2026-12-03 (seventeenth
# session) after Run 20 timed the final D=64 default (fwd 1.20-1.42x flash, fwd+bwd 1.37-1.43x):
#   ncu        Nsight Compute of the final defaults at N=16k, B=4, H=16, causal bf16: TAPA's forward
#              at D=64 and D=128 and its two D=64 backward kernels, and SDPA-flash's forward and
#              backward beside them. Every earlier profile (Runs 10, 16, 17) read issue slots and
#              pipe use only; this one also exports each report's raw metrics, whose
#              smsp__average_warps_issue_stalled_*_per_issue_active rows say what the warps wait on
#              (the "latency-bound" reading of Runs 10 and 17, tested)
#              (as run, the flash backward's regex was "flash_bwd", which caught flash's 0.15 ms
#              dot(dO, O) preprocessing kernel; the regex now names its main kernel, whose profile
#              raw_old reads from Run 16)
#   raw_old    the same raw export of the committed Run-16 and Run-17 backward reports (no GPU work)
#   tiles64    the D=64 tiles once more under the final per-score chain (the tiles were chosen in
#              Runs 10-13, before the radians, fast-scalar and split-distance cuts): a 64-query
#              dK/dV step, a 64x64 dQ kernel under the cap, a third stage in the forward and dQ,
#              and the winners combined
#   device tool: run(command="bash scripts/gpu_h200_kernel_run21.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run21
step ncu 130 bash scripts/ncu_defaults.sh "$WORK"
cat > "$WORK/raw_old.sh" <<RAW
mkdir -p "$WORK/raw_old"
for rep in results/kernel-h200/run-16-2026-12-03/kernel_run16/ncu/*.ncu-rep \
           results/kernel-h200/run-17-2026-12-03/kernel_run17/ncu/*.ncu-rep; do
    ncu --import "\$rep" --page raw > "$WORK/raw_old/\$(basename "\$rep" .ncu-rep)_raw.txt"
done
RAW
step raw_old 40 bash "$WORK/raw_old.sh"
step tiles64 100 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 8 \
    --variants dkdv64:dkdv=64x64/4/2/r168 dq64:dq=64x64/4/2/r168 fwds3:fwd=64x64/4/3/r168 \
    dqs3:dq=64x32/4/3 --combine-best --combine-head-dims 64 --out "$WORK/attention"
finish_variants kernel_run21 ncu
# (as run: a grep/awk listing of each raw page's largest stall ratios; the table is the same data)
python3 scripts/ncu_stalls.py "$WORK"/ncu/*_raw.txt "$WORK"/raw_old/*_raw.txt
