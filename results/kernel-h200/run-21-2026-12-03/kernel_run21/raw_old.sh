mkdir -p "/tmp/kernel_run21/raw_old"
for rep in results/kernel-h200/run-16-2026-12-03/kernel_run16/ncu/*.ncu-rep            results/kernel-h200/run-17-2026-12-03/kernel_run17/ncu/*.ncu-rep; do
    ncu --import "$rep" --page raw > "/tmp/kernel_run21/raw_old/$(basename "$rep" .ncu-rep)_raw.txt"
done
