#!/usr/bin/env bash
# Issue 13, Run 6 in one call (step caps 540 s, under 10 minutes; results/kernel-h200/run-5.md says
# why each step is here, PLAN.md what each result decides):
#   tests       tests/ops and the decode bench's tests on CUDA, in 8 xdist workers where xdist is
#               installed (Run 4's tests/ops took 138 s that way; Run 5 ran them serially and no
#               suite finished in 90-120 s). The defaults changed since they last ran on the GPU:
#               the 64x64/4 forward up to 16k keys, the transposed atomic dQ at D=128
#   fwd_n       the new default (64x64/4/2 forward up to 16384 keys, 128x64/8/3 above; dq_transpose
#               at D=128) against the Run-4 default (`run4`: 128x64/8/3 at every length, no
#               transposed dQ) and against the short tile at every length (`fwd64-all`, for the
#               32k rows: is 16384 the right limit), D = 128 and 64, causal, N = 1k..64k
#   fwd_nc      the same against `run4`, non-causal (the short tile was only ever timed causal)
#   splits      batch 8 at 8k-32k, the three shapes still at 1.32-1.40x as graph replays in Run 5:
#               the decode step at each split count against `default_num_splits`' 5 (2.4 waves of
#               programs on 132 SMs), `tapa bench decode --splits`
#   generate    `tapa bench generate`: whole-model greedy decoding (124M; TAPA, TAPA hybrid, RoPE;
#               batch 1 and 8, prompts 4k and 32k), ms per token eager vs static step vs CUDA graph
#   The tests step also runs tests/model/test_static_decode.py: TapaLM.generate's CUDA-graph decode
#   (StaticDecoder) against the uncaptured static step and the eager model, never run on a GPU yet.
#   Not again: Run 5 answered fwd64 (the short tile by N), dkdv_t (the transposed dQ) and decode.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run6.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run6
RUN4="run4:fwd=128x64/8/3,dq_transpose=0"  # the Run-4 default at D = 128 and 64, on the code of Run 6
step tests 190 python3 -m pytest tests/ops tests/bench/test_bench_decode.py tests/model/test_static_decode.py "${PYTEST_ARGS[@]}"
step fwd_n 180 python3 -m tapa.bench.attention --head-dims 128 64 --causal causal \
    --seq-lens 1024 4096 16384 32768 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --kernel-report --out "$WORK/fwd_n" --variants "$RUN4" "fwd64-all:fwd=64x64/4/2"
step fwd_nc 60 python3 -m tapa.bench.attention --head-dims 128 --causal noncausal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --out "$WORK/fwd_nc" --variants "$RUN4"
step splits 50 python3 -m tapa.cli bench decode --batch 8 --cache 8192 16384 32768 --graphs \
    --splits 2 3 4 6 8 12 16 24 --out "$WORK/splits"
step generate 60 python3 -m tapa.cli bench generate --out "$WORK/generate"
tar czf "$OUT/kernel_run6.tar.gz" -C /tmp kernel_run6
echo "done at +$(($(date +%s) - START))s"
grep -E "^(FAILED|ERROR)|passed|failed" "$WORK/tests.log" | cut -c1-300 | tail -12
grep -A 32 "^| variant | D" "$WORK/fwd_n/attention.md" | head -32
grep -E "^\| fwd " "$WORK/fwd_n/attention_kernels.md" | head -4
grep -A 8 "^| variant | D" "$WORK/fwd_nc/attention.md" | head -8
cat "$WORK/splits/decode_splits.md" 2>/dev/null | tail -5
cat "$WORK/generate/generate.md" 2>/dev/null | tail -36
