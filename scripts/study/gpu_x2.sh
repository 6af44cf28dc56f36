#!/usr/bin/env bash
# One device call of the toy study (issue 11) on nvidia-h200-x2: builds the corpus once, then runs
# one scripts/study/run.py per GPU (CUDA_VISIBLE_DEVICES), each with its own jobs, inside the
# call's 10 minutes. Archives come back in $OUT/gpu0 and $OUT/gpu1, logs in $OUT/gpuN.log.
#   scripts/study/gpu_x2.sh tapa:0.002:1,rope:0.001:2 hybrid-tapa:0.001:2,nope:0.001:1 --allow-partial
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=src PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export TAPA_CACHE=/tmp/study/cache TRITON_CACHE_DIR=/tmp/study/cache/triton
OUT=${OUT:-/tmp/study/out}
start=$(date +%s)
jobs_gpu0=$1 jobs_gpu1=$2
shift 2
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
data=$(python3 -c 'import sys; sys.path.insert(0, "scripts/study"); from arms import TOY_GPU; print(" ".join(TOY_GPU.data))')
python3 -m tapa.cli train --recipe toy-gpu $data --cache-dir /tmp/study/cache/data --data-only --no-progress
budget=$(( ${CALL_SECONDS:-570} - ($(date +%s) - start) ))
echo "corpus ready after $(( $(date +%s) - start )) s; runners get $budget s"
for gpu in 0 1; do
    jobs=$([ "$gpu" = 0 ] && echo "$jobs_gpu0" || echo "$jobs_gpu1")
    CUDA_VISIBLE_DEVICES=$gpu python3 scripts/study/run.py --root /tmp/study --out "$OUT/gpu$gpu" \
        --jobs "$jobs" --time-budget "$budget" "$@" > "$OUT/gpu$gpu.log" 2>&1 &
done
wait
tail -n 15 "$OUT"/gpu0.log "$OUT"/gpu1.log
