"""The NaN probe of the H200 run of 2026-12-01 (results/kernel-h200/NOTES.md, Run 3): the fused
forward at distance="linear" and alpha from MAX_ALPHA down, float32, against the float64 reference;
prints the (row, head) pairs with NaN outputs and the relative error. Run on the GPU, under each
kernel variant of interest:  TAPA_KERNEL_VARIANT=trig_poly=0 PYTHONPATH=src python3 scripts/dev_nan_debug.py
"""
import os

import torch

from tapa.ops import MAX_ALPHA, tapa_attention
from tapa.ops.tapa.reference import naive_tapa_attention

DEV = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator().manual_seed(12)
q, k, v = (torch.randn(1, 21, h, 32, generator=gen).to(DEV) for h in (2, 1, 1))
for alpha in (MAX_ALPHA["linear"], 2.0**60, 2.0**40, 2.0**20, 1e3):
    out = tapa_attention(q, k, v, alpha=alpha, distance="linear", causal=True, impl="triton")
    ref = naive_tapa_attention(q.double(), k.double(), v.double(), alpha=alpha, distance="linear", causal=True)
    bad = torch.isnan(out).any(-1)[0]  # (N, H)
    error = ((out.double() - ref).nan_to_num(9).norm() / ref.norm()).item()
    print(f"{os.environ.get('TAPA_KERNEL_VARIANT', 'default')} alpha=2**{torch.tensor(alpha).log2().item():.1f}: "
          f"nan rows {bad.nonzero().tolist()[:12]} err {error:.2e}")
