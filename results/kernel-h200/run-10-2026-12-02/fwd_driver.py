import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tapa.ops import tapa_attention
impl, d = sys.argv[1], int(sys.argv[2])
q, k, v = (torch.randn(4, 16384, 16, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    if impl == "tapa":
        tapa_attention(q, k, v, impl="triton")
    else:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
torch.cuda.synchronize()
