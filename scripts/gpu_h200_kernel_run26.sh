#!/usr/bin/env bash
# Issue 13, Run 26 in one call (step caps 120 + 90 + 90 + 130 s), written 2026-12-04 (eighteenth
# session): the decode step's host floor. Run 5's profile put two thirds of a batch-1 step's host
# time (0.14 ms against a 0.009 ms kernel) in Triton's JITFunction.run; from the third step of a
# call signature the split and merge kernels now launch their compiled kernels directly (while
# the caller's pointers keep the alignment they were compiled for).
#   tests     the decode kernel, the decode op, the static decode step and the decode bench on
#             CUDA (the new test_later_steps_launch_the_compiled_kernels_directly among them)
#   jit       `tapa bench decode --graphs --profile` with TAPA_DECODE_DIRECT_LAUNCH=0 (every launch
#             through Triton's JIT, as before): the A side
#   decode    the same on the new default (direct launches): the B side
#   generate  `tapa bench generate`: whole-model greedy decoding, eager / static step / graph
#   device tool: run(command="bash scripts/gpu_h200_kernel_run26.sh", kind="nvidia-h200")
# RUN (default kernel_run26) names the work folder and the tarball: Run 27 repeats this script.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-kernel_run26}
source scripts/device_steps.sh "$RUN"
step tests 120 python3 -m pytest tests/model/test_static_decode.py tests/ops/test_decode_kernel.py \
    tests/ops/test_decode.py tests/bench/test_bench_decode.py "${PYTEST_ARGS[@]}"
step jit 90 env TAPA_DECODE_DIRECT_LAUNCH=0 python3 -m tapa.cli bench decode --graphs --profile --out "$WORK/jit"
step decode 90 python3 -m tapa.cli bench decode --graphs --profile --out "$WORK/decode"
step generate 130 python3 -m tapa.cli bench generate --out "$WORK/generate"
tar czf "$OUT/$RUN.tar.gz" -C /tmp "$RUN"
echo "done at +$(($(date +%s) - START))s"
cat "$WORK/steps.txt"
tail -3 "$WORK/tests.log"
for side in jit decode; do
    echo "== $side"
    grep -E "^\| (1|8|32) \| " "$WORK/$side/decode.md" | head -18 | cut -c1-140
    grep -h -A 12 -i "host" "$WORK/$side/decode_profile.md" 2>/dev/null | head -16
done
tail -30 "$WORK/generate/generate.md" 2>/dev/null
