#!/usr/bin/env bash
# Issue 37's "globals" levers at `tapa demo`'s CPU scale (1.1M-parameter models, 128-token
# pretraining): a PILOT for the GPU screen of results/toy-study/globals (lab/study/arms.py's
# hybrid-*-w64/-w128/-temp/-llg/-l5g/-theta*/-alpha* and the protocol toy-gpu-c4096), not that screen.
# Its job is to order the screen's arms; 1.1M-parameter models do not learn retrieval, so the
# passkey-share lever and the retrieval suite are left out.
#
#   every arm, for TAPA globals (phase rows at 0.1, their lr at 0.1x) and for NoPE globals:
#     pretraining as the demo's cpu profile (700 steps x 16 x 128 = 1.43M tokens, lr 4e-3; dim 128,
#       4 layers, 4 heads, BPE-2048), then the retrofit pilot's continual stage (18 steps x 8 x 512
#       = 73.7k tokens, 4x the length, lr 4e-4), then sliding-window perplexity on the test split at
#       128-4096 (1x-32x the pretraining length)
#   base: LLLG, local window 64 (half the training length, as the screen's 256 of 512)
#   levers: window 16 and 32 (the screen's 64 and 128 against 256); the log-length query
#     temperature with base 128 (the training length); the layer ratio LLG and LLLLLG, both on
#     6 layers (LLGLLG: 2 globals, LLLLLG: 1; LLG over 4 layers would be LLGL and LLLLLG never
#     reaches its G), so 1.5M parameters, and against the 4-layer base they also differ in depth;
#     the continual stage at 1024 (8x, the screen's 4096 against 2048: the same 73.7k tokens,
#     batch 4) on the base arms; TAPA only: theta 0.25 / 0.75 and alpha 0.05 / 0.2 in the globals
#   anchor: RoPE pretrained alike, continued with YaRN (s = 4), as the retrofit pilot's rope-yarn
#
# Each arm runs pretraining, continual stage and evaluation before the next (the base arms first),
# so a partial run already gives whole rows. Rerun on the same OUT to resume: finished stages are
# skipped.
#
# Usage: bash lab/study/globals_cpu_pilot.sh OUT [SEED]    (~110 min on one core, 2026-12-05)
# Then:  tapa report OUT/eval-*/ --out results/toy-study/globals/cpu-pilot/seedSEED
# Options (environment):
#   REUSE=DIR  copy the runs this script shares with lab/study/retrofit_cpu_pilot.sh (the same
#     commands: rope, rope-yarn, hybrid-tapa, hybrid-nope, hybrid-tapa-c, hybrid-nope-c and their
#     evaluations) from that pilot's OUT of the same seed instead of training them again (seed 0
#     trained rope, rope-yarn, hybrid-tapa and hybrid-tapa-c again and matched it to the last digit)
#   LEVERS="c1024 w32 ..."  the levers to run, in that order (default: all, as below)
set -euo pipefail
OUT=$(realpath -m "${1:?usage: globals_cpu_pilot.sh OUT [SEED]}"); SEED=${2:-0}
mkdir -p "$OUT"
export TAPA_CACHE=$OUT/cache
start=$(date +%s)
stamp() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - start )) s] $*"; }

if [[ -n ${REUSE:-} ]]; then
    for name in rope rope-yarn hybrid-tapa hybrid-nope hybrid-tapa-c hybrid-nope-c \
            eval-rope-yarn eval-hybrid-tapa-c eval-hybrid-nope-c; do
        if [[ -e $REUSE/$name && ! -e $OUT/$name ]]; then
            cp -a "$REUSE/$name" "$REUSE/$name.log" "$OUT/"
            stamp "copied $name from $REUSE"
        fi
    done
fi

DATA=(--data builtin --vocab-size 2048 --max-train-bytes 5000000 --seed "$SEED")
COMMON=(--eval-every 0 --save-every 0 --no-progress --no-plot --device cpu)
MODEL=(--dim 128 --n-heads 4)
PRE=(--seq-len 128 --batch-size 16 --steps 700 --warmup-steps 50 --lr 4e-3)
CONT=(--batch-size 8 --steps 18 --warmup-steps 2 --lr 4e-4)
TAPA=(--pe tapa --phase-init-scale 0.1 --phase-lr-scale 0.1)
NOPE=(--pe nope)

