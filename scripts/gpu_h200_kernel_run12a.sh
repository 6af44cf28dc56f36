#!/usr/bin/env bash
# Issue 13, Run 12a in one call (step cap 150 s; results/kernel-h200/run-11.md says why):
#   attention64  the 64k far-row check at D=64 under the new D=64 defaults (the bench ran it at
#                D=128 only before), the N=2048 float64 check, and three dQ tiles at D=64 timed
#                next to the default at 4k/16k/64k: the dQ kernel is D=64's last uncapped
#                255-register, one-block-per-SM kernel (offline-census-7.md)
#   device tool: run(command="bash scripts/gpu_h200_kernel_run12a.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run12a
step attention64 150 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 4 \
    --variants dq64:dq=64x64/4/2 dq32:dq=128x32/8/2 dq32w4:dq=64x32/4/2 --out "$WORK/attention64"
tar czf "$OUT/kernel_run12a.tar.gz" -C /tmp kernel_run12a
echo "done at +$(($(date +%s) - START))s"
grep -h -A 6 "^## Long range" "$WORK"/attention64/attention.md 2>/dev/null
grep -h "meets bar\|| yes\|| no\|| NO" "$WORK"/attention64/attention.md | head -8
grep -h -A 14 "^| variant | D" "$WORK"/attention64/attention.md 2>/dev/null | head -16
