#!/usr/bin/env bash
# Issue 13, Run 23 in one call (step cap 200 s), written 2026-12-04 (seventeenth session): all of
# tests/ops on CUDA after the kernels' split distances moved into one helper (_tile_distances; the
# offline Triton 3.6 counts of every kernel are unchanged, the commit message lists them).
#   device tool: run(command="bash scripts/gpu_h200_kernel_run23.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run23
step tests_ops 200 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops
tar czf "$OUT/kernel_run23.tar.gz" -C /tmp kernel_run23
cat "$WORK/steps.txt"
tail -4 "$WORK/tests_ops.log"
