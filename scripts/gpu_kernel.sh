#!/usr/bin/env bash
# The kernel suite in one device call: the CUDA tests of tests/ops, the attention bench of the
# shipped defaults (ROUNDS rounds, so that run-to-run noise shows) and the decode bench.
#   usage:  bash scripts/gpu_kernel.sh NAME [ROUNDS] [varlen]
#   device: run(command="bash scripts/gpu_kernel.sh guard-before 2", kind="nvidia-h200")
# With `varlen` last, also `tapa bench varlen` (packed documents against the dense kernel and
# FlexAttention's document mask).
# Logs and tables go to /tmp/NAME and come back as $OUT/NAME.tar.gz; the summary is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: gpu_kernel.sh NAME [ROUNDS] [varlen]}
ROUNDS=${2:-1}
VARLEN=${3:-}
source scripts/gpu_steps.sh "$NAME"
step tests_ops 280 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops
for round in $(seq 1 "$ROUNDS"); do
    step "attention$round" 150 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
        --seq-lens 1024 4096 16384 65536 --reference-len 0 --out "$WORK/attention$round"
done
step decode 90 python3 -m tapa.cli bench decode --out "$WORK/decode"
if [ "$VARLEN" = varlen ]; then
    step varlen 240 python3 -m tapa.cli bench varlen --corpus-bytes 2000000 \
        --cache-dir "$WORK/cache" --out "$WORK/varlen"
fi
tar czf "$OUT/$NAME.tar.gz" -C /tmp "$NAME"
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/gpu.txt" "$WORK/steps.txt"
tail -4 "$WORK/tests_ops.log"
for round in $(seq 1 "$ROUNDS"); do
    echo "== attention round $round"
    grep -h -B2 -A 12 "^| N | pass" "$WORK/attention$round/attention.md" | head -40
done
grep -E "^\| (1|8|32) \| " "$WORK/decode/decode.md" | head -18 | cut -c1-160
[ "$VARLEN" = varlen ] && grep "^|" "$WORK/varlen.log"
