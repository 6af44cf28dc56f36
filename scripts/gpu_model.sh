#!/usr/bin/env bash
# The model-level suite in one device call on an H200 (the kernel suite is scripts/gpu_kernel.sh):
#   tests     the model-level CUDA tests: FlexAttention local layers (tests/ops/test_local.py), the
#             model and the hybrid, the trainer on one GPU, generation through the decode kernel
#   local     `tapa bench local`: one sliding-window layer (w=256, 1024) vs SDPA-flash causal
#             (results/local-attention-h200)
#   model     `tapa bench model`: 124M training tokens/s and MFU, TAPA / TAPA hybrid / RoPE at
#             2k-32k (results/model-throughput-h200)
#   generate  `tapa bench generate`: whole-model greedy decoding, eager vs CUDA graphs
#
#   usage:  bash scripts/gpu_model.sh NAME [STEP ...]       (steps: tests local model generate; default all)
#   device: run(command="bash scripts/gpu_model.sh model-check", kind="nvidia-h200")
#           run(command="MODEL_ARGS='--compile --lengths 2048' bash scripts/gpu_model.sh compiled model", ...)
# LOCAL_ARGS, MODEL_ARGS, GENERATE_ARGS add flags to a bench. Step caps sum to 550 s (one call is
# 600 s). Logs and tables go to /tmp/NAME and come back as $OUT/NAME.tar.gz; the tables are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: gpu_model.sh NAME [STEP ...] (steps: tests local model generate)}
shift
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=(tests local model generate)
for name in "${STEPS[@]}"; do
    [[ $name =~ ^(tests|local|model|generate)$ ]] || { echo "unknown step $name (steps: tests local model generate)" >&2; exit 2; }
done
source scripts/gpu_steps.sh "$NAME"
PYTEST_ARGS+=(-m cuda)

for name in "${STEPS[@]}"; do
    case $name in
        tests)    step tests 150 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_local.py \
                      tests/model tests/train/test_train_cuda.py tests/hf/test_hf_model.py ;;
        # shellcheck disable=SC2086
        local)    step local 120 python3 -m tapa.cli bench local ${LOCAL_ARGS:-} --out "$WORK/local" ;;
        # shellcheck disable=SC2086
        model)    step model 150 python3 -m tapa.cli bench model ${MODEL_ARGS:-} --out "$WORK/model" ;;
        # shellcheck disable=SC2086
        generate) step generate 130 python3 -m tapa.cli bench generate ${GENERATE_ARGS:-} --out "$WORK/generate" ;;
    esac
done
tar czf "$OUT/$NAME.tar.gz" -C /tmp "$NAME"
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/gpu.txt" "$WORK/steps.txt"
[[ -f $WORK/tests.log ]] && tail -4 "$WORK/tests.log"
for table in local/local.md model/README.md generate/generate.md; do
    [[ -f $WORK/$table ]] && { echo "== $table"; grep "^|" "$WORK/$table" | head -30 | cut -c1-200; }
done
exit 0
