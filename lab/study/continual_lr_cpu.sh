#!/usr/bin/env bash
# CPU check (2 cores, ~4 min) of the continual-stage learning rate: pretrain a 0.9M-parameter RoPE
# model at 128 tokens, continue it at 512 for 40 steps from its weights (fresh AdamW) at x1 and x0.1
# the pretraining peak lr, and evaluate all three at 128 and 512. Usage: lab/study/continual_lr_cpu.sh [OUT]
set -euxo pipefail
OUT=$(realpath -m "${1:-/tmp/continual_lr_cpu}"); mkdir -p "$OUT" && cd "$OUT"
export TAPA_CACHE=$OUT/cache
start=$(date +%s)
tapa train --recipe tiny --pe rope --seq-len 128 --batch-size 16 --steps 600 --lr 2e-3 --warmup-steps 30 --save-every 0 --eval-every 0 --run-dir $OUT/pre --no-progress --no-plot
for s in 1 0.1; do
  lr=$(python3 -c "print(2e-3*$s)")
  tapa train --recipe tiny --pe rope --init-from $OUT/pre --seq-len 512 --batch-size 4 --steps 40 --lr $lr --warmup-steps 4 --save-every 0 --eval-every 0 --run-dir $OUT/c$s --no-progress --no-plot
done
for d in pre c1 c0.1; do
  tapa eval $OUT/$d --lengths 128,512 --stride 64 --max-tokens 16384 --split test --device cpu --no-progress --out $OUT/eval-$d
done
echo "total $(( $(date +%s) - start )) s"
