#!/usr/bin/env bash
# Issue 13, Run 13b in one call (step cap 160 s): lower-degree d**alpha series on far tiles, at
# D=64 and D=128, each checked against float64 (N=2048) and timed next to the default at
# 4k/16k/64k. The default is taylor_order=3 at tolerance 1e-6; each order removes one FMA per
# score on far tiles, and the host narrows the far band to keep the tolerance (offline: forward
# FFMA 352 / 288 / 224 for orders 3 / 2 / 1 at D=64; results/kernel-h200/run-13.md).
#   t2   taylor_order=2 (tolerance 1e-6)
#   t2l  taylor_order=2, taylor_tolerance=1e-5
#   t1l  taylor_order=1, taylor_tolerance=1e-5
#   device tool: run(command="bash scripts/gpu_h200_kernel_run13b.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run13b
step attention 160 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --long-range-len 0 --compile-jobs 8 \
    --variants t2:taylor_order=2 t2l:taylor_order=2,taylor_tolerance=1e-5 \
    t1l:taylor_order=1,taylor_tolerance=1e-5 --out "$WORK/attention"
tar czf "$OUT/kernel_run13b.tar.gz" -C /tmp kernel_run13b
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/steps.txt"
grep -h "| yes\|| NO" "$WORK"/attention/attention.md | head -12
grep -h -A 30 "^| variant | D" "$WORK"/attention/attention.md 2>/dev/null | head -34
tail -3 "$WORK"/attention.log
