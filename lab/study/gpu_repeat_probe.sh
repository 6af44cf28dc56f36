#!/usr/bin/env bash
# Does one card repeat a training run? (issue 11, results/toy-study/repeats.md: two study jobs run
# twice agreed within 1.5% in length and differed up to 1.86x past it; issue 37: a NoPE-hybrid job
# re-run on another card type parted from its first run at the first logged step, while a TAPA
# hybrid's rerun agreed to the fourth digit.) On one GPU, each arm in ARMS (study arms, with the
# study's pretraining flags: lab/study/arms.py) trains twice with the same command and seed, in each
# of MODES: `default`, `deterministic` (`--deterministic`: torch's strict deterministic algorithms,
# TAPA's dQ by its ordered kernel, not float atomics, SDPA by its deterministic backends) and
# `warn-only` (torch's warn-only mode set before the run, which `--deterministic` keeps: what
# `--deterministic` was until 2026-12-07). For each pair: the first logged step at which
# the two losses differ, the largest difference, and the steady tokens/s. The NoPE hybrid's global
# layers and RoPE attend through PyTorch's SDPA, the TAPA hybrid's through the fused kernel, the
# hybrids' local layers through FlexAttention.
#   device tool: run(command="bash lab/study/gpu_repeat_probe.sh", timeout_s=600)
#   short (270 s on one H100 on 2026-12-07, corpus included; the summary's last line gives the card,
#   date and seconds; it fits what is left after a study job):
#     STEPS=150 DATA="--max-train-bytes 20000000 --tokenizer-train-bytes 5000000" bash lab/study/gpu_repeat_probe.sh
#   --deterministic against the default on one card (does every arm train in it; at what speed):
#     STEPS=100 DATA="..." MODES="default deterministic" bash lab/study/gpu_repeat_probe.sh
# PROTOCOL (default toy-gpu) gives the recipe, the corpus and the model; RECIPE and DATA replace the
# first two. A CPU dry run on the tiny study protocol:
#   PROTOCOL=tiny-cpu STEPS=20 bash lab/study/gpu_repeat_probe.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg TAPA_CACHE=/tmp/study/cache
OUT=${OUT:-/tmp/repeat_probe_out}
RUNS=/tmp/repeat_probe
LOGS=$RUNS/logs  # tarred into $OUT at the end (the device tool brings back 8 files)
protocol=${PROTOCOL:-toy-gpu} steps=${STEPS:-300} modes=${MODES:-default}
for mode in $modes; do
    case $mode in default|deterministic|warn-only) ;; *) echo "gpu_repeat_probe.sh: unknown mode '$mode' in MODES (default, deterministic, warn-only)" >&2; exit 2 ;; esac
done
rm -rf "$RUNS" && mkdir -p "$OUT" "$LOGS"
data=${DATA:-$(python3 -m lab.study.repeat_probe protocol "$protocol" data)}
recipe=${RECIPE:-$(python3 -m lab.study.repeat_probe protocol "$protocol" recipe)}
arms=${ARMS:-hybrid-nope hybrid-tapa rope} lr=${LR:-1e-3}
echo "| arm | mode | logged steps | first differing step | max abs loss difference | steady tokens/s |" > "$OUT/summary.md"
echo "|---|---|---|---|---|---|" >> "$OUT/summary.md"
for name in $arms; do
    flags=$(python3 -m lab.study.repeat_probe flags "$name" "$lr" --protocol "$protocol") || exit 2
    for mode in $modes; do
        extra=$([ "$mode" != default ] && echo --deterministic)
        # warn-only: torch's warn-only deterministic mode, set before tapa train (which keeps it): an
        # op with no deterministic version warns and runs, SDPA's backward keeps its default
        cli=(-m tapa.cli)
        [ "$mode" = warn-only ] && cli=(-c "import sys, torch; torch.use_deterministic_algorithms(True, warn_only=True); from tapa.cli import main; sys.exit(main())")
        for copy in 1 2; do
            run="$RUNS/$name-$mode-$copy"
            # shellcheck disable=SC2086
            python3 "${cli[@]}" train --recipe "$recipe" $data --cache-dir /tmp/study/cache/data $flags $extra \
                --seed 4 --steps "$steps" --warmup-steps 20 --eval-every 0 --save-every 0 --log-every 10 \
                --no-progress --no-plot --run-dir "$run" > "$LOGS/$name-$mode-$copy.log" 2>&1
            echo "$name $mode copy $copy: rc $? ($(tail -n 1 "$LOGS/$name-$mode-$copy.log"))"
        done
        python3 -m lab.study.repeat_probe compare "$name" "$mode" "$RUNS/$name-$mode-1" "$RUNS/$name-$mode-2" \
            | tee -a "$OUT/summary.md"
    done
done
tar -czf "$OUT/logs.tar.gz" -C "$RUNS" logs
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
printf '\n%s, %s UTC: %s steps a run, %s s for the corpus and the runs.\n' "${card:-no GPU}" \
    "$(date -u '+%Y-%m-%d %H:%M')" "$steps" "$SECONDS" | tee -a "$OUT/summary.md"
