#!/usr/bin/env bash
# Issue 13, Run 28 in one call (step caps 90 + 150 s), written 2026-12-04 (eighteenth session):
# the issue's last untimed Hopper direction, persistent scheduling, for the forward:
#   pers   fwd_persistent: a one-dimensional grid of about as many programs as fit at once (the
#          168-register cap's three a SM at D=64, two 4-warp or one 8-warp program a SM at
#          D=128), each looping over (query block, batch-head) tiles, the longest rows first.
#          Offline (Triton 3.6): D=64 far tile 574 -> 580 instructions, stack 40 -> 176 B under
#          the cap; D=128 228/235 -> 255 registers, 24 B of stack on the 64x64 tile.
# Adoption (PLAN.md): the forward faster by more than 1.1% at every N at that head dim, the gated
# errors within 1.5x, the 64k far rows as the default's.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run28.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run28
step tests_new 90 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_triton_attention.py -k "persistent"
step attention 150 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 --variants pers:fwd_persistent=1 \
    --out "$WORK/attention"
finish_variants kernel_run28 tests_new
