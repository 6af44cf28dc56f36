#!/usr/bin/env bash
# The toy study (issue 11; lab/study, results/toy-study) in one device call: the runner
# `python3 -m lab.study.run` trains, evaluates and packs the given jobs inside a time budget, and
# leaves ONE archive (study-PROTOCOL-CALL.tar.gz: a JSON per job, the logs) and batch.json in $OUT.
#   usage:  bash scripts/gpu_study.sh batch RUNNER_ARGS...                    one GPU
#           bash scripts/gpu_study.sh xN JOBS_GPU0 ... JOBS_GPU(N-1) [RUNNER_ARGS...]
#                                                     N GPUs (x2, x4, x8, ...), a runner each
#   device: run(command="bash scripts/gpu_study.sh batch --jobs rope:0.001:0,tapa:0.002:0 --time-budget 540 --allow-partial",
#               kind="nvidia-h200")
#           run(command="bash scripts/gpu_study.sh x2 tapa:0.002:1,rope:0.001:2 nope:0.001:1 --allow-partial",
#               kind="nvidia-h200-x2")       (archives in $OUT/gpu0, $OUT/gpu1; logs $OUT/gpuN.log)
# JOBS: ARM:LR:SEED,... (the arms and protocols: lab/study/arms.py). The batches a plan needs, as
# commands of this script: `PYTHONPATH=src python3 -m lab.study.run --plan seeds --lr ... --dry-run
# --split-batches 540` (add `--gpus N` for xN calls). Keep --time-budget well under the call's
# 600 s (540 leaves a minute for the machine; xN gives each runner CALL_SECONDS, default 570, less
# the corpus build). Runs stay under /tmp/study, so a next call on the still-warm machine resumes
# them. Then, here:
#   python3 -m lab.study.aggregate aggregate --in ARCHIVES... --out results/toy-study
set -uo pipefail
cd "$(dirname "$0")/.."
USAGE="usage: gpu_study.sh batch RUNNER_ARGS... | gpu_study.sh xN JOBS_GPU0 ... JOBS_GPU(N-1) [RUNNER_ARGS...]"
MODE=${1:?$USAGE}
shift
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export TAPA_CACHE=/tmp/study/cache TRITON_CACHE_DIR=/tmp/study/cache/triton
OUT=${OUT:-/tmp/study/out}
mkdir -p "$OUT"
start=$(date +%s)
case $MODE in
    batch)
        nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
        python3 -m lab.study.run --root /tmp/study --out "$OUT" "$@"
        ;;
    x[1-9]*)
        gpus=${MODE#x}
        [[ $gpus =~ ^[0-9]+$ && $# -ge $gpus ]] || { echo "$USAGE" >&2; exit 2; }
        have=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
        nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
        (( have >= gpus )) || { echo "gpu_study.sh: $MODE needs $gpus GPUs, this machine has $have" >&2; exit 2; }
        lanes=("${@:1:gpus}")
        shift "$gpus"
        data=$(python3 -c 'from lab.study.arms import TOY_GPU; print(" ".join(TOY_GPU.data))')
        # the corpus once, before the runners (each would otherwise build it)
        # shellcheck disable=SC2086
        python3 -m tapa.cli train --recipe toy-gpu $data --cache-dir /tmp/study/cache/data --data-only --no-progress
        python3 -m lab.study.domain /tmp/study/domain/package-docs  # the screen's second domain, once
        budget=$(( ${CALL_SECONDS:-570} - ($(date +%s) - start) ))
        echo "corpus ready after $(( $(date +%s) - start )) s; $gpus runners get $budget s"
        # each runner's workers share the CPU cores evenly (run.py reads STUDY_CPUS)
        export STUDY_CPUS=$(( $(nproc) / gpus > 0 ? $(nproc) / gpus : 1 ))
        for (( gpu = 0; gpu < gpus; gpu++ )); do
            CUDA_VISIBLE_DEVICES=$gpu python3 -m lab.study.run --root /tmp/study --out "$OUT/gpu$gpu" \
                --jobs "${lanes[gpu]}" "$@" --time-budget "$budget" > "$OUT/gpu$gpu.log" 2>&1 &
        done
        wait
        for (( gpu = 0; gpu < gpus; gpu++ )); do tail -n 15 "$OUT/gpu$gpu.log"; done
        ;;
    *)
        echo "$USAGE" >&2
        exit 2
        ;;
esac
