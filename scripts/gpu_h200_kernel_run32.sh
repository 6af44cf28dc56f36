#!/usr/bin/env bash
# Issue 13, Run 32 in one call (step cap 150 s), written 2026-12-04 (nineteenth session) after Run
# 31 timed the 64x128/8/2 dK/dV tile with dQ by atomics at D=64 (bwd x1.044-1.082 of the default,
# the nearest a fused D=64 backward has come): that tile's offline variants (Triton 3.6,
# `python -m tapa.bench.kernel_report --head-dim 64 ...`), each 255 registers, one block a SM:
#   s3     a third pipeline stage (56 B of stack, 132 KB of shared memory)
#   tma    its Q and dO tiles by TMA (48 -> 24 B of stack, local loads and stores 15 / 12 -> 6 / 8)
#   s3tma  both
#   at     Run 22's transposed atomics on the default 32x64/4/2/r168 tile, as the reference
#   device tool: run(command="bash scripts/gpu_h200_kernel_run32.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run32
ATOMIC=dq_atomic=1,dq_transpose=1
step attention 150 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 8 \
    --variants s3:$ATOMIC,dkdv=64x128/8/3 tma:$ATOMIC,dkdv=64x128/8/2,dkdv_tma=1 \
    s3tma:$ATOMIC,dkdv=64x128/8/3,dkdv_tma=1 at:$ATOMIC --out "$WORK/attention"
tar czf "$OUT/kernel_run32.tar.gz" -C /tmp kernel_run32
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/steps.txt"
grep -h "| yes\|| NO" "$WORK/attention/attention.md" | head -8
grep -h -A 18 "^| variant | D" "$WORK/attention/attention.md" | head -20
tail -3 "$WORK/attention.log"
