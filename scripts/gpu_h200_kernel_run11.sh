#!/usr/bin/env bash
# Issue 13, Run 11 in one call (step caps 270 s): the check and timing that the new D=64 defaults
# need before they land, and a first look at the same register caps at D=128.
#   tests_ops    the fused kernels' tests on CUDA under the new defaults (bf16 accuracy, the 64k
#                long-range rows, the MUFU paths' float64 checks)
#   attention64  `tapa bench attention` at D=64, causal, 4k/16k/64k, with the bf16 check and the
#                64k far-row check on the new default, and Run 9's D=64 default timed next to it as
#                a variant (`run9`), so the change's ratio comes from one run
#   variants128  Run 10's D=64 winners tried at D=128: the 32x64 dK/dV, uncapped and at 168
#                registers; the 64x64 forward at every length, uncapped and at 168 registers
#   device tool: run(command="bash scripts/gpu_h200_kernel_run11.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run11
step tests_ops 80 python3 -m pytest tests/ops/test_triton_attention.py tests/ops/test_checks.py \
    "${PYTEST_ARGS[@]}"
step attention64 90 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 4 \
    --variants run9:fwd=64x64/4/2,fwd_long=128x64/8/3,dkdv=32x128/8/2 --out "$WORK/attention64"
step variants128 100 python3 -m tapa.bench.attention --head-dims 128 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --variants dkdv64:dkdv=32x64/4/2 dkdv64r:dkdv=32x64/4/2/r168 fwdall:fwd=64x64/4/2 \
    r168all:fwd=64x64/4/2/r168 --out "$WORK/variants128"
tar czf "$OUT/kernel_run11.tar.gz" -C /tmp kernel_run11
echo "done at +$(($(date +%s) - START))s"
grep -E "^(FAILED|ERROR)|passed|failed" "$WORK/tests_ops.log" | tail -8
grep -h -A 12 "^| variant | D" "$WORK"/attention64/attention.md 2>/dev/null | head -14
grep -h -B2 -A 12 "x SDPA flash" "$WORK"/attention64/attention.md 2>/dev/null | head -16
grep -h -A 16 "^| variant | D" "$WORK"/variants128/attention.md 2>/dev/null | head -18
grep -h "meets bar\|| yes\|| no" "$WORK"/*/attention.md | head -20
