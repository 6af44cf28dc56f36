#!/usr/bin/env bash
# Issue 13, Run 24 in one call (step caps 150 + 240 s), written 2026-12-04 (eighteenth session):
# the new forward and backward load/softmax options, each checked on CUDA against float64 and
# timed against the default in the same run (not yet defaults):
#   tma    fwd_tma: the forward's K/V tiles by TMA descriptors (offline, Triton 3.6, D=64: the far
#          loop 574 -> 590 instructions, the masked one 951 -> 894, stack 40 -> 8 B)
#   lazy   fwd_lazy_rescale: the accumulators rescaled only where a row max passes theirs by 2**8
#   tmal   both
#   dqt    dq_tma: the dQ kernel's K/V tiles by TMA (D=64 only; at D=128 dQ goes by atomics)
#   dkt    dkdv_tma: the dK/dV kernel's Q/dO tiles by TMA
# Adoption (PLAN.md): faster by more than 1.1% at every N at that head dim, the gated errors
# within 1.5x, the 64k far rows as the default's.
#   device tool: run(command="bash scripts/gpu_h200_kernel_run24.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run24
step tests_new 150 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops/test_triton_attention.py \
    -k "tma or lazy or half_precision_bar"
step attention 240 python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
    --seq-lens 4096 16384 65536 --reference-len 0 --compile-jobs 8 --kernel-report \
    --variants tma:fwd_tma=1 lazy:fwd_lazy_rescale=1 tmal:fwd_tma=1,fwd_lazy_rescale=1 \
    dqt:dq_tma=1 dkt:dkdv_tma=1 --out "$WORK/attention"
finish_variants kernel_run24 tests_new
