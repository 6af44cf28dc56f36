"""Before a study call trains: are the fused kernels right on this GPU, at the study's shapes?

The training kernels' defaults change between calls (results/kernel-h200); a wrong kernel would
cost a whole call of training before any number showed it. This checks the fused TAPA op,
forward and backward, at the toy model's head shape (4 heads, head_dim 128, bf16, causal) at a
ragged length and at the continual stage's 2048, against the float64 reference: the bar of
issue 13, the kernel's relative RMSE at most 1.5x the same-dtype reference's, for out and every
gradient. run.py runs it after the data build on a CUDA protocol and starts no group if it fails
(its time counts in the call's budget). About 20 s, most of it compiling kernels the training
then finds in the Triton cache. Alone:

    PYTHONPATH=src python3 -m lab.study.preflight
"""

from __future__ import annotations

import sys

LENGTHS = (509, 2048)


def kernel_defaults() -> dict | None:
    """The fused kernels' launch defaults this process trains with, bf16 at head dims 128 and 64
    (one line of every choice), so a job records which kernel version trained it; None without
    triton. Reads the config table (`tapa.ops.tapa.configs`) where the library has one, else the
    launcher's defaults (`launch.default_configs`, before the table)."""
    import torch

    try:
        from tapa.ops.tapa import launch as triton_launch
    except ImportError:
        return None
    try:
        from tapa.ops.tapa.configs import lookup
    except ImportError:
        return {str(d): triton_launch.describe(triton_launch.default_configs(d, d, torch.bfloat16))
                for d in (128, 64)}
    return {str(d): lookup(triton_launch.arch_class(), torch.bfloat16, d).describe() for d in (128, 64)}


def main(log=print) -> int:
    """0 when every check passes (or there is no GPU to check), else 1; `log` gets each line."""
    import torch

    if not torch.cuda.is_available():
        log("preflight: no CUDA GPU, nothing to check")
        return 0
    from tapa.bench.attention import accuracy_errors
    from lab.kernels.attention_variants import BAR, GATED  # issue 13's bar, on out and every gradient

    log(f"preflight: kernel defaults (bf16, by head dim): {kernel_defaults()}")
    failed = []
    for n in LENGTHS:
        try:
            rows = accuracy_errors(n, 128, causal=True, heads=4, kv_heads=4)
        except Exception as err:  # noqa: BLE001 - a kernel that does not compile or run fails too
            log(f"preflight: N={n}: {type(err).__name__}: {' '.join(str(err).split())[:300]}")
            failed.append(f"N={n} ({type(err).__name__})")
            continue
        for row in rows:
            if row["tensor"] not in GATED:  # lse: float32 for every input dtype, no half-precision bar
                continue
            ok = row["ratio"] <= BAR
            log(f"preflight: {row['check']} {row['tensor']}: kernel {row['kernel']:.3e}, reference "
                  f"{row['reference']:.3e}, ratio {row['ratio']:.2f} {'ok' if ok else 'FAILED'}")
            if not ok:
                failed.append(f"{row['check']} {row['tensor']}")
    torch.cuda.empty_cache()  # the float64 reference's memory, before the workers start
    if failed:
        log(f"preflight: FAILED ({len(failed)}): the fused kernels miss the {BAR}x bar; not training")
        return 1
    log("preflight: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
