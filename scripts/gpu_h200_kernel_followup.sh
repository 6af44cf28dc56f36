#!/usr/bin/env bash
# Issue 13 follow-up to scripts/gpu_h200_kernel_probe.sh (one device call, < 7 minutes):
#   best     the probe's winning combination (dQ by atomics + MUFU trig + order-3 d**alpha series on
#            far tiles) next to the default and SDPA at N = 4k, 16k, 64k, D = 128 and 64
#   tests    tests/ops compiled on the GPU with the failures named (the probe's step ran out of time)
#   hf       tests/hf under the GPU machine's transformers (CPU tests; the sliding-window cache)
#   device tool: run(command="bash scripts/gpu_h200_kernel_followup.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_followup
BEST="best:dq_atomic=1,trig_poly=0,taylor_order=3,taylor_tolerance=1e-6"
step best 140 python3 -m tapa.bench.attention --head-dims 128 64 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --out "$WORK/best" --variants "$BEST"
PYTEST_ARGS=(-q -p no:cacheprovider -rfE --tb=short)
python3 -c "import xdist" 2>/dev/null && PYTEST_ARGS+=(-n 8)
step tests 170 python3 -m pytest tests/ops "${PYTEST_ARGS[@]}"
step hf 80 python3 -m pytest tests/hf "${PYTEST_ARGS[@]}"
tar czf "$OUT/kernel_followup.tar.gz" -C /tmp kernel_followup
echo "done at +$(($(date +%s) - START))s"
grep -A 30 "^| variant | D" "$WORK/best/attention.md" | head -30
grep -E "^(FAILED|ERROR)|passed|failed" "$WORK/tests.log" "$WORK/hf.log" | cut -c1-300 | tail -30
