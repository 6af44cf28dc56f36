#!/usr/bin/env bash
# One device call of the toy study (issue 11) on an H200: runs scripts/study/run.py with the
# arguments given (jobs, --concurrent, --time-budget ...) and leaves ONE archive + batch.json in
# $OUT. Keep --time-budget well under the call's 600 s (540 leaves a minute for the machine).
#   scripts/study/gpu_batch.sh --jobs rope:0.001:0,tapa:0.001:0 --time-budget 540 --allow-partial
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=src PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export TAPA_CACHE=/tmp/study/cache TRITON_CACHE_DIR=/tmp/study/cache/triton
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 scripts/study/run.py --root /tmp/study --out "${OUT:-/tmp/study/out}" "$@"
