#!/usr/bin/env bash
# Issue 13, Run 14 in one call (step caps 90 + 200 s): the far tiles' series as a polynomial in the
# column term (`fwd_row_series=1`, built after Run 13, one FMA a score less in the forward; offline
# D=64: FFMA 352 -> 312, 24 B more stack), alone and with Run 13b's looser order-2 series, next to
# `t2l` and the default at D=64 and D=128, 4k/16k/64k. Each variant is checked against float64 at
# N=2048 (out, dq, dk, dv) and, new in this run, on the 64k far rows (the last 256 queries, keys up
# to 64k away: where a looser series could cost the bar), at both head dims.
#   rs3   fwd_row_series=1 (order 3, tolerance 1e-6, as the default)
#   rs2l  fwd_row_series=1, taylor_order=2, taylor_tolerance=1e-5
#   t2l   taylor_order=2, taylor_tolerance=1e-5 (Run 13b: D=64 fwd+bwd 0.996/0.982/0.978)
# Adoption (PLAN.md): > 1.1% faster at every N, every check within the bar (1.5), far rows at both D.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run14.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run14
step tests 90 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_triton_attention.py \
    -k "row_series or taylor or long_range"
step attention 200 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants rs3:fwd_row_series=1 rs2l:fwd_row_series=1,taylor_order=2,taylor_tolerance=1e-5 \
    t2l:taylor_order=2,taylor_tolerance=1e-5 --out "$WORK/attention"
finish_variants kernel_run14 tests
