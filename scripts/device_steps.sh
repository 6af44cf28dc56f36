# Sourced by the device-call scripts (scripts/gpu_h200_kernel_next.sh, ..._followup.sh): the common
# preamble and `step`. Sets PYTHONPATH to the repository's src, OUT (the caller's default unless
# the device tool set it) and WORK (emptied), and START for the step clock.
#   source scripts/device_steps.sh NAME      (WORK=/tmp/NAME, OUT defaults to /tmp/NAME_out)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/${1}_out}
WORK=/tmp/$1
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
START=$(date +%s)

step() {  # step NAME SECONDS COMMAND...: log to $WORK/NAME.log; rc and seconds to $WORK/steps.txt
    local name=$1 limit=$2 t0
    shift 2
    t0=$(date +%s)
    echo "== $name (limit ${limit}s, at +$((t0 - START))s)"
    timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.log" 2>&1
    echo "$name rc=$? seconds=$(($(date +%s) - t0))" | tee -a "$WORK/steps.txt"
}
