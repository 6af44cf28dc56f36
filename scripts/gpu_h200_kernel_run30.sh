#!/usr/bin/env bash
# Issue 13, Run 30 in one call (step caps 170 + 120 + 90 + 130 s), written 2026-12-04 (nineteenth
# session) after Run 29 made the forward's series bands (`far_bands`) the 16-bit D=64 default:
#   tests_ops  all of tests/ops on CUDA under the new default
#   attention  the default alone against SDPA-flash and cuDNN at D=64 and D=128, 1k-64k causal,
#              with the float64 checks at N=2048 and the 64k far rows: the README's table
#   ramp64     D=64 only: the column ramp's series (`fwd_ramp_series`, Run 16: fwd x0.994 / 0.987 /
#              0.969 at 4k / 16k / 64k without bands) on top of the bands; offline (Triton 3.6,
#              `scripts/fwd_loop_census.py --head-dim 64 --variant fwd_ramp_series=1 --paths`) the
#              order-1 / 2 / 3 band tiles 538 / 576 / 616 -> 522 / 563 / 606 instructions
#   ncu        Nsight Compute of the final defaults at N=16k, B=4, H=16, causal bf16, as Run 21: TAPA's
#              forward at D=64 and D=128 and its two D=64 backward kernels, SDPA-flash's forward and
#              backward beside them, each report's raw page for the stall table
#   device tool: run(command="bash scripts/gpu_h200_kernel_run30.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run30
default_steps 120
step ramp64 90 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 1024 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants ramp:fwd_ramp_series=1 --out "$WORK/ramp64"
step ncu 130 bash scripts/ncu_defaults.sh "$WORK"
finish_head kernel_run30 tests_ops
print_defaults
grep -h "| yes\|| NO" "$WORK/ramp64/attention.md" | head -4
grep -h -A 10 "^| variant | D" "$WORK/ramp64/attention.md" | head -12
grep -h -A 6 "^## Long range, variants" "$WORK/ramp64/attention.md"
python3 scripts/ncu_stalls.py "$WORK"/ncu/*_raw.txt 2>&1 | head -40
