#!/usr/bin/env bash
# The GPU measurements of the project in one call on an H200 (device tool), one after another:
# the ops' CUDA tests, the attention-kernel benchmark (with its bf16 and 64k long-range
# accuracy checks), the model-throughput benchmark and the decode benchmark (under 10 minutes).
# Step caps sum to 570 s (Run 4 took 328 s: tests 138, attention 63, model 86, decode 60). Results land in results/{kernel,model-throughput,decode}-h200/ and are packed into
# $OUT/results.tar.gz. With 2+ GPUs, run scripts/multi_gpu_check.sh for the multi-GPU check.
#   scripts/gpu_h200_all.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
LOG=${OUT:-/tmp}/logs
mkdir -p "$LOG"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$LOG/gpus.txt"

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "$limit" "$@" > "$LOG/$name.log" 2>&1
    echo "$name rc=$?" | tee -a "$LOG/rc.txt"
}
# the CUDA tests of the ops first: the defaults' accuracy (bf16, the 64k long-range rows) and the
# long-phase fix (test_alpha_at_its_bound) on the GPU, before any timing is trusted
PYTEST_ARGS=(-p no:cacheprovider -rfE --tb=short)  # pyproject adds -q; -qq would drop the count
python -c "import xdist" 2>/dev/null && PYTEST_ARGS+=(-n 8)
step tests 150 python -m pytest tests/ops "${PYTEST_ARGS[@]}"
step attention 180 python -m tapa.bench.attention --head-dims 128 --causal causal --out results/kernel-h200
step model 110 python -m tapa.cli bench model --out results/model-throughput-h200
step decode 130 python -m tapa.cli bench decode --graphs --out results/decode-h200
tar czf "${OUT:-/tmp}/results.tar.gz" results/kernel-h200 results/model-throughput-h200 \
    results/decode-h200 "$LOG" 2>/dev/null
grep -E "^(FAILED|ERROR)|passed|failed" "$LOG"/tests.log | tail -n 12
tail -n 30 "$LOG"/attention.log "$LOG"/model.log "$LOG"/decode.log
