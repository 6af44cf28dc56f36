#!/usr/bin/env bash
# Does `tapa train --compile` speed up the study's pretraining on an H200? (issue 11: the seed stage
# needs ~24 jobs of ~250 s; a faster step shortens it). For RoPE, TAPA and the TAPA hybrid at the
# study's shape (toy-gpu, L=512, batch 64), 400 steps with and without --compile, then the steady
# tokens/s (the mean of the last 5 logged intervals) side by side; and TAPA at the scale step's
# size (dim 768, 12 layers), eager, for its rate. About 5 minutes in one call:
#   device tool: run(command="bash lab/study/gpu_compile_probe.sh", kind="nvidia-h200", timeout_s=600)
# A CPU dry run of the script: RECIPE=tiny STEPS=30 DATA="--max-train-bytes 2000000" bash lab/study/gpu_compile_probe.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 MPLBACKEND=Agg TAPA_CACHE=/tmp/study/cache
OUT=${OUT:-/tmp/compile_probe}
mkdir -p "$OUT"
data=${DATA:-$(python3 -c 'from lab.study.arms import TOY_GPU; print(" ".join(TOY_GPU.data))')}
recipe=${RECIPE:-toy-gpu} steps=${STEPS:-400}
for arm in "rope:--pe rope --lr 1e-3" "tapa:--pe tapa --phase-lr-scale 0.1 --lr 2e-3" \
           "hybrid-tapa:--pe tapa --layer-pattern LLLG --local-window 256 --phase-lr-scale 0.1 --lr 1e-3" \
           "tapa-768:--pe tapa --phase-lr-scale 0.1 --lr 1e-3 --dim 768 --n-layers 12 --n-heads 6"; do
    name=${arm%%:*} flags=${arm#*:}
    modes="eager compile"
    [ "$name" = tapa-768 ] && modes=eager  # the scale step's rate (arms.SCALE_768.rate_scale)
    for mode in $modes; do
        extra=$([ "$mode" = compile ] && echo --compile)
        start=$(date +%s)
        # shellcheck disable=SC2086
        python3 -m tapa.cli train --recipe "$recipe" $data --cache-dir /tmp/study/cache/data $flags $extra \
            --steps "$steps" --warmup-steps 20 --eval-every 0 --save-every 0 --log-every 25 --no-progress \
            --no-plot --run-dir "/tmp/compile_probe/$name-$mode" > "$OUT/$name-$mode.log" 2>&1
        rc=$?
        tail -n 3 "$OUT/$name-$mode.log"
        python3 - "$name" "$mode" "$rc" "$(( $(date +%s) - start ))" "/tmp/compile_probe/$name-$mode" <<'PY' | tee -a "$OUT/summary.md"
import sys
from pathlib import Path
from tapa.train.rundir import read_metrics
name, mode, rc, wall, run = sys.argv[1:]
metrics = Path(run) / "metrics.jsonl"
rates = [r["tokens_per_s"] for r in (read_metrics(metrics) if metrics.is_file() else [])][-5:]
steady = sum(rates) / len(rates) if rates else float("nan")
print(f"| {name} | {mode} | rc {rc} | {wall} s wall | {steady / 1e3:.0f}k tokens/s steady |")
PY
    done
done
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU"
