"""One bf16 causal forward and backward for Nsight Compute (the device scripts' ncu steps):
TAPA's fused kernels under their defaults, or a kernel variant (TAPA_KERNEL_VARIANT's form), or
SDPA-flash, at B=4, N=16k, H=16.

    python3 scripts/ncu_bwd_driver.py tapa 64 [VARIANT]
    python3 scripts/ncu_bwd_driver.py flash 64
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from tapa.ops import tapa_attention
from tapa.ops.tapa import launch as triton_launch

impl, head_dim = sys.argv[1], int(sys.argv[2])
variant = sys.argv[3] if len(sys.argv) > 3 else ""
q, k, v = (torch.randn(4, 16384, 16, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
if impl == "tapa":
    configs = triton_launch.with_variant(
        triton_launch.default_configs(head_dim, head_dim, torch.bfloat16), variant)
    with triton_launch.override_configs(configs):
        out = tapa_attention(q, k, v, impl="triton")
        out.backward(torch.randn_like(out))
else:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
        out.backward(torch.randn_like(out))
torch.cuda.synchronize()
