#!/usr/bin/env bash
# Issue 13, Run 13 in one call (step cap 240 s; results/kernel-h200/offline-census-8.md says why
# these tiles): D=64 tiles with more blocks per SM, each checked against float64 (N=2048) and
# timed next to the default at 4k/16k/64k, then the best forward and the best backward merged
# (`--combine-best`), checked and timed again.
#   dqr128    dQ 64x32/4/2 capped at 128 registers: 4 blocks per SM instead of 3 (15 spill loads)
#   dkdv16    dK/dV 16x64/4/2: no stack (the default 32x64/4/2/r168 has 16 B), 3 blocks as now
#   dkdv16r   dK/dV 16x64/4/2 capped at 128: 4 blocks (5 spill loads)
#   bwd2      dkdv16r and dqr128 together (one backward group: --combine-best picks one variant)
#   f6432     forward 64x32/4/2: 125 registers, no stack, 4 blocks per SM instead of 3
#   f6432s3   the same at 3 stages, capped at 128 (32 KB of shared memory a block)
#   f12832    forward 128x32/8/2 capped at 128: 2 blocks of 8 warps (16 warps per SM)
#   device tool: run(command="bash scripts/gpu_h200_kernel_run13.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run13
step attention64 240 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants dqr128:dq=64x32/4/2/r128 dkdv16:dkdv=16x64/4/2 dkdv16r:dkdv=16x64/4/2/r128 \
    bwd2:dkdv=16x64/4/2/r128,dq=64x32/4/2/r128 f6432:fwd=64x32/4/2 f6432s3:fwd=64x32/4/3/r128 \
    f12832:fwd=128x32/8/2/r128 --combine-best --combine-head-dims 64 --out "$WORK/attention64"
tar czf "$OUT/kernel_run13.tar.gz" -C /tmp kernel_run13
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/steps.txt"
grep -h -A 6 "^## Long range" "$WORK"/attention64/attention.md 2>/dev/null
grep -h "| yes\|| NO" "$WORK"/attention64/attention.md | head -12
grep -h -A 14 "^| variant | D" "$WORK"/attention64/attention.md 2>/dev/null | head -40
grep -h "combination" "$WORK"/attention64.log | head -5
tail -5 "$WORK"/attention64.log
