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
# Then Nsight Compute of the D=64 backward (N=16k, B=4, H=16, causal, bf16): TAPA's dK/dV and dQ
# kernels and SDPA-flash's backward kernel, the first profile of any D=64 backward (its fwd+bwd is
# 1.45-1.49x flash's, the backward about 1.6x flash's backward): which kernel takes the time, and
# whether it issues or waits (issue slots, pipes, occupancy, stalls).
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
cat > "$WORK/bwd_driver.py" <<'EOF'
import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tapa.ops import tapa_attention
impl, d = sys.argv[1], int(sys.argv[2])
q, k, v = (torch.randn(4, 16384, 16, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
if impl == "tapa":
    out = tapa_attention(q, k, v, impl="triton")
else:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
EOF
cat > "$WORK/ncu_bwd.sh" <<'EOF'
for case in "tapa 64 _bwd_dkdv_kernel dkdv" "tapa 64 _bwd_dq_kernel dq" "flash 64 flash_bwd_dq_dk_dv flash"; do
    set -- $case
    ncu_details "$WORK/ncu/bwd_$4_$2" "$3" \
        "SpeedOfLight ComputeWorkloadAnalysis WarpStateStats InstructionStats LaunchStats Occupancy" \
        python3 "$WORK/bwd_driver.py" "$1" "$2"
done
EOF
export WORK
step ncu_bwd 110 bash "$WORK/ncu_bwd.sh"
finish_variants kernel_run16 tests_ops
for f in "$WORK"/ncu/bwd_*_details.txt; do
    echo "== $f"
    grep -E "Duration|Issue Slots Busy|Executed Ipc Active|Registers Per Thread|Achieved Occupancy|Executed Instructions  " \
        "$f" 2>/dev/null | head -8
done
