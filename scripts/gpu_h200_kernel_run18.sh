#!/usr/bin/env bash
# Issue 13, Run 18 in one call (step caps 170 + 130 s), written 2026-12-03 right after Run 17:
# all of tests/ops on CUDA under the new D=64 default (Run 17's `rad`: both backward kernels'
# MUFU sin/cos on the unreduced phase), then the cuts Run 17 timed only inside `all` (which also
# held the dK/dV kernel's split distances, a loss at both head dims), on top of the new default:
#   fast     bwd_fast_scalars: the backward's far-tile log2(d0) and 1 / d0 from the MUFU
#   fastdq   fast + dq_split_s (the dQ kernel's distances as row offsets less the column ramp)
#   fastdqrs fast + dq_row_series (that and the dQ kernel's series in the column term)
# (at D=128 dQ goes by atomics, so the dq flags do nothing there: fastdq and fastdqrs are `fast`)
# Adoption: the backward faster by more than 1.1% at every N at that head dim, the gated errors
# within 1.5x, the far rows as the default's.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run18.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run18
step tests_ops 170 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops
step attention 130 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants fast:bwd_fast_scalars=1 fastdq:bwd_fast_scalars=1,dq_split_s=1 \
    fastdqrs:bwd_fast_scalars=1,dq_row_series=1 --out "$WORK/attention"
finish_variants kernel_run18 tests_ops
