#!/usr/bin/env bash
# Issue 13, Run 12b in one call (step cap 100 s): the D=64 default with Run 12a's dQ tile
# (64x32/4/2) checked against float64 (N=2048, and the 64k far rows) and timed next to Run 11's
# D=64 default (`run11`, dQ 128x64/8/2) at 4k/16k/64k.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run12b.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run12b
step attention64 100 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 4 \
    --variants run11:dq=128x64/8/2 --out "$WORK/attention64"
tar czf "$OUT/kernel_run12b.tar.gz" -C /tmp kernel_run12b
echo "done at +$(($(date +%s) - START))s"
grep -h -A 6 "^## Long range" "$WORK"/attention64/attention.md 2>/dev/null
grep -h "| yes\|| NO" "$WORK"/attention64/attention.md | head -4
grep -h -A 8 "^| variant | D" "$WORK"/attention64/attention.md 2>/dev/null | head -10
