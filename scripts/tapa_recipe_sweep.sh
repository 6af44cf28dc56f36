#!/usr/bin/env bash
# TAPA training-recipe ablation at the `tapa demo` cpu profile (1M-parameter models, 128-token
# training, 1000 steps x 16 x 128 tokens, BPE-2048 on 2 MB of the built-in corpus), each variant
# evaluated by sliding-window perplexity at 1x-8x. One variant per argument, run one after another:
#   scripts/tapa_recipe_sweep.sh base theta75 paper-init diag-phase alpha05 nope
#   SEED=1 ROOT=runs/recipe-sweep-seed1 scripts/tapa_recipe_sweep.sh base theta75 nope
# then merge: tapa report runs/recipe-sweep/* --out results/recipe-cpu
set -euo pipefail
ROOT=${ROOT:-runs/recipe-sweep}
SEED=${SEED:-0}
COMMON=(--vocab-size 2048 --max-train-bytes 2000000 --dim 128 --n-layers 3 --n-heads 4
        --seq-len 128 --batch-size 16 --steps 1000 --warmup-steps 50 --lr 1e-3 --seed "$SEED"
        --eval-every 0 --save-every 0 --log-every 50 --original-seq-len 128 --no-progress)
for variant in "$@"; do
    case "$variant" in
        base)       flags=(--pe tapa --phase-init-scale 0.1) ;;            # the demo's TAPA
        theta75)    flags=(--pe tapa --phase-init-scale 0.1 --theta 0.75) ;;
        paper-init) flags=(--pe tapa --phase-init-scale 1.0) ;;            # no phase down-scaling
        diag-phase) flags=(--pe tapa --phase-init-scale 0.1 --phase-matrix diagonal) ;;
        alpha05)    flags=(--pe tapa --phase-init-scale 0.1 --alpha 0.5) ;;
        nope)       flags=(--pe nope) ;;                                   # no positional encoding
        *) echo "unknown variant $variant" >&2; exit 2 ;;
    esac
    run="$ROOT/$variant"
    rm -rf "$run"
    echo "== $variant: ${flags[*]}"
    tapa train "${COMMON[@]}" "${flags[@]}" --name "$variant" --run-dir "$run"
    tapa eval "$run" --multiples 1,2,4,8 --max-tokens 8192 --no-progress > /dev/null
done
