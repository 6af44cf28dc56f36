#!/usr/bin/env bash
# Did the code change what a study arm computes? The confirmation's RoPE + YaRN arm at tiny size on
# this CPU, at an older commit and at the working tree, compared to the last digit:
#   pretraining with RoPE (64 tokens, 40 steps), the continual stage with YaRN (s = 4, 256 tokens,
#   2% passkey sequences, the study's flags), sliding-window perplexity at 64 / 256 / 512.
# Same seed, corpus and thread count on both sides, so a CPU path that did not change gives the same
# numbers bit for bit; a GPU-only change (kernels, bf16 autocast) is outside what this can see.
#
# Usage: bash lab/study/code_drift_cpu.sh COMMIT OUT    (~1 min on 2 cores; COMMIT checked out
#        with `git worktree` under OUT, removed at the end)
set -euo pipefail
COMMIT=${1:?usage: code_drift_cpu.sh COMMIT OUT}
OUT=$(realpath -m "${2:?usage: code_drift_cpu.sh COMMIT OUT}")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
git -C "$ROOT" worktree add --detach -f "$OUT/old-tree" "$COMMIT" > /dev/null
trap 'git -C "$ROOT" worktree remove --force "$OUT/old-tree"' EXIT

arm() {  # arm SRC DIR: the three stages with SRC's code; prints each length's perplexity
    local src=$1 dir=$2
    local common=(--recipe tiny --cache-dir "$dir/cache" --vocab-size 300 --max-train-bytes 300000
                  --dim 64 --n-layers 2 --n-heads 2 --batch-size 4 --log-every 5 --eval-batches 2
                  --eval-every 0 --no-progress --no-plot --device cpu --seed 0 --pe rope)
    PYTHONPATH=$src/src "$PY" -m tapa.cli train "${common[@]}" --seq-len 64 --steps 40 --lr 3e-3 \
        --warmup-steps 5 --run-dir "$dir/pre" > "$dir.log" 2>&1
    PYTHONPATH=$src/src "$PY" -m tapa.cli train "${common[@]}" --init-from "$dir/pre" --seq-len 256 \
        --steps 10 --warmup-steps 2 --passkey-fraction 0.02 --pe rope-yarn --rope-scale 4 \
        --original-seq-len 64 --lr 3e-4 --run-dir "$dir/cont" >> "$dir.log" 2>&1
    PYTHONPATH=$src/src "$PY" -m tapa.cli eval "$dir/cont" --lengths 64,256,512 --stride 16 \
        --max-tokens 2048 --split test --device cpu --no-progress --out "$dir/eval" >> "$dir.log" 2>&1
    "$PY" -c 'import json, sys
methods = json.load(open(sys.argv[1]))["methods"]
for m in (methods if isinstance(methods, list) else methods.values()):
    print(" ".join("%d:%r" % (p["length"], p["perplexity"]) for p in m["perplexity"]))' "$dir/eval/results.json"
}

old=$(arm "$OUT/old-tree" "$OUT/old")
new=$(arm "$ROOT" "$OUT/new")
echo "$(git -C "$ROOT" rev-parse --short "$COMMIT"): $old"
echo "working tree: $new"
if [[ "$old" == "$new" ]]; then echo "identical"; else echo "DIFFERENT"; exit 1; fi
