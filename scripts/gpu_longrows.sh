#!/usr/bin/env bash
# Packed documents and long rows in one device call on an H200:
#   varlen_tests  the varlen op's tests on CUDA (tests/ops/test_varlen.py)
#   varlen        `tapa bench varlen` at D=128: equal documents (1k, 16k), the built-in corpus packed into
#                 8k/32k/128k rows against the dense kernel and FlexAttention's document mask
#   rows          `tapa bench model` of the 124M TAPA hybrid and RoPE, batch 1, 64k and 128k
#                 without activation checkpointing, with 6 of 12 blocks recomputed and with all
#   rows256k      the same at 256k, 6 blocks and all
#   docmask       `tapa bench model --doc-mask 2048`: TAPA, the TAPA hybrid and RoPE at 8k and 32k
#                 with packed documents (mean 2048 tokens), against the same without
#   decode        `tapa bench decode` (a second sample of the decode table)
#   cp            `tapa bench cp` under torchrun on every GPU of the machine (NCCL_NVLS_ENABLE=0):
#                 the 124M hybrid and RoPE, 128k and 256k rows, activation checkpointing, at CP
#                 sizes NGPUS, NGPUS/2, ..., 1 (CP 1: each GPU its own row, the reference); on one
#                 GPU, CP 1 only. Not in the default steps: it wants a machine of several GPUs
#   cpdoc         the same at 128k with packed documents (`--doc-mask 2048`); not a default step
#   usage:  bash scripts/gpu_longrows.sh NAME [STEP ...]   (steps: varlen_tests varlen rows
#           rows256k docmask decode cp cpdoc; default all but cp and cpdoc)
#   device: run(command="bash scripts/gpu_longrows.sh longrows", kind="nvidia-h200")
#           run(command="bash scripts/gpu_longrows.sh cp cp", kind="nvidia-h200-x8")
# Logs and tables go to /tmp/NAME and come back as $OUT/NAME.tar.gz; the tables are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: gpu_longrows.sh NAME [STEP ...]}
shift
STEPS=" ${*:-varlen_tests varlen rows rows256k docmask decode} "
source scripts/gpu_steps.sh "$NAME"

want() { [[ $STEPS == *" $1 "* ]]; }
want varlen_tests && step varlen_tests 240 python3 -m pytest -p no:cacheprovider -q -rfE --tb=short tests/ops/test_varlen.py
want varlen && step varlen 130 python3 -m tapa.cli bench varlen --head-dims 128 \
    --doc-lens 1024 16384 --corpus-bytes 2000000 --cache-dir "$WORK/cache" --out "$WORK/varlen"
want rows && for length in 65536 131072; do
    step "rows$length" 100 python3 -m tapa.cli bench model --lengths $length --tokens-per-step $length \
        --pes tapa:LLLG:256 rope --checkpointing off,6,on --warmup 1 --steps 3 --out "$WORK/rows$length"
done
want rows256k && step rows262144 300 python3 -m tapa.cli bench model --lengths 262144 --tokens-per-step 262144 \
    --pes tapa:LLLG:256 rope --checkpointing 6,on --warmup 1 --steps 2 --out "$WORK/rows262144"
for mask in 0 2048; do
    want docmask && step "docmask$mask" 90 python3 -m tapa.cli bench model --lengths 8192 32768 \
        --tokens-per-step 32768 --pes tapa tapa:LLLG:256 rope --doc-mask $mask --warmup 1 \
        --steps 3 --out "$WORK/docmask$mask"
done
want decode && step decode 50 python3 -m tapa.cli bench decode --out "$WORK/decode"
if want cp || want cpdoc; then
    sizes=() && for ((size = NGPUS; size >= 1; size /= 2)); do ((NGPUS % size)) || sizes+=("$size"); done
    [[ $NGPUS -eq 1 ]] && echo "cp: one GPU, so CP 1 only (context parallelism needs 2 or more)"
fi
want cp && step cp 540 env NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node "$NGPUS" -m tapa.cli \
    bench cp --lengths 131072 262144 --pes tapa:LLLG:256 rope --checkpointing on \
    --cp "${sizes[@]}" --warmup 1 --steps 3 --csv "$WORK/cp/cp.csv"
want cpdoc && step cpdoc 300 env NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node "$NGPUS" -m tapa.cli \
    bench cp --lengths 131072 --pes tapa:LLLG:256 rope --checkpointing on --doc-mask 2048 \
    --cp "${sizes[@]}" --warmup 1 --steps 3 --csv "$WORK/cp/cpdoc.csv"
tar czf "$OUT/$NAME.tar.gz" -C /tmp "$NAME"
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/steps.txt"
tail -3 "$WORK/varlen_tests.log" 2>/dev/null
grep "^|" "$WORK/varlen.log" 2>/dev/null
for name in rows65536 rows131072 rows262144 docmask0 docmask2048; do
    grep -h "L=" "$WORK/$name.log" 2>/dev/null | grep -v "^\["
done
grep -E "^\| (1|8|32) \| " "$WORK/decode/decode.md" 2>/dev/null | head -18 | cut -c1-120
grep "^|" "$WORK/cp.log" "$WORK/cpdoc.log" 2>/dev/null | cut -c1-240
