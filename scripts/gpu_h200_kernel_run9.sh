#!/usr/bin/env bash
# Issue 13, Run 9 in one call (step caps 540 s; results/kernel-h200/run-8.md and offline-census-6.md
# say why each step is here, PLAN.md what each result decides):
#   decode_profile  the kernels of one static decoding step, RoPE / TAPA / TAPA hybrid, batch 1 and
#                   8, prompts 4k and 32k, with the CUDA-graph step's time next to their sum
#                   (scripts/decode_kernel_profile.py). Run 8's RoPE graph step was 1.12-1.17x
#                   TAPA's at batch 1, so by PLAN.md's rule the difference is profiled before a
#                   model-level decode ratio is quoted
#   ncu_fwd         Nsight Compute of the forward kernel, TAPA and SDPA-flash, at D=64 and D=128
#                   (N=16k, B=4, H=16, causal, bf16): throughput, pipe utilization, issue stalls,
#                   instruction mix. D=64 runs at 1.84-1.99x flash (Run 6); the claim to test is that
#                   the per-score elementwise work, which does not shrink with D, bounds it there
#   variants128     three forward variants from offline census 6 and their sum at D=128, 4k / 16k
#                   / 64k, each checked against float64 first: fwd_split_s=1 (distances as row
#                   offsets less a column ramp, u one FFMA), fwd_fast_scalars=1 (a far tile's log2
#                   and 1/d0 by the MUFU), fwd_cos_radians=1 (the MUFU cos on the unreduced phase);
#                   all three: -22% instructions per far-tile iteration offline; and the dK/dV
#                   kernel's MUFU sin/cos on the unreduced phase (dkdv_cos_radians=1, -2.8% of its
#                   static instructions offline)
#   variants64      the same at D=64 (the first D=64 rows since Run 6), where the default cos is
#                   the polynomial: the radians variant needs trig_poly=0 (all: -29% offline)
#   cuda_tests      the variants' CUDA-only float64 checks (the MUFU paths have no interpreter)
#   device tool: run(command="bash scripts/gpu_h200_kernel_run9.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run9
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
mkdir -p "$WORK/ncu"
for case in "tapa 64 _fwd_kernel" "flash 64 flash_fwd" "tapa 128 _fwd_kernel" "flash 128 flash_fwd"; do
    set -- $case
    ncu --clock-control none --kernel-name "regex:$3" --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        --section InstructionStats --section LaunchStats --section Occupancy \
        -f -o "$WORK/ncu/fwd_$1_$2" python3 "$WORK/fwd_driver.py" "$1" "$2" &&
        ncu --import "$WORK/ncu/fwd_$1_$2.ncu-rep" --page details > "$WORK/ncu/fwd_$1_$2_details.txt"
done
EOF
export WORK
step ncu_fwd 100 bash "$WORK/ncu_fwd.sh"
step variants128 150 python3 -m tapa.bench.attention --head-dims 128 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --variants split:fwd_split_s=1 radians:fwd_cos_radians=1 \
    lean:fwd_split_s=1,fwd_fast_scalars=1,fwd_cos_radians=1 bwd_radians:dkdv_cos_radians=1 \
    --out "$WORK/variants128"
step variants64 150 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 65536 --long-range-len 0 --reference-len 0 --compile-jobs 4 \
    --variants split:fwd_split_s=1 fast:fwd_fast_scalars=1 both:fwd_split_s=1,fwd_fast_scalars=1 \
    mufu:trig_poly=0 lean:trig_poly=0,fwd_split_s=1,fwd_fast_scalars=1,fwd_cos_radians=1 \
    --out "$WORK/variants64"
step cuda_tests 60 python3 -m pytest tests/ops/test_triton_attention.py -m cuda -p no:cacheprovider -rfE \
    --tb=short -k "radians or fast_far or mufu"
tar czf "$OUT/kernel_run9.tar.gz" -C /tmp kernel_run9
echo "done at +$(($(date +%s) - START))s"
head -12 "$WORK/decode_profile/decode_kernels.md" 2>/dev/null | tail -6
for f in "$WORK"/ncu/fwd_*_details.txt; do
    echo "== $f"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|Registers Per Thread|Achieved Occupancy" \
        "$f" 2>/dev/null | head -9
done
grep -E "passed|failed" "$WORK/cuda_tests.log" | tail -3
grep -h -A 20 "^| variant | D" "$WORK"/variants*/attention.md 2>/dev/null | head -44
