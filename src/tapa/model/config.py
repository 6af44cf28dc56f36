"""The model's typed configuration. One name per field, from the command line to the kernel."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tapa._config import from_dict
from tapa.ops import IMPLS, check_variant
from tapa.positional.kinds import KINDS, get_kind, model_label

# pe -> (family, RoPE method or TAPA phase variant), for callers that index it; the registry
# (tapa.positional.kinds) is the source.
PE_CHOICES = {name: (kind.family, kind.variant) for name, kind in KINDS.items()}
PHASE_MATRICES = ("none", "diagonal", "full")
LAYER_CODES = {"G": "global", "L": "local"}


def _doc(text: str, default=dataclasses.MISSING):
    """A dataclass field whose help sentence reaches `tapa train --help`."""
    return field(default=default, metadata={"help": text})


@dataclass
class ModelConfig:
    vocab_size: int = _doc("Vocabulary size (set from the tokenizer by `tapa train`).", 8192)
    dim: int = _doc("Model width (residual stream size).", 256)
    n_layers: int = _doc("Number of decoder blocks.", 4)
    n_heads: int = _doc("Query heads per layer; head_dim = dim / n_heads.", 4)
    n_kv_heads: int | None = _doc("Key/value heads (GQA); None: same as n_heads.", None)
    ffn_dim: int | None = _doc("SwiGLU hidden size; None: ~8/3 * dim rounded up to a multiple of 64.", None)
    norm_eps: float = _doc("RMSNorm epsilon.", 1e-5)
    tie_embeddings: bool = _doc("Share the input embedding and the output head.", True)
    init_std: float = _doc("Standard deviation of the normal weight init.", 0.02)
    pe: str = _doc("Positional encoding of the global layers (see tapa.positional.kinds).", "tapa")
    layer_pattern: str = _doc(
        "Per-layer attention codes, repeated to n_layers: G = global layer with `pe`, L = local "
        "layer (RoPE inside a causal sliding window of local_window tokens). E.g. LLLG.", "G")
    local_window: int = _doc("Tokens a local layer's query sees: itself and the local_window - 1 "
                             "before it.", 256)
    # RoPE family
    rope_base: float = _doc("RoPE base (global RoPE layers and local layers).", 10000.0)
    rope_scale: float = _doc("PI / static NTK / YaRN factor of global RoPE layers; 1.0 = no scaling.", 1.0)
    original_seq_len: int = _doc("The length RoPE scaling refers to (dynamic NTK, YaRN).", 2048)
    yarn_beta_fast: float = _doc("YaRN: dims rotating more than this many turns are kept.", 32.0)
    yarn_beta_slow: float = _doc("YaRN: dims rotating fewer turns than this are interpolated.", 1.0)
    # TAPA
    theta: float = _doc("TAPA: fraction of head_dim in the amplitude part (d_A = round(theta * D)).", 0.5)
    alpha: float = _doc("TAPA: distance exponent, f(d) = d ** alpha (or alpha * d for linear).", 0.1)
    distance: str = _doc("TAPA distance function: power | linear.", "power")
    phase_init_scale: float = _doc("TAPA: multiplies the phase rows of W_q and W_k at init "
                                   "(0.1 trains far better than 1.0 at small scale).", 0.1)
    phase_matrix: str = _doc("TAPA: learnable N in phi = q_P^T N k_P: none | diagonal | full.", "none")
    attn_impl: str = _doc("TAPA op implementation: auto | triton | reference | naive.", "auto")

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.ffn_dim is None:
            self.ffn_dim = -(-int(8 * self.dim / 3) // 64) * 64
        self.validate()

    def validate(self) -> None:
        get_kind(self.pe)
        if not isinstance(self.layer_pattern, str) or not self.layer_pattern or \
                set(self.layer_pattern) - set(LAYER_CODES):
            raise ValueError(f"layer_pattern must be a non-empty string of the codes {list(LAYER_CODES)} "
                             f"(e.g. 'LLLG'), got {self.layer_pattern!r}")
        if not isinstance(self.local_window, int) or isinstance(self.local_window, bool) or self.local_window < 1:
            raise ValueError(f"local_window must be a positive int, got {self.local_window!r}")
        if "L" in self.layer_pattern and self.head_dim % 2:
            raise ValueError(f"local layers use RoPE, which needs an even head_dim, got {self.head_dim}")
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
    def kind(self):
        """The global layers' `tapa.positional.kinds.PositionalKind`."""
        return get_kind(self.pe)

    @property
    def family(self) -> str:
        """The global layers' family: "tapa", "rope" or "nope"."""
        return self.kind.family

    @property
    def phase(self) -> str:
        """TAPA phase variant ("quadratic" or "linear"); meaningful for the tapa family only."""
        return self.kind.phase

    @property
    def rope_method(self) -> str:
        """The global layers' tapa.positional method name ("rope", "pi", ..., "none")."""
        return self.kind.rope_method

    def layer_kind(self, layer: int) -> str:
        """"global" or "local" for layer `layer` (the pattern repeats over the layers)."""
        return LAYER_CODES[self.layer_pattern[layer % len(self.layer_pattern)]]

    @property
    def is_hybrid(self) -> bool:
        return any(self.layer_kind(i) == "local" for i in range(self.n_layers))

    @property
    def label(self) -> str:
        """The model's name in results, e.g. "TAPA" or "TAPA hybrid (LLLG, w256)"."""
        return model_label(self.pe, self.layer_pattern if self.is_hybrid else "G", self.local_window)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        return from_dict(cls, values)
