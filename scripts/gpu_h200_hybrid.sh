#!/usr/bin/env bash
# Issue 10's GPU checks in one device call on an H200: FlexAttention correctness (the cuda-marked
# tests of the local op and the hybrid model), `tapa bench local` (one local layer vs full causal
# attention) and `tapa bench model` (TAPA, TAPA hybrid, RoPE tokens/s). Results land in
# results/{local-attention,model-throughput}-h200/ and come back packed in $OUT/results.tar.gz.
# It also starts the study corpus build in the background (pinned to other cores), so that a next
# call on the same warm machine finds it under /tmp/study/cache.
#   scripts/gpu_h200_hybrid.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
LOG=${OUT:-/tmp}/logs
mkdir -p "$LOG" /tmp/study/cache
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$LOG/gpus.txt"
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' | tee -a "$LOG/gpus.txt"
data=$(python3 -c 'import sys; sys.path.insert(0, "scripts/study"); from arms import TOY_GPU; print(" ".join(TOY_GPU.data))')
TAPA_CACHE=/tmp/study/cache setsid nohup taskset -c 6-15 python3 -m tapa.cli train --recipe toy-gpu \
    $data --cache-dir /tmp/study/cache/data --data-only --no-progress > /tmp/study-data.log 2>&1 < /dev/null &

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "$limit" taskset -c 0-5 "$@" > "$LOG/$name.log" 2>&1
    echo "$name rc=$?" | tee -a "$LOG/rc.txt"
}
step cuda_tests 200 python3 -m pytest -m cuda -q -p no:cacheprovider tests/positional tests/model
step bench_local 150 python3 -m tapa.cli bench local --out results/local-attention-h200
step bench_model 200 python3 -m tapa.cli bench model --out results/model-throughput-h200
cp /tmp/study-data.log "$LOG/" 2>/dev/null
tar czf "${OUT:-/tmp}/results.tar.gz" results/local-attention-h200 results/model-throughput-h200 "$LOG" 2>/dev/null
tail -n 25 "$LOG"/cuda_tests.log "$LOG"/bench_local.log "$LOG"/bench_model.log
