#!/usr/bin/env bash
# Issue 38's retrofit question at `tapa demo`'s CPU scale (1.1M-parameter models, 128-token
# pretraining): a pilot for the toy-gpu experiment of results/retrofit, not that experiment.
#
#   pretraining (each 700 steps x 16 x 128 = 1.43M tokens, lr 4e-3, as the demo's cpu profile):
#     rope, and the LLLG hybrids from scratch with TAPA and NoPE globals (window 64, half the
#     training length, as the demo)
#   tapa convert: rope -> the LLLG hybrid with TAPA globals (phase rows at 0.1) and with NoPE globals
#   continual stage, 5% of pretraining (18 steps x 8 x 512 = 73.7k tokens, 4x the length, lr 4e-4
#     = 0.1x the peak, as the study), for: rope with YaRN (s = 4, as the study's rope-yarn), the
#     two conversions, and the two hybrids from scratch
#   evaluation: sliding-window perplexity on the test split at 128-4096 (1x-32x the pretraining
#     length; every model, converted folders too, on `--data builtin`'s test split through its own
#     tokenizer), rope also zero-shot with eval-time YaRN
#
# Usage: bash lab/study/retrofit_cpu_pilot.sh OUT [SEED]    (~15 min on 2 idle cores)
# Then:  tapa report OUT/eval-*/ --out results/retrofit/cpu-pilot
set -euo pipefail
OUT=$(realpath -m "${1:?usage: retrofit_cpu_pilot.sh OUT [SEED]}"); SEED=${2:-0}
mkdir -p "$OUT"
export TAPA_CACHE=$OUT/cache
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }

DATA=(--data builtin --vocab-size 2048 --max-train-bytes 5000000 --seed "$SEED")
COMMON=(--eval-every 0 --save-every 0 --no-progress --no-plot --device cpu)
MODEL=(--dim 128 --n-layers 4 --n-heads 4)
PRE=(--seq-len 128 --batch-size 16 --steps 700 --warmup-steps 50 --lr 4e-3)
HYBRID=(--layer-pattern LLLG --local-window 64)
CONT=(--seq-len 512 --batch-size 8 --steps 18 --warmup-steps 2 --lr 4e-4)

pretrain() { local name=$1; shift
    [[ -e $OUT/$name/checkpoints/latest ]] || tapa train "${DATA[@]}" "${MODEL[@]}" "${PRE[@]}" \
        "${COMMON[@]}" --run-dir "$OUT/$name" "$@" > "$OUT/$name.log"
    stamp "pretrained $name: $(grep -o 'val_loss[^,]*' "$OUT/$name.log" | tail -1)"
}
pretrain rope --pe rope
pretrain hybrid-tapa --pe tapa "${HYBRID[@]}" --phase-init-scale 0.1 --phase-lr-scale 0.1
pretrain hybrid-nope --pe nope "${HYBRID[@]}"

for pe in tapa nope; do
    [[ -e $OUT/convert-$pe ]] || tapa convert "$OUT/rope" "$OUT/convert-$pe" "${HYBRID[@]}" --pe $pe \
        --phase-init-scale 0.1 > "$OUT/convert-$pe.log"
done
stamp "converted"

continual() { local name=$1 source=$2; shift 2
    [[ -e $OUT/$name/checkpoints/latest ]] || tapa train --init-from "$source" "${DATA[@]}" "${CONT[@]}" \
        "${COMMON[@]}" --run-dir "$OUT/$name" "$@" > "$OUT/$name.log"
    stamp "continued $name"
}
continual rope-yarn "$OUT/rope" --pe rope-yarn --rope-scale 4 --original-seq-len 128
continual retrofit-tapa "$OUT/convert-tapa" --phase-lr-scale 0.1
continual retrofit-nope "$OUT/convert-nope"
continual hybrid-tapa-c "$OUT/hybrid-tapa"
continual hybrid-nope-c "$OUT/hybrid-nope"
# the continual lr lever (added 2026-12-05, after the GPU run's retrofits stayed flat without reading
# past the window at 0.1x): the same stage at 0.3x and 1x the pretraining peak, RoPE + YaRN too
for scale in 0.3 1; do
    lr=$(python3 -c "print(4e-3 * $scale)")
    continual rope-yarn-lr$scale "$OUT/rope" --pe rope-yarn --rope-scale 4 --original-seq-len 128 --lr "$lr"
    continual retrofit-tapa-lr$scale "$OUT/convert-tapa" --phase-lr-scale 0.1 --lr "$lr"
    continual retrofit-nope-lr$scale "$OUT/convert-nope" --lr "$lr"
done

# the stage-length lever (added 2026-12-05, beside the GPU's toy-gpu-cl20): the same stage 4x as
# long, 72 steps = 295k tokens, 20% of pretraining, at the 0.1x lr
for pair in "rope-yarn --pe rope-yarn --rope-scale 4 --original-seq-len 128" \
            "retrofit-tapa --phase-lr-scale 0.1" "retrofit-nope"; do
    set -- $pair; name=$1; shift
    source_dir=$OUT/rope; [[ $name == retrofit-* ]] && source_dir=$OUT/convert-${name#retrofit-}
    continual "$name-cl20" "$source_dir" "$@" --steps 72
done

evaluate() { local name=$1; shift
    [[ -e $OUT/eval-$name/results.json ]] || tapa eval "$OUT/$name" --data builtin \
        --lengths 128,256,512,1024,2048,4096 --stride 128 --max-tokens 16384 --split test \
        --device cpu --no-progress --out "$OUT/eval-$name" "$@" > "$OUT/eval-$name.log"
    stamp "evaluated $name"
}
evaluate rope --eval-pe rope-yarn
for name in convert-tapa convert-nope; do   # model directories: they name no training length
    evaluate $name --train-len 128
done
for name in rope-yarn retrofit-tapa retrofit-nope hybrid-tapa-c hybrid-nope-c \
        {rope-yarn,retrofit-tapa,retrofit-nope}-lr{0.3,1} {rope-yarn,retrofit-tapa,retrofit-nope}-cl20; do
    evaluate $name
done
stamp "done"
