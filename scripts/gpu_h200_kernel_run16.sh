#!/usr/bin/env bash
# Issue 13, Run 16 in one call (step caps 170 + 150 s), written 2026-12-03 on the CPU machine:
# all of tests/ops on CUDA under the Run-15 default (Run 15 ran 8 of them), then the two forward
# changes built after offline-census-9.md, timed next to the default at D=64 and D=128,
# 4k/16k/64k, each checked against float64 at N=2048 (out, dq, dk, dv gated; lse shown) and on
# the 64k far rows:
#   ramp  fwd_ramp_series=1: the column-term series on the column ramp (offline -0.22 a far score)
#   dot   fwd_dot_rowsum=1: the softmax row sums on the tensor cores (offline -0.91 a far score;
#         lse then carries the probabilities' bf16 rounding: read its ratio)
#   both  the two together (offline -1.13 a far score)
# Adoption (PLAN.md): the forward faster by more than 1.1% at every N at that head dim, the gated
# errors within 1.5x, the far rows as the default's; for `dot`, also the lse error judged.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run16.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run16
step tests_ops 170 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops
step attention 150 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 \
    --variants ramp:fwd_ramp_series=1 dot:fwd_dot_rowsum=1 both:fwd_dot_rowsum=1,fwd_ramp_series=1 \
    --out "$WORK/attention"
finish_variants kernel_run16 tests_ops
