# Debug: NaN in the fused forward at linear distance, alpha = MAX_ALPHA (GPU only)
import os, sys, torch
sys.path.insert(0, "tests/ops")
from tapa.ops import tapa_attention, MAX_ALPHA
from tapa.ops.reference import naive_tapa_attention
DEV = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator().manual_seed(12)
q, k, v = (torch.randn(1, 21, h, 32, generator=gen) for h in (2, 1, 1))
q, k, v = (t.to(DEV) for t in (q, k, v))
for alpha in (MAX_ALPHA["linear"], 2.0**60, 2.0**40, 2.0**20, 1e3):
    out = tapa_attention(q, k, v, alpha=alpha, distance="linear", causal=True, impl="triton")
    ref = naive_tapa_attention(q.double(), k.double(), v.double(), alpha=alpha, distance="linear", causal=True)
    bad = torch.isnan(out).any(-1)[0]  # (N, H)
    print(f"{os.environ.get('TAPA_KERNEL_VARIANT', 'default')} alpha=2**{torch.tensor(alpha).log2().item():.1f}: "
          f"nan rows {bad.nonzero().tolist()[:12]} err {((out.double()-ref).nan_to_num(9).norm()/ref.norm()).item():.2e}")
