mkdir -p "$WORK/ncu"
for n in 4096 65536; do
    ncu --clock-control none --kernel-name regex:_bwd_dkdv_kernel --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
        -f -o "$WORK/ncu/dkdv_$n" python3 "$WORK/dkdv_driver.py" "$n" &&
        ncu --import "$WORK/ncu/dkdv_$n.ncu-rep" --page details > "$WORK/ncu/dkdv_${n}_details.txt"
done
