#!/usr/bin/env bash
# Issue 13, Run 20 in one call (step caps 170 + 150 + 120 + 90 s), written 2026-12-03 (seventeenth
# session). Run 19 ran the same first two steps on c36a2e3, but its files did not survive the
# session that made it (cut off before they were committed), so nothing of it is quoted; its two
# CUDA test failures were expectations written for the old D=64 flags, fixed since:
#   tests_ops  all of tests/ops on CUDA under the final default (the D=64 16-bit backward with
#              MUFU trig in radians, far-tile scalars from the MUFU and the dQ kernel's split
#              distances: Runs 17-18)
#   attention  the default alone against SDPA-flash and cuDNN at D=64 and D=128, 1k-64k causal,
#              with the float64 checks at N=2048 and the 64k far rows: the table the README quotes
#   model      `tapa bench model`: 124M, TAPA / hybrid / RoPE training throughput at 2k-32k; last
#              run Run 8 (TAPA/RoPE 0.958 at 32k eager). (Written as "12 heads of 64, so the D=64
#              kernels" when run; the bench model has 6 heads of 128, so the D=128 kernels)
#   decode     `tapa bench decode --graphs`: batch 1/8/32 x caches 4k-128k against the best SDPA
#              backend; last run Run 7 (18 of 18 shapes within 1.2x)
#   device tool: run(command="bash scripts/gpu_h200_kernel_run20.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run20
default_steps 150
step model 120 python3 -m tapa.cli bench model --out "$WORK/model"
step decode 90 python3 -m tapa.cli bench decode --graphs --out "$WORK/decode"
finish_head kernel_run20 tests_ops
print_defaults
grep -E "^\| " "$WORK/model/README.md" 2>/dev/null | head -20 | cut -c1-260
tail -n 3 "$WORK/model.log"
grep -E "^\| " "$WORK/decode/decode.md" 2>/dev/null | head -30 | cut -c1-200
tail -n 3 "$WORK/decode.log"
