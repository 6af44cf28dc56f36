import sys
import torch
from tapa.ops import tapa_attention
n = int(sys.argv[1])
q, k, v = (torch.randn(65536 // n, n, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
tapa_attention(q, k, v, impl="triton").backward(torch.randn_like(q))
torch.cuda.synchronize()
