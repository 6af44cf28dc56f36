# Sourced by the device-call scripts (scripts/gpu_h200_kernel_next.sh, ..._followup.sh): the common
# preamble and `step`. Sets PYTHONPATH to the repository's src, OUT (the caller's default unless
# the device tool set it) and WORK (emptied), START for the step clock, and PYTEST_ARGS for the steps' pytest calls.
#   source scripts/device_steps.sh NAME      (WORK=/tmp/NAME, OUT defaults to /tmp/NAME_out)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 TQDM_DISABLE=1
OUT=${OUT:-/tmp/${1}_out}
WORK=/tmp/$1
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
START=$(date +%s)
# the steps' pytest options (pyproject adds -q); 8 xdist workers where xdist is installed
PYTEST_ARGS=(-p no:cacheprovider -rfE --tb=short)
python3 -c "import xdist" 2>/dev/null && PYTEST_ARGS+=(-n 8)

step() {  # step NAME SECONDS COMMAND...: log to $WORK/NAME.log; rc and seconds to $WORK/steps.txt
    local name=$1 limit=$2 t0
    shift 2
    t0=$(date +%s)
    echo "== $name (limit ${limit}s, at +$((t0 - START))s)"
    timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.log" 2>&1
    echo "$name rc=$? seconds=$(($(date +%s) - t0))" | tee -a "$WORK/steps.txt"
}

ncu_details() {  # ncu_details STEM KERNEL_REGEX "SECTION ..." COMMAND...: Nsight Compute of the first
    # matching launch of COMMAND (SM clock untouched) to STEM.ncu-rep, its details page to STEM_details.txt
    local stem=$1 regex=$2 section sections=()
    for section in $3; do sections+=(--section "$section"); done
    shift 3
    mkdir -p "$(dirname "$stem")"
    ncu --clock-control none --kernel-name "regex:$regex" --launch-count 1 "${sections[@]}" \
        -f -o "$stem" "$@" &&
        ncu --import "$stem.ncu-rep" --page details > "${stem}_details.txt"
}
export -f ncu_details  # the steps run their ncu loops as child scripts

finish_head() {  # finish_head NAME TESTS_STEP: tar $WORK to $OUT/NAME.tar.gz, then print the
    # time, the steps and the tests' tail
    tar czf "$OUT/$1.tar.gz" -C /tmp "$1"
    echo "done at +$(($(date +%s) - START))s"
    cat "$WORK/steps.txt"
    tail -4 "$WORK/$2.log"
}

finish_variants() {  # finish_variants NAME TESTS_STEP: `finish_head`, then the variant bench's
    # summary ($WORK/attention/attention.md)
    local md="$WORK/attention/attention.md"
    finish_head "$1" "$2"
    grep -h "| yes\|| NO" "$md" | head -12
    grep -h -A 30 "^| variant | D" "$md" 2>/dev/null | head -50
    grep -h -A 14 "^## Long range" "$md" | head -30
    tail -3 "$WORK/attention.log"
}

default_steps() {  # default_steps ATTENTION_CAP: all of tests/ops on CUDA (step tests_ops), then
    # the defaults against SDPA-flash and cuDNN at D=64 and D=128, 1k-64k causal, with the float64
    # checks at N=2048 and the 64k far rows (step attention: the README's table)
    step tests_ops 170 python3 -m pytest "${PYTEST_ARGS[@]}" tests/ops
    step attention "$1" python3 -m tapa.bench.attention --head-dims 64 128 --causal causal \
        --seq-lens 1024 4096 16384 65536 --reference-len 0 --compile-jobs 8 --out "$WORK/attention"
}

print_defaults() {  # print_defaults: `default_steps`' tables and far rows
    grep -h -B2 -A 12 "^| N | pass" "$WORK/attention/attention.md" | head -60
    grep -h -A 8 "^## Long range" "$WORK/attention/attention.md" | head -10
    tail -3 "$WORK/attention.log"
}
