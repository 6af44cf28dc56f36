#!/usr/bin/env bash
# Issue 13, Run 31 in one call (step caps 170 + 110 s), written 2026-12-04 (nineteenth session):
#   tests_ops  all of tests/ops on CUDA after Run 30's 10 failures (variant tests at taylor_order 3
#              on the D=64 default's bands; they now name far_bands=0) and with bwd_bands' float64
#              checks (offline-census-12.md)
#   atomic64   D=64: dQ by atomics from dK/dV kernels of 128 keys, the tiles that compile without
#              spilling, or nearly, offline (Triton 3.6, `python -m tapa.bench.kernel_report
#              --head-dim 64 ...`): 64x128/8/2 (255 registers, 48 B of stack, 64 queries a step)
#              and 16x128/4/2 (255, 8 B; two blocks a SM). Run 22 timed the 32x128/8/2 one (249
#              registers, no stack, one block a SM): bwd x1.46-1.55. A 128-key tile halves the
#              float32 atomics a score of the default's 64-key one.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run31.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run31
step tests_ops 170 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops
step attention 110 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 8 \
    --variants a64x128:dq_atomic=1,dq_transpose=1,dkdv=64x128/8/2 \
    a16x128:dq_atomic=1,dq_transpose=1,dkdv=16x128/4/2 --out "$WORK/attention"
finish_variants kernel_run31 tests_ops
