#!/usr/bin/env bash
# Issue 13 probe: ONE device call on an H200 (< 9 minutes) that gathers the evidence for the next
# kernel change. results/kernel-h200/PLAN.md says what each step measures and how each result
# decides what comes next. No default changes here: every variant is opt-in.
#
#   device tool: run(command="bash scripts/gpu_h200_kernel_probe.sh", kind="nvidia-h200", timeout_s=600)
#
# Steps, most valuable first (each under `timeout`, so a slow step cannot eat the call; the
# limits sum to 535 s):
#   env        GPU, clocks, versions, tools
#   attention  every variant at D=128, N=4k/16k next to the default and SDPA flash/cuDNN (accuracy
#              vs float64 first), the combination of the winners at D=64 and 128 (second round of
#              the default = noise), registers/spills/SASS census of every compiled kernel
#   attention64 a few variants and their own combination at D=64
#   ncu        Nsight Compute (--clock-control none) of the default fwd/dkdv/dq and atomic dkdv
#   decode     the decode-step floor at batch 1 / 4k (profiler, CUDA graph, splits) and the
#              batch 32 x 128k case never run since the int64 fix
#   tests      tests/ops compiled on the GPU (float32/float16 variants, bf16 and 64k long range)
# Not timed: warp-specialized loops (`/ws`). Triton 3.6 compiles them for sm_90 to the same code as
# the plain loops (offline census, results/kernel-h200/offline-census.md), so they would time the
# default again.
# Everything lands in $OUT/kernel_probe.tar.gz (logs, CSVs, SASS, ncu reports); $OUT/summary.md
# holds the tables. The console shows each step's end and the summary's tail.
# PROBE_STEPS="ncu_default decode ..." runs only the named steps (e.g. a second, shorter call).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/kernel_probe_out}
export WORK=/tmp/kernel_probe  # outside $OUT: only the tarball and the summary come back
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
START=$(date +%s)

step() {  # step NAME SECONDS COMMAND...: log to $WORK/NAME.log; rc and seconds to steps.txt
    # (through bash -c, so that COMMAND may be one of the exported functions below)
    local name=$1 limit=$2
    shift 2
    if [[ -n "${PROBE_STEPS:-}" && " $PROBE_STEPS " != *" $name "* ]]; then
        return 0
    fi
    local t0
    t0=$(date +%s)
    echo "== $name (limit ${limit}s, at +$((t0 - START))s)"
    timeout --kill-after=5 "$limit" bash -c '"$@"' "$name" "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc seconds=$(($(date +%s) - t0))" | tee -a "$WORK/steps.txt"
    tail -n 4 "$WORK/$name.log"
}

env_report() {
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
    python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
    python3 -c "import xdist; print('pytest-xdist', xdist.__version__)" || true
    ncu --version | tail -n 1 || true
    python3 -c "from tapa.bench.kernel_report import find_cuobjdump; print('cuobjdump', find_cuobjdump())"
    git log --oneline -n 1 2>/dev/null || true
    nproc
}
export -f env_report
step env 15 env_report

VARIANTS=(
    # forward blocks (judged by the forward time)
    "fwd-128x128:fwd=128x128/8/2" "fwd-s2:fwd=128x64/8/2"
    # backward: dQ by float32 atomics from the dK/dV kernel, and block sizes (by the backward time)
    "atomic:dq_atomic=1" "atomic-64x128:dq_atomic=1,dkdv=64x128/8/2"
    "atomic-16x128:dq_atomic=1,dkdv=16x128/8/2" "atomic-s3:dq_atomic=1,dkdv=32x128/8/3"
    "atomic-64x64:dq_atomic=1,dkdv=64x64/8/2" "dkdv-64x128:dkdv=64x128/8/2"
    "dq-128x32:dq=128x32/8/2" "dq-128x64:dq=128x64/8/2"
    # per-score work (by fwd+bwd): MUFU trig, shorter polynomials, lower-degree d**alpha series
    "mufu:trig_poly=0" "terms5:trig_terms=5" "terms4:trig_terms=4" "terms3:trig_terms=3"
    "taylor4:taylor_order=4,taylor_tolerance=1e-7" "taylor3:taylor_order=3,taylor_tolerance=1e-6"
)
step attention 215 python3 -m tapa.bench.attention --head-dims 128 --causal causal \
    --seq-lens 4096 16384 --long-range-len 0 --reference-len 0 --compile-jobs 12 --kernel-report \
    --combine-best --combine-head-dims 64 128 --out "$WORK/attention" --variants "${VARIANTS[@]}"

