#!/usr/bin/env bash
# Issue 13, Run 15 in one call (step caps 50 + 110 s: it fits the 241 s the session had left): the new 16-bit default (Run 14's `rs2l`:
# the far tiles' series at order 2, tolerance 1e-5, in the forward as a polynomial in the column
# term) under the fused kernels' CUDA tests, then timed against the Run-13 default (`run13`, order 3
# at 1e-6 in u) in the same run at D=64 and D=128, 1k/4k/16k/64k, with the float64 checks at
# N=2048 and the 64k far rows for both.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run15.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run15
step tests_ops 50 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_triton_attention.py \
    -k "long_range or row_series or mufu or defaults"
step attention 110 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 1024 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants run13:fwd_row_series=0,taylor_order=3,taylor_tolerance=1e-6 --out "$WORK/attention"
finish_variants kernel_run15 tests_ops
