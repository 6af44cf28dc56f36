#!/usr/bin/env bash
# The GPU measurements of the project in one call on an H200 (device tool), one after another:
# the attention-kernel benchmark, the model-throughput benchmark and the decode benchmark.
# Results land in results/{kernel,model-throughput,decode}-h200/ and are packed into
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
step attention 260 python -m tapa.bench.attention --head-dims 128 --causal causal --out results/kernel-h200
step model 150 python -m tapa.cli bench model --out results/model-throughput-h200
step decode 150 python -m tapa.cli bench decode --out results/decode-h200
tar czf "${OUT:-/tmp}/results.tar.gz" results/kernel-h200 results/model-throughput-h200 \
    results/decode-h200 "$LOG" 2>/dev/null
tail -n 30 "$LOG"/attention.log "$LOG"/model.log "$LOG"/decode.log
