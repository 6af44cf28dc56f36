#!/usr/bin/env bash
# Issue 13, Run 33 in one call (step caps 90 + 150 s), written 2026-12-04 (nineteenth session):
#   tests_new  the new CUDA tests: the band loops' bounds against the tile test, the bands and
#              loops against float64 at every band's offsets, and the variant checks
#   attention  `fwd_band_loops` (offline-census-9.md's candidate 4, built this session): the
#              forward's causal unmasked key blocks in four loops, one a series band, each compiled
#              for its one path. Offline (Triton 3.6, `scripts/fwd_loop_census.py --head-dim 64
#              --variant fwd_band_loops=1 --paths`) a tile iteration goes 538 / 576 / 616 / 668 ->
#              532 / 568 / 612 / 652 (orders 1 / 2 / 3 / near), and the stack 56 -> 80 B; each loop
#              has its own pipeline prologue. `bands` is far_bands alone: a replicate of the default
#              at D=64, the Run-29 variant at D=128.
# As run, at 8cd825e (results/kernel-h200/run-33.md). `fwd_band_loops` lost and was removed after
# it, so rerun this from a checkout of 8cd825e.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run33.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run33
step tests_new 90 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_triton_attention.py \
    -k "band or half_precision_bar"
step attention 150 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 1024 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants bands:far_bands=1 loops:far_bands=1,fwd_band_loops=1 --out "$WORK/attention"
finish_variants kernel_run33 tests_new
