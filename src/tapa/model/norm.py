"""RMSNorm: the decoder's pre-norms and, with `ModelConfig.qk_norm`, each query and key head's."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) over the last dim, computed in float32 (as transformers' Llama computes it, also
    for float64 x), cast back, then times a learned weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight
