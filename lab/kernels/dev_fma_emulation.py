"""The float32 emulation behind the long-phase NaN's diagnosis (results/kernel-h200/NOTES.md, Run 3).

It runs on the CPU with numpy and needs no GPU. The turn reduction r = t - round(t), t = phi * fs,
is computed two ways. One rounds t first (what the source says). The other follows the sm_90 PTX
that Triton's FP fusion produced: fma(phi, fs, M), then - M, then fma(phi, fs, -R2), then the
second (LONG_PHASE) reduction. The script counts the scores where |r| > 1/2, which the
polynomial cos/sin overflows on. fs = d * alpha / 4 (d_P = 16), d = 1..20, 2,000 random phi each.

    python3 lab/kernels/dev_fma_emulation.py
"""
import numpy as np

f32 = np.float32
MAGIC = f32(12582912.0)  # 1.5 * 2**23, the kernels' ROUND_MAGIC


def reduce_twice(r1):
    return f32(r1 - f32(f32(r1 + MAGIC) - MAGIC))


def fused(phi, fs):
    exact = np.float64(phi) * np.float64(fs)  # a float32 x float32 product is exact in float64
    r1 = f32(exact - np.float64(f32(f32(exact + np.float64(MAGIC)) - MAGIC)))
    return reduce_twice(r1)


def rounded(phi, fs):
    t = f32(f32(phi) * f32(fs))
    return reduce_twice(f32(t - f32(f32(t + MAGIC) - MAGIC)))


rng = np.random.default_rng(0)
for alpha in (2.0**72, 2.0**60):
    bad_fused = bad_rounded = total = 0
    for d in range(1, 21):
        fs = f32(d * f32(alpha * 0.25))
        for phi in rng.standard_normal(2000).astype(np.float32) * 4:
            total += 1
            bad_fused += abs(fused(phi, fs)) > 0.5
            bad_rounded += abs(rounded(phi, fs)) > 0.5
    print(f"alpha 2**{np.log2(alpha):.0f}: |r| > 1/2 in {bad_fused}/{total} scores with the fused "
          f"product, {bad_rounded}/{total} with t rounded first")
