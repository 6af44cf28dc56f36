#!/usr/bin/env bash
# Issue 13, second probe (one device call, about 4 minutes): occupancy. ncu showed every kernel at
# one 8-warp block per SM, latency-bound (no eligible warp 41-54% of cycles; probe-2026-12-01).
# These variants of the 2026-12-01 defaults let 2-3 blocks share an SM (registers and shared
# memory from the offline census, results/kernel-h200/offline-census-2.md). Judged like the first
# probe: accuracy vs float64 first, then time next to the default and SDPA in the same run.
#   device tool: run(command="bash scripts/gpu_h200_kernel_probe2.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/kernel_probe2_out}
WORK=/tmp/kernel_probe2
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
VARIANTS=(
    # forward: 2 blocks of 4 warps (232 regs, 80 KB) / 3 blocks (164 regs, 64 KB) per SM
    "fwd-64x64-4w:fwd=64x64/4/2" "fwd-64x32-4w:fwd=64x32/4/3"
    # dK/dV with dQ atomics: 2 blocks per SM (16x64/4: 255 regs, 70 KB; 32x32/4: 231 regs, 38 KB,
    # mma.sync only), and the 8-warp tile without the default's 40 B of stack (32x64/8)
    "dkdv-16x64-4w:dkdv=16x64/4/2" "dkdv-32x32-4w:dkdv=32x32/4/2" "dkdv-32x64:dkdv=32x64/8/2"
)
timeout 260 python3 -m tapa.bench.attention --head-dims 128 --causal causal --seq-lens 4096 16384 \
    --long-range-len 0 --reference-len 0 --compile-jobs 6 --kernel-report --combine-best \
    --out "$WORK/attention" --variants "${VARIANTS[@]}" > "$WORK/attention.log" 2>&1
echo "attention rc=$?"
tar czf "$OUT/kernel_probe2.tar.gz" -C /tmp kernel_probe2
grep -A 40 "^| variant | D" "$WORK/attention/attention.md" | head -40