# D=64 has register room that D=128 lacks (offline sm_90 compile, triton 3.6: fwd 223, dK/dV 237 and
# dQ 115 registers), so its best blocks may differ: a few variants, their own combination
step attention64 70 python3 -m tapa.bench.attention --head-dims 64 --causal causal \
    --seq-lens 4096 16384 --long-range-len 0 --reference-len 0 --compile-jobs 9 \
    --combine-best --out "$WORK/attention64" --variants "fwd-128x128:fwd=128x128/8/2" \
    "dq-128x32:dq=128x32/8/2" "dq-128x64:dq=128x64/8/2" "atomic:dq_atomic=1" "atomic-64x64:dq_atomic=1,dkdv=64x64/8/2" \
    "dkdv-64x128:dkdv=64x128/8/2" "terms3:trig_terms=3" "taylor3:taylor_order=3,taylor_tolerance=1e-6"

cat > "$WORK/ncu_driver.py" <<'EOF'
# one fwd+bwd of the benchmark's N=4k case (B=16, H=16, D=128, bf16, causal)
import torch
from tapa.ops import tapa_attention
q, k, v = (torch.randn(16, 4096, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
tapa_attention(q, k, v, impl="triton").backward(torch.randn_like(q))
torch.cuda.synchronize()
EOF
ncu_report() {  # ncu_report NAME KERNEL_REGEX COUNT: profile the driver, then print the details page
    local sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis
        --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy
        --section SchedulerStats --section WarpStateStats --section InstructionStats
        --section SourceCounters)
    mkdir -p "$WORK/ncu"
    ncu --clock-control none --kernel-name "regex:$2" --launch-count "$3" "${sections[@]}" \
        -f -o "$WORK/ncu/$1" python3 "$WORK/ncu_driver.py" &&
        ncu --import "$WORK/ncu/$1.ncu-rep" --page details > "$WORK/ncu/$1_details.txt" &&
        ncu --import "$WORK/ncu/$1.ncu-rep" --page raw --csv > "$WORK/ncu/$1_raw.csv"
}
export -f ncu_report
step ncu_default 40 ncu_report default "_fwd_kernel|_bwd_dkdv_kernel|_bwd_dq_kernel" 3
TAPA_KERNEL_VARIANT=dq_atomic=1 step ncu_atomic 25 ncu_report atomic "_bwd_dkdv_kernel" 1

step decode 55 python3 -m tapa.cli bench decode --batch 1 32 --cache 4096 131072 --profile \
    --profile-batch 1 --profile-cache 4096 --out "$WORK/decode"

PYTEST_ARGS=(-q -p no:cacheprovider -rfE)
python3 -c "import xdist" 2>/dev/null && PYTEST_ARGS+=(-n 8)
python3 -c "import pytest_timeout" 2>/dev/null && PYTEST_ARGS+=(--timeout 60)
step tests 105 python3 -m pytest tests/ops "${PYTEST_ARGS[@]}"

summary() {
    python3 - "$WORK" <<'EOF'
import re, sys
from pathlib import Path

work = Path(sys.argv[1])
def read(path):
    return path.read_text() if path.is_file() else ""
parts = ["# Kernel probe (issue 13): summary", "", "Steps (rc 124 = cut by its timeout):", "", "```",
         read(work / "steps.txt").strip(), "```", "", "## env", "", "```", read(work / "env.log").strip(), "```"]
tests = read(work / "tests.log").strip().splitlines()
parts += ["", "## tests/ops on CUDA", "", "```", *[l for l in tests if re.search(r"passed|failed|error|FAILED|ERROR", l)][-15:], "```"]
for name, title in (("attention", "Variants, D=128 (+ combination at D=64)"), ("attention64", "Variants, D=64")):
    text = read(work / name / "attention.md")
    section = text.split("## Kernel variants", 1)[1].split("\n## ", 1)[0] if "## Kernel variants" in text else "(no result)"
    parts += ["", f"## {title}", section.strip()]
    kernels = read(work / name / "attention_kernels.md")
    if kernels:
        parts += ["", f"### {title}: compiled kernels", "", kernels.split("\n", 2)[-1].strip()]
keys = re.compile(r"^  \S.*Context|Duration|Registers Per Thread|Achieved Occupancy|Compute \(SM\) Throughput"
                  r"|Memory Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Local Memory|Dynamic Shared"
                  r"|One or More Eligible|Block Limit Registers|Warp Cycles Per Issued")
for name in ("default", "atomic"):
    text = read(work / "ncu" / f"{name}_details.txt")
    lines = [l.rstrip() for l in text.splitlines() if keys.search(l)]
    parts += ["", f"## ncu ({name})", "", "```", *(lines or ["(no result)"]), "```"]
profile = read(work / "decode" / "decode_profile.md").split("Profiler, top CPU ops")[0]
parts += ["", "## decode", "", profile.strip(), "", read(work / "decode" / "decode.md").strip()]
(work / "summary.md").write_text("\n".join(parts) + "\n")
EOF
}
export -f summary
step summary 10 summary
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv >> "$WORK/env.log" 2>&1
tar czf "$OUT/kernel_probe.tar.gz" -C /tmp kernel_probe
cp "$WORK/summary.md" "$OUT/summary.md" 2>/dev/null
echo "done at +$(($(date +%s) - START))s"
tail -n 80 "$WORK/summary.md" 2>/dev/null
