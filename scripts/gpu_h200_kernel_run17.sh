#!/usr/bin/env bash
# Issue 13, Run 17 in one call (step caps 90 + 170 + 60 s), written 2026-12-03 on the CPU machine
# after Run 16's ncu of the D=64 backward (3.0x flash's instructions, issue slots 66-68% busy:
# near issue-bound, results/kernel-h200/run-16.md) and offline census 10
# (results/kernel-h200/offline-census-10.md): the backward's per-score cuts, timed.
#   tests_ops  the new flags' float64 checks on CUDA (the MUFU forms do not run in the interpreter)
#   attention  at D=64 and D=128, 4k/16k/64k, each variant checked against float64 at N=2048 and
#              on the 64k far rows, then timed next to the default:
#     rad    dq_cos_radians + dkdv_cos_radians: the MUFU sin/cos on the unreduced phase in both
#            backward kernels (D=128: dkdv's is its default already and dQ goes by atomics, so
#            `rad` is the default there: a control)
#     fast   bwd_fast_scalars: the far tiles' log2(d0) and 1 / d0 from the MUFU
#     split  dq_split_s + dkdv_split_s: the distances as row offsets less a ramp
#     all    the three together; allrs  all + dq_row_series (the dQ kernel's series in the column term)
#   ncu_bwd    Nsight Compute of `all`'s two backward kernels at D=64 (N=16k), against Run 16's
#              default (dK/dV 17.27 ms, 10.96e9 instructions; dQ 13.16 ms, 8.53e9)
# Adoption: the backward faster by more than 1.1% at every N at that head dim, the gated errors
# within 1.5x, the far rows as the default's.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run17.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run17
step tests_ops 90 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_triton_attention.py \
    -k "radians or fast_far or variant or flags or long_range"
RAD=dq_cos_radians=1,dkdv_cos_radians=1
SPLIT=dq_split_s=1,dkdv_split_s=1
ALL=$RAD,bwd_fast_scalars=1,$SPLIT
step attention 170 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants rad:$RAD fast:bwd_fast_scalars=1 split:$SPLIT all:$ALL allrs:$ALL,dq_row_series=1 \
    --out "$WORK/attention"
cat > "$WORK/ncu_bwd.sh" <<NCU
for kernel in _bwd_dkdv_kernel _bwd_dq_kernel; do
    ncu_details "$WORK/ncu/all_\${kernel}_64" "\$kernel" \
        "SpeedOfLight ComputeWorkloadAnalysis WarpStateStats InstructionStats LaunchStats Occupancy" \
        python3 scripts/ncu_bwd_driver.py tapa 64 $ALL
done
NCU
step ncu_bwd 60 bash "$WORK/ncu_bwd.sh"
finish_variants kernel_run17 tests_ops
for f in "$WORK"/ncu/*_details.txt; do
    echo "== $f"
    grep -E "Duration|Issue Slots Busy|Registers Per Thread|Executed Instructions  " "$f" | head -5
done
