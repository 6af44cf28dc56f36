# Sourced by the GPU suite scripts (gpu_kernel.sh, gpu_model.sh, gpu_longrows.sh):
#   source scripts/gpu_steps.sh NAME
# Sets PYTHONPATH to the tree's src, OUT (the device tool's, else /tmp/NAME_out), WORK=/tmp/NAME
# (emptied), START, PYTEST_ARGS (8 xdist workers where xdist is installed), NGPUS (the machine's
# GPUs, for torchrun steps such as gpu_longrows.sh's cp), records the GPUs and versions in
# $WORK/gpu.txt, and defines `step`.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1 MPLBACKEND=Agg
OUT=${OUT:-/tmp/${1}_out}
WORK=/tmp/$1
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
START=$(date +%s)
PYTEST_ARGS=(-p no:cacheprovider -rfE --tb=short)
python3 -c "import xdist" 2>/dev/null && PYTEST_ARGS+=(-n 8)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$WORK/gpu.txt" 2>&1
NGPUS=$(nvidia-smi --list-gpus 2>/dev/null | grep -c "^GPU")
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    >> "$WORK/gpu.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: log to $WORK/NAME.log, rc and seconds to $WORK/steps.txt
    local name=$1 limit=$2 t0
    shift 2
    t0=$(date +%s)
    echo "== $name (limit ${limit}s, at +$((t0 - START))s)"
    timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.log" 2>&1
    echo "$name rc=$? seconds=$(($(date +%s) - t0))" | tee -a "$WORK/steps.txt"
}
