#!/usr/bin/env bash
# Issue 13, Run 22 in one call (step cap 150 s), written 2026-12-04 (seventeenth session) after
# Run 21: PLAN.md's first candidate for D=64's backward is dQ by atomics from the dK/dV kernel (no
# separate dQ kernel recomputing scores, phase and MUFU calls: 6.75e9 of the backward's 16.15e9
# instructions at 16k). Run 10 timed it at D=64 on the old 32x128/8/2 dK/dV tile and the old chain
# (11-14% slower). Here on the final chain: the atomic dQ, transposed and not, on the default
# 32x64/4/2/r168 dK/dV tile, and transposed on the 8-warp 32x128 tile (the atomics' cost spread
# over twice the keys), with the bf16 checks and the 64k far rows per variant.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run22.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run22
step attention 150 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants at:dq_atomic=1,dq_transpose=1 atn:dq_atomic=1,dq_transpose=0 \
    at128:dq_atomic=1,dq_transpose=1,dkdv=32x128/8/2 --out "$WORK/attention"
finish_variants kernel_run22 attention  # (as run: an empty none.log stood in for a tests step)
