#!/usr/bin/env bash
# The multi-GPU check (issue 7) on a machine with 2 GPUs: for each recipe, DDP and FSDP2 on 1 and
# on 2 GPUs with the same global batch; then an FSDP2 checkpoint saved on 2 GPUs at half time,
# resumed on 1 and on 2 GPUs. Writes results/multi-gpu-h200/ (table, loss curves, command).
#
#   scripts/multi_gpu_check.sh                      # toy-gpu and gpu-350m, 50 steps each
#   STEPS=20 scripts/multi_gpu_check.sh toy-gpu
#   STEPS=4 EXTRA="--seq-len 64 --batch-size 4" OUT=/tmp/check scripts/multi_gpu_check.sh tiny
#       (the same on CPU processes, to check the script itself)
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast off on the lent machines
STEPS=${STEPS:-50}
ROOT=${ROOT:-/tmp/multigpu}
OUT=${OUT:-results/multi-gpu-h200}
RECIPES=("$@")
[[ ${#RECIPES[@]} -eq 0 ]] && RECIPES=(toy-gpu gpu-350m)
HALF=$((STEPS / 2))
mkdir -p "$ROOT"

train() {  # train RECIPE MODE GPUS RUN_NAME [more tapa train flags]
    local recipe=$1 mode=$2 gpus=$3 name=$4
    shift 4
    echo "== $name: $recipe, $mode, $gpus GPU(s)"
    torchrun --standalone --nproc_per_node "$gpus" -m tapa.cli train --recipe "$recipe" \
        --parallel "$mode" --steps "$STEPS" --warmup-steps 10 --log-every 1 --eval-every 0 \
        --no-progress --run-dir "$ROOT/$name" ${EXTRA:-} "$@"
}

for recipe in "${RECIPES[@]}"; do
    python -m tapa.cli train --recipe "$recipe" ${EXTRA:-} --data-only  # tokenize once, up front
    for mode in ddp fsdp; do
        for gpus in 1 2; do
            rm -rf "$ROOT/$recipe-$mode-$gpus"
            train "$recipe" "$mode" "$gpus" "$recipe-$mode-$gpus" --save-every 0 --keep-checkpoints 1
            rm -rf "$ROOT/$recipe-$mode-$gpus/checkpoints"  # the weights are not needed; disk is
        done
    done
    saved="_saved-$recipe-fsdp-2"
    rm -rf "$ROOT/$saved"
    train "$recipe" fsdp 2 "$saved" --stop-after "$HALF" --save-every "$HALF"
    for gpus in 1 2; do
        resumed="$recipe-fsdp-2-resume$gpus"
        rm -rf "$ROOT/$resumed"
        cp -r "$ROOT/$saved" "$ROOT/$resumed"
        echo "== $resumed: resume on $gpus GPU(s)"
        torchrun --standalone --nproc_per_node "$gpus" -m tapa.cli train --run-dir "$ROOT/$resumed" \
            --resume --parallel fsdp --no-progress
        rm -rf "$ROOT/$resumed/checkpoints"
    done
    rm -rf "$ROOT/$saved/checkpoints"
done
python -m lab.study.scaling_report "$ROOT" --out "$OUT" \
    --command "STEPS=$STEPS scripts/multi_gpu_check.sh ${RECIPES[*]}"