pretrain() { local name=$1; shift
    [[ -e $OUT/$name/checkpoints/latest ]] || tapa train "${DATA[@]}" "${MODEL[@]}" "${PRE[@]}" \
        "${COMMON[@]}" --run-dir "$OUT/$name" "$@" > "$OUT/$name.log"
    stamp "pretrained $name: $(grep -o 'val_loss[^,]*' "$OUT/$name.log" | tail -1)"
}
continual() { local name=$1 source=$2; shift 2
    [[ -e $OUT/$name/checkpoints/latest ]] || tapa train --init-from "$OUT/$source" "${DATA[@]}" \
        "${CONT[@]}" "${COMMON[@]}" --run-dir "$OUT/$name" "$@" > "$OUT/$name.log"
    stamp "continued $name"
}
evaluate() { local name=$1; shift
    [[ -e $OUT/eval-$name/results.json ]] || tapa eval "$OUT/$name" --data builtin \
        --lengths 128,256,512,1024,2048,4096 --stride 128 --max-tokens 16384 --split test \
        --device cpu --no-progress --out "$OUT/eval-$name" "$@" > "$OUT/eval-$name.log"
    stamp "evaluated $name"
}
# one arm: pretraining, the continual stage at 512 (NAME-c), its evaluation
arm() { local name=$1; shift
    pretrain "$name" "$@"
    continual "$name-c" "$name" --seq-len 512
    evaluate "$name-c"
}

# the anchor and the base arms
pretrain rope --n-layers 4 --pe rope
continual rope-yarn rope --seq-len 512 --pe rope-yarn --rope-scale 4 --original-seq-len 128
evaluate rope-yarn
for kind in tapa nope; do
    [[ $kind == tapa ]] && PE=("${TAPA[@]}") || PE=("${NOPE[@]}")
    arm hybrid-$kind --n-layers 4 "${PE[@]}" --layer-pattern LLLG --local-window 64
done
# the levers, each on both global kinds where it applies
BASE=(--n-layers 4 --layer-pattern LLLG --local-window 64)
for lever in ${LEVERS:-c1024 w32 w16 temp llg l5g theta25 theta75 alpha05 alpha2}; do
    kinds="tapa nope"
    case $lever in
        c1024)  # the base arms' continual stage at 1024: the same 73.7k tokens, batch 4
            for kind in tapa nope; do
                continual hybrid-$kind-c1024 hybrid-$kind --seq-len 1024 --batch-size 4
                evaluate hybrid-$kind-c1024
            done
            continue ;;
        w32) flags=(--n-layers 4 --layer-pattern LLLG --local-window 32) ;;
        w16) flags=(--n-layers 4 --layer-pattern LLLG --local-window 16) ;;
        temp) flags=("${BASE[@]}" --query-temperature-base 128) ;;
        llg) flags=(--n-layers 6 --layer-pattern LLG --local-window 64) ;;
        l5g) flags=(--n-layers 6 --layer-pattern LLLLLG --local-window 64) ;;
        # TAPA only: the amplitude fraction theta and the distance exponent alpha of its globals
        # (thetaNN: theta 0.NN, e.g. theta25, theta375; alphaNN: alpha 0.NN, e.g. alpha05, alpha2)
        theta[0-9]*) flags=("${BASE[@]}" --theta "0.${lever#theta}"); kinds=tapa ;;
        alpha[0-9]*) flags=("${BASE[@]}" --alpha "0.${lever#alpha}"); kinds=tapa ;;
        *) echo "unknown lever $lever" >&2; exit 2 ;;
    esac
    for kind in $kinds; do
        [[ $kind == tapa ]] && PE=("${TAPA[@]}") || PE=("${NOPE[@]}")
        arm hybrid-$kind-$lever "${PE[@]}" "${flags[@]}"
    done
done
stamp "done"
