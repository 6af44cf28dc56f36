"""The model's typed configuration. One name per field, from the command line to the kernel."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tapa._config import from_dict
from tapa.ops import IMPLS, check_variant

# positional encoding -> (family, RoPE method or TAPA phase variant)
PE_CHOICES = {
    "tapa": ("tapa", "quadratic"),
    "tapa-linear-phase": ("tapa", "linear"),
    "rope": ("rope", "rope"),
    "rope-pi": ("rope", "pi"),
    "rope-ntk": ("rope", "ntk"),
    "rope-dynamic-ntk": ("rope", "dynamic-ntk"),
    "rope-yarn": ("rope", "yarn"),
    "nope": ("nope", "none"),
}
PHASE_MATRICES = ("none", "diagonal", "full")


@dataclass
class ModelConfig:
    vocab_size: int = 8192
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads
    ffn_dim: int | None = None  # None: SwiGLU's ~8/3 * dim, rounded up to a multiple of 64
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02
    pe: str = "tapa"
    # RoPE family
    rope_base: float = 10000.0
    rope_scale: float = 1.0  # PI / static NTK / YaRN factor; 1.0 = no scaling
    original_seq_len: int = 2048  # the length the scaling refers to (dynamic NTK, YaRN)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    # TAPA
    theta: float = 0.5
    alpha: float = 0.1
    distance: str = "power"
    phase_init_scale: float = 1.0  # multiplies the phase rows of W_q and W_k at init
    phase_matrix: str = "none"  # learnable N in phi = q_P^T N k_P: none | diagonal | full
    attn_impl: str = "auto"  # tapa_attention(impl=...)

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.ffn_dim is None:
            self.ffn_dim = -(-int(8 * self.dim / 3) // 64) * 64
        self.validate()

    def validate(self) -> None:
        if self.pe not in PE_CHOICES:
            raise ValueError(f"pe must be one of {list(PE_CHOICES)}, got {self.pe!r}")
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                     "original_seq_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.family == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.rope_scale <= 0:
            raise ValueError(f"rope_scale must be > 0, got {self.rope_scale}")
        if self.family == "tapa":
            check_variant(self.head_dim, theta=self.theta, alpha=self.alpha, distance=self.distance,
                          phase=self.phase)
        if self.phase_matrix not in PHASE_MATRICES:
            raise ValueError(f"phase_matrix must be one of {PHASE_MATRICES}, got {self.phase_matrix!r}")
        if self.attn_impl not in IMPLS:
            raise ValueError(f"attn_impl must be one of {IMPLS}, got {self.attn_impl!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def family(self) -> str:
        """"tapa", "rope" or "nope"."""
        return PE_CHOICES[self.pe][0]

    @property
    def phase(self) -> str:
        """TAPA phase variant ("quadratic" or "linear"); meaningful for the tapa family only."""
        return PE_CHOICES[self.pe][1] if self.family == "tapa" else "quadratic"

    @property
    def rope_method(self) -> str:
        """tapa.positional method name ("rope", "pi", ..., "none")."""
        return PE_CHOICES[self.pe][1] if self.family == "rope" else "none"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        return from_dict(cls, values)
