#!/usr/bin/env bash
# Where does the run-to-run spread at a fixed seed come from? (issue 11, results/toy-study/repeats.md:
# two study jobs run twice agreed within 1.5% in length and differed up to 1.86x past it.) On one
# H200, each arm below trains twice with the same command and seed, by default and with
# `--deterministic` (torch's deterministic algorithms; TAPA's dQ by its ordered kernel, not float
# atomics). For each pair: the first logged step at which the two losses differ, the largest
# difference, and the steady tokens/s. RoPE runs no TAPA kernel, so its pair shows whether the rest
# of the model (cuBLAS, SDPA, embedding backward) repeats. About 5 minutes in one call:
#   device tool: run(command="bash lab/study/gpu_repeat_probe.sh", kind="nvidia-h200", timeout_s=600)
# A CPU dry run of the script: RECIPE=tiny STEPS=20 DATA="--max-train-bytes 2000000" bash lab/study/gpu_repeat_probe.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 MPLBACKEND=Agg TAPA_CACHE=/tmp/study/cache
OUT=${OUT:-/tmp/repeat_probe_out}
RUNS=/tmp/repeat_probe
rm -rf "$RUNS" && mkdir -p "$OUT" "$RUNS"
data=${DATA:-$(python3 -c 'from lab.study.arms import TOY_GPU; print(" ".join(TOY_GPU.data))')}
recipe=${RECIPE:-toy-gpu} steps=${STEPS:-300}
for arm in "tapa:--pe tapa --phase-lr-scale 0.1 --lr 2e-3" "rope:--pe rope --lr 1e-3"; do
    name=${arm%%:*} flags=${arm#*:}
    modes="default deterministic"
    [ "$name" = rope ] && modes=default
    for mode in $modes; do
        extra=$([ "$mode" = deterministic ] && echo --deterministic)
        for copy in 1 2; do
            run="$RUNS/$name-$mode-$copy"
            # shellcheck disable=SC2086
            python3 -m tapa.cli train --recipe "$recipe" $data --cache-dir /tmp/study/cache/data $flags $extra \
                --seed 4 --steps "$steps" --warmup-steps 20 --eval-every 0 --save-every 0 --log-every 10 \
                --no-progress --no-plot --run-dir "$run" > "$OUT/$name-$mode-$copy.log" 2>&1
            echo "$name $mode copy $copy: rc $? ($(tail -n 1 "$OUT/$name-$mode-$copy.log"))"
        done
        python3 - "$name" "$mode" "$RUNS/$name-$mode-1" "$RUNS/$name-$mode-2" <<'PY' | tee -a "$OUT/summary.md"
import sys
from pathlib import Path
from tapa.train.rundir import read_metrics
name, mode, *runs = sys.argv[1:]
curves = [read_metrics(Path(r) / "metrics.jsonl") if (Path(r) / "metrics.jsonl").is_file() else [] for r in runs]
pairs = [(a["step"], a["loss"], b["loss"]) for a, b in zip(*curves) if "loss" in a and "loss" in b]
differ = next((step for step, x, y in pairs if x != y), None)
worst = max((abs(x - y) for _, x, y in pairs), default=float("nan"))
rates = [sum(r["tokens_per_s"] for r in c[-5:]) / max(len(c[-5:]), 1) / 1e3 for c in curves]
print(f"| {name} | {mode} | {len(pairs)} logged steps | first differing step: "
      f"{differ if differ is not None else 'none (bitwise equal)'} | max abs loss difference {worst:.3g} | "
      + " / ".join(f"{r:.0f}k" for r in rates) + " tokens/s steady |")
PY
    done
done
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU"
