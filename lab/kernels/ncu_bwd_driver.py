"""One bf16 causal forward and backward for Nsight Compute (lab/kernels/ncu_defaults.sh): TAPA's
fused kernels with the config table's row, or with a variant of it (`lab.kernels.variants`' spec),
or SDPA-flash, at B=4, N=16k, H=16. From the repository root:

    PYTHONPATH=src python3 -m lab.kernels.ncu_bwd_driver tapa 64 [VARIANT]
    PYTHONPATH=src python3 -m lab.kernels.ncu_bwd_driver flash 64
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from lab.kernels.variants import variant_configs
from tapa.bench.attention import tapa_kernel

impl, head_dim = sys.argv[1], int(sys.argv[2])
variant = sys.argv[3] if len(sys.argv) > 3 else ""
q, k, v = (torch.randn(4, 16384, 16, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
if impl == "tapa":
    out = tapa_kernel(variant_configs(variant, head_dim) if variant else None)(q, k, v)
    out.backward(torch.randn_like(out))
else:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
        out.backward(torch.randn_like(out))
torch.cuda.synchronize()
