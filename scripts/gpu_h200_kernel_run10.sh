#!/usr/bin/env bash
# Issue 13, Run 10 in one call (step caps 560 s; results/kernel-h200/run-9.md says why each step is
# here, PLAN.md what each result decides). Run 9 ran its variant steps only; its decode profile and
# ncu steps are here, after the checks that the new defaults (Run 9's winners) need:
#   tests_ops       the fused kernels' tests on CUDA under the new defaults: bf16 accuracy, the 64k
#                   long-range rows, the MUFU paths' float64 checks (8 xdist workers; the decode
#                   and reference tests, which the new defaults do not reach, are left out)
#   attention       `tapa bench attention` at D=128 and D=64, causal, 1k-64k, with its bf16 check
#                   and the 64k far-row check on the new default (Run 4's far rows: 1.26-1.40), and
#                   the 32k row Run 9 did not time
#   variants64      dkdv_cos_radians at D=64 (on at D=128 since Run 9; not yet timed at D=64), and
#                   register caps for 3 forward blocks per SM (12 warps) up to 16k keys and 2 above
#                   (offline-census-7.md); dQ by transposed atomics at D=64 (D=128's choice since
#                   Run 5; at D=64 only the untransposed atomics were timed, in Run 3: a tie); the
#                   dK/dV kernel at 64 keys a program, 4 warps, uncapped (2 blocks per SM) and capped
#                   at 168 registers (3 blocks: 12 warps per SM against 8 now)
#   decode_profile  the kernels of one static decoding step, RoPE / TAPA / TAPA hybrid, batch 1 and
#                   8, prompts 4k and 32k, with the CUDA-graph step's time next to their sum
#                   (scripts/decode_kernel_profile.py). Run 8's RoPE graph step was 1.12-1.17x
#                   TAPA's at batch 1, so by PLAN.md's rule the difference is profiled before a
#                   model-level decode ratio is quoted
#   ncu_fwd         Nsight Compute of the forward kernel, TAPA and SDPA-flash, at D=64 and D=128
#                   (N=16k, B=4, H=16, causal, bf16): throughput, pipe utilization, issue stalls,
#                   instruction mix. Run 9: at D=64 a quarter of the census's instruction cut reached
#                   the time (1.53-1.57x flash's forward), so whether the issue slots bound it is open
#   device tool: run(command="bash scripts/gpu_h200_kernel_run10.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run10
step tests_ops 120 python3 -m pytest tests/ops/test_triton_attention.py tests/ops/test_checks.py \
    tests/ops/test_compile.py "${PYTEST_ARGS[@]}"
step attention 170 python3 -m tapa.bench.attention --head-dims 128 64 --causal causal --compile-jobs 4 \
    --out "$WORK/attention"
step variants64 110 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --variants bwd_radians:dkdv_cos_radians=1 r168:fwd=64x64/4/2/r168,fwd_long=128x64/8/3 \
    r168all:fwd=64x64/4/2/r168 long_r128:fwd_long=128x64/8/3/r128 atomic_t:dq_atomic=1,dq_transpose=1 \
    dkdv64:dkdv=32x64/4/2 dkdv64r:dkdv=32x64/4/2/r168 --out "$WORK/variants64"
step decode_profile 80 python3 scripts/decode_kernel_profile.py --steps 10 --out "$WORK/decode_profile"
cat > "$WORK/fwd_driver.py" <<'EOF'
import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tapa.ops import tapa_attention
impl, d = sys.argv[1], int(sys.argv[2])
q, k, v = (torch.randn(4, 16384, 16, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    if impl == "tapa":
        tapa_attention(q, k, v, impl="triton")
    else:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
torch.cuda.synchronize()
EOF
cat > "$WORK/ncu_fwd.sh" <<'EOF'
for case in "tapa 64 _fwd_kernel" "flash 64 flash_fwd" "tapa 128 _fwd_kernel" "flash 128 flash_fwd"; do
    set -- $case
    ncu_details "$WORK/ncu/fwd_$1_$2" "$3" \
        "SpeedOfLight ComputeWorkloadAnalysis WarpStateStats InstructionStats LaunchStats Occupancy" \
        python3 "$WORK/fwd_driver.py" "$1" "$2"
done
EOF
export WORK
step ncu_fwd 80 bash "$WORK/ncu_fwd.sh"
tar czf "$OUT/kernel_run10.tar.gz" -C /tmp kernel_run10
echo "done at +$(($(date +%s) - START))s"
head -12 "$WORK/decode_profile/decode_kernels.md" 2>/dev/null | tail -6
for f in "$WORK"/ncu/fwd_*_details.txt; do
    echo "== $f"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|Registers Per Thread|Achieved Occupancy" \
        "$f" 2>/dev/null | head -9
done
grep -E "^(FAILED|ERROR)|passed|failed" "$WORK/tests_ops.log" | tail -8
grep -h -B2 -A 12 "x SDPA flash" "$WORK"/attention/attention.md 2>/dev/null | head -60
grep -h -A 8 "^| variant | D" "$WORK"/variants64/attention.md 2>/dev/null | head -12
