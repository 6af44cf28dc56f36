#!/usr/bin/env bash
# Issue 13, the calls after Run 4 in one (step caps 540 s, under 10 minutes; results/kernel-h200/PLAN.md):
#   decode_tests  the decode kernel's CUDA path first: the kept autotuned config (a launch plan per
#                 call signature) has only run in the interpreter
#   fwd64         the occupancy probe's winner, a 4-warp 64x64 forward, next to the default at every
#                 N, D = 128 and 64 (it becomes the default only if it wins at every N)
#   dkdv_t        the atomic dK/dV kernel with its dQ products transposed (dQ^T = K^T dS: wgmma
#                 instead of mma.sync; offline-census-3.md) at 32x128 and 16x128, next to the
#                 default at N = 4k/16k/64k, D = 128, with the launched kernels' registers and spills
#   decode        tapa bench decode with --graphs (TAPA and SDPA as CUDA-graph replays) and the
#                 batch-1 floor profile, after the host-side changes
#   device tool: run(command="bash scripts/gpu_h200_kernel_next.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_next
PYTEST_ARGS=(-p no:cacheprovider -rfE --tb=short)  # pyproject adds -q
step decode_tests 90 python3 -m pytest tests/ops/test_decode_kernel.py tests/ops/test_decode.py \
    tests/bench/test_bench_decode.py "${PYTEST_ARGS[@]}"
step fwd64 170 python3 -m tapa.bench.attention --head-dims 128 64 --causal causal \
    --seq-lens 1024 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --out "$WORK/fwd64" --variants "fwd64:fwd=64x64/4/2"
step dkdv_t 130 python3 -m tapa.bench.attention --head-dims 128 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 --kernel-report \
    --out "$WORK/dkdv_t" --variants "dqt:dq_transpose=1" "dqt-16x128:dq_transpose=1,dkdv=16x128/8/2"
step decode 150 python3 -m tapa.cli bench decode --graphs --profile --out "$WORK/decode"
tar czf "$OUT/kernel_next.tar.gz" -C /tmp kernel_next
echo "done at +$(($(date +%s) - START))s"
grep -E "^(FAILED|ERROR)|passed|failed" "$WORK/decode_tests.log" | cut -c1-300 | tail -10
grep -A 40 "^| variant | D" "$WORK/fwd64/attention.md" | head -40
grep -A 20 "^| variant | D" "$WORK/dkdv_t/attention.md" | head -20
grep -E "dkdv" "$WORK/dkdv_t/attention_kernels.md" | head -6
tail -n 32 "$WORK/decode/decode.md"
