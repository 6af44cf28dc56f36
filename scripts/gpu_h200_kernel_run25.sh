#!/usr/bin/env bash
# Issue 13, Run 25 in one call (step caps 170 + 150 + 120 s), written 2026-12-04 (eighteenth
# session) after Run 24 made the forward's TMA tiles the 16-bit D=128 default:
#   tests_ops  all of tests/ops on CUDA under the new default (the new TMA and lazy-rescale
#              variants' float64 checks included)
#   attention  the default alone against SDPA-flash and cuDNN at D=64 and D=128, 1k-64k causal,
#              with the float64 checks at N=2048 and the 64k far rows: the README's table
#   model      `tapa bench model`: 124M (6 heads of 128, so the D=128 kernels), TAPA / hybrid /
#              RoPE training throughput at 2k-32k
#   device tool: run(command="bash scripts/gpu_h200_kernel_run25.sh", kind="nvidia-h200")
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_steps.sh kernel_run25
default_steps 150
step model 120 python3 -m tapa.cli bench model --out "$WORK/model"
finish_head kernel_run25 tests_ops
print_defaults
grep -E "^\| " "$WORK/model/README.md" 2>/dev/null | head -20 | cut -c1-260
tail -n 3 "$WORK/model.log"
