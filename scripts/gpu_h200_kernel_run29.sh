#!/usr/bin/env bash
# Issue 13, Run 29 in one call (step caps 90 + 150 s), written 2026-12-04 (eighteenth session),
# not yet run: the forward's series bands (results/kernel-h200/offline-census-11.md):
#   bands  far_bands: order 1 on the farthest tiles, order 2 as now, order 3 between that band and
#          the diagonal. Offline (Triton 3.6), D=64: a far tile 574 -> 538 instructions at order 1,
#          a tile between the band and the diagonal 666 -> 616; expected x0.95-0.98 of the
#          forward's unmasked-loop instructions at 1k-64k.
#   pers   fwd_persistent in its batch-head-major order (since Run 28, which timed the query-block
#          major one at e069af3: 12-41% slower, likely its L2 misses; offline the same 176 B of
#          stack at D=64's 168-register cap)
# Adoption (PLAN.md): the forward faster by more than 1.1% at every N at that head dim, the gated
# errors within 1.5x, the 64k far rows as the default's.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run29.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run29
step tests_new 90 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_triton_attention.py \
    -k "far_bands or persistent"
step attention 150 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 1024 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants bands:far_bands=1 pers:fwd_persistent=1 \
    --out "$WORK/attention"
finish_variants kernel_run29 tests_new
