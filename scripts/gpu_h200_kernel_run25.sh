#!/usr/bin/env bash
# Issue 13, Run 25 in one call (step caps 170 + 150 + 120 s), written 2026-12-04 (eighteenth
# session) after Run 24 made the forward's TMA tiles the 16-bit D=128 default:
#   tests_ops  all of tests/ops on CUDA under the new default (the new TMA and lazy-rescale
#              variants' float64 checks included)
#   attention  the default alone against SDPA-flash and cuDNN at D=64 and D=128, 1k-64k causal,
#              with the float64 checks at N=2048 and the 64k far rows: the README's table
#   model      `tapa bench model`: 124M (6 heads of 128, so the D=128 kernels), TAPA / hybrid /
#              RoPE training throughput at 2k-32k
#   device tool: run(command="bash scripts/gpu_h200_kernel_run25.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run25
step tests_ops 170 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops
step attention 150 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 1024 4096 16384 65536 --reference-len 0 --compile-jobs 8 --out "$WORK/attention"
step model 120 python3 -m tapa.cli bench model --out "$WORK/model"
tar czf "$OUT/kernel_run25.tar.gz" -C /tmp kernel_run25
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/steps.txt"
tail -4 "$WORK/tests_ops.log"
grep -h -B2 -A 12 "^| N | pass" "$WORK/attention/attention.md" | head -60
grep -h -A 8 "^## Long range" "$WORK/attention/attention.md" | head -10
tail -3 "$WORK/attention.log"
grep -E "^\| " "$WORK/model/README.md" 2>/dev/null | head -20 | cut -c1-260
tail -n 3 "$WORK/model.log"
