import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tapa.ops import tapa_attention
impl, d = sys.argv[1], int(sys.argv[2])
q, k, v = (torch.randn(4, 16384, 16, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
if impl == "tapa":
    out = tapa_attention(q, k, v, impl="triton")
else:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
