"""The model's typed configuration. One name per field, from the command line to the kernel."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from tapa._config import documented, from_dict
from tapa.ops import IMPLS, check_variant
from tapa.positional.kinds import KINDS, get_kind, model_label

# pe -> (family, RoPE method or TAPA phase variant), for callers that index it; the registry
# (tapa.positional.kinds) is the source.
PE_CHOICES = {name: (kind.family, kind.variant) for name, kind in KINDS.items()}
PHASE_MATRICES = ("none", "diagonal", "full")
LAYER_CODES = {"G": "global", "L": "local"}
# the settings of TAPA's function: set away from their default on a model without a global TAPA
# layer, they would be ignored (`ModelConfig.ignored_settings`). Init-only and dispatch settings
# (phase_init_scale, attn_impl) and local_window are left out: the demo sets them for every model.
TAPA_SETTINGS = ("theta", "alpha", "distance", "phase_matrix")


@dataclass
class ModelConfig:
    vocab_size: int = documented(8192, "Vocabulary size (set from the tokenizer by `tapa train`).")
    dim: int = documented(256, "Model width (residual stream size).")
    n_layers: int = documented(4, "Number of decoder blocks.")
    n_heads: int = documented(4, "Query heads per layer.")
    n_kv_heads: int | None = documented(None, "Key/value heads (GQA); None: same as n_heads.")
    head_dim: int | None = documented(None, "Size of each query, key and value head; None: dim / "
                                            "n_heads. Another value is for converted checkpoints "
                                            "whose heads are wider (Qwen3-0.6B: 16 x 128 at dim 1024).")
    ffn_dim: int | None = documented(None, "SwiGLU hidden size; None: ~8/3 * dim rounded up to a "
                                           "multiple of 64.")
    norm_eps: float = documented(1e-5, "RMSNorm epsilon.")
    attention_bias: bool = documented(False, "Biases on the query, key and value projections "
                                             "(Qwen2's layout; `tapa convert` sets it).")
    qk_norm: bool = documented(False, "RMSNorm of each query and key head, with a weight of its own, "
                                      "before the positional encoding (Qwen3's layout; `tapa convert` "
                                      "sets it).")
    tie_embeddings: bool = documented(True, "Share the input embedding and the output head.")
    init_std: float = documented(0.02, "Standard deviation of the normal weight init.")
    pe: str = documented("tapa", "Positional encoding of the global layers (see tapa.positional.kinds).")
    layer_pattern: str = documented("G", "Per-layer attention codes, repeated to n_layers: G = global "
                                    "layer with `pe`, L = local layer (RoPE inside a causal sliding "
                                    "window of local_window tokens). E.g. LLLG.")
    local_window: int = documented(256, "Tokens a local layer's query sees: itself and the "
                                        "local_window - 1 before it.")
    # RoPE family
    rope_base: float = documented(10000.0, "RoPE base (global RoPE layers and local layers).")
    rope_scale: float = documented(1.0, "PI / static NTK / YaRN factor of global RoPE layers; "
                                        "1.0 = no scaling.")
    original_seq_len: int = documented(2048, "The length RoPE scaling refers to (dynamic NTK, YaRN).")
    yarn_beta_fast: float = documented(32.0, "YaRN: dims rotating more than this many turns are kept.")
    yarn_beta_slow: float = documented(1.0, "YaRN: dims rotating fewer turns than this are interpolated.")
    # TAPA
    theta: float = documented(0.5, "TAPA: fraction of head_dim in the amplitude part "
                                   "(d_A = round(theta * D)).")
    alpha: float = documented(0.1, "TAPA: distance exponent, f(d) = d ** alpha (or alpha * d for linear).")
    distance: str = documented("power", "TAPA distance function: power | linear.")
    phase_init_scale: float = documented(0.1, "TAPA: multiplies the phase rows of W_q and W_k at "
                                              "init (0.1 trains far better than 1.0 at small scale).")
    phase_matrix: str = documented("none", "TAPA: learnable N in phi = q_P^T N k_P: none | diagonal | full.")
    attn_impl: str = documented("auto", "TAPA op implementation: auto | triton | reference | naive.")
    # Global layers, every kind
    query_temperature_base: int = documented(0, "Global layers: scale each query at position p by "
                                                "1 + query_temperature_scale * log(1 + floor((p + 1) / "
                                                "base)) (Llama 4's attention temperature; TAPA: its "
                                                "amplitude part). 0: off; set it to the training length.")
    query_temperature_scale: float = documented(0.1, "Global layers: the slope of the query "
                                                     "temperature (with query_temperature_base).")

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None and isinstance(self.dim, int) and isinstance(self.n_heads, int) \
                and self.n_heads > 0:  # else validate names the bad field
            if self.dim % self.n_heads:
                raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}), or "
                                 "head_dim set")
            self.head_dim = self.dim // self.n_heads
        if self.ffn_dim is None:
            self.ffn_dim = -(-int(8 * self.dim / 3) // 64) * 64
        self.validate()

    def validate(self) -> None:
        get_kind(self.pe)
        if not isinstance(self.layer_pattern, str) or not self.layer_pattern or \
                set(self.layer_pattern) - set(LAYER_CODES):
            raise ValueError(f"layer_pattern must be a non-empty string of the codes {list(LAYER_CODES)} "
                             f"(e.g. 'LLLG'), got {self.layer_pattern!r}")
        window = self.local_window
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"local_window must be a positive int, got {self.local_window!r}")
        kinds = [self.layer_kind(i) for i in range(self.n_layers)]
        if "G" in self.layer_pattern and "global" not in kinds:
            raise ValueError(f"layer_pattern {self.layer_pattern!r} over n_layers={self.n_layers} never "
                             f"reaches its global layer (pe={self.pe!r} would be unused); use at most "
                             f"n_layers codes, e.g. {self.layer_pattern[-self.n_layers:]!r}")
        if self.layer_pattern.endswith("G") and kinds[-1] != "global" and "global" in kinds:
            # the pattern repeats from layer 0, so a count it does not divide cuts it mid-way
            layout = "".join("G" if kind == "global" else "L" for kind in kinds)
            warnings.warn(f"layer_pattern {self.layer_pattern!r} repeats from layer 0 over n_layers="
                          f"{self.n_layers}: the layers are {layout}, the last ones local; write all "
                          f"{self.n_layers} codes to choose another layout", stacklevel=3)
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                     "original_seq_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if "L" in self.layer_pattern and self.head_dim % 2:
            raise ValueError(f"local layers use RoPE, which needs an even head_dim, got {self.head_dim}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.family == "rope" and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.rope_scale <= 0:
            raise ValueError(f"rope_scale must be > 0, got {self.rope_scale}")
        if not self.rope_base > 0:  # base ** (-2i / D) is inf or nan otherwise
            raise ValueError(f"rope_base must be > 0, got {self.rope_base!r}")
        if not self.norm_eps >= 0:  # a negative epsilon turns RMSNorm's rsqrt into nan
            raise ValueError(f"norm_eps must be >= 0, got {self.norm_eps!r}")
        if self.family == "tapa":
            check_variant(self.head_dim, theta=self.theta, alpha=self.alpha, distance=self.distance,
                          phase=self.phase)
        if self.phase_matrix not in PHASE_MATRICES:
            raise ValueError(f"phase_matrix must be one of {PHASE_MATRICES}, got {self.phase_matrix!r}")
        base = self.query_temperature_base
        if not isinstance(base, int) or isinstance(base, bool) or base < 0:
            raise ValueError(f"query_temperature_base must be an int >= 0 (0: off), got {base!r}")
        if not (isinstance(self.query_temperature_scale, (int, float))
                and 0 <= self.query_temperature_scale < float("inf")):
            raise ValueError(f"query_temperature_scale must be a finite number >= 0, got "
                             f"{self.query_temperature_scale!r}")
        for name in ("attention_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.attn_impl not in IMPLS:
            raise ValueError(f"attn_impl must be one of {IMPLS}, got {self.attn_impl!r}")
        ignored = self.ignored_settings()
        if ignored:  # a warning, not an error: a config that carries them is still a valid model
            warnings.warn(f"ModelConfig: {', '.join(ignored)} set, but pe={self.pe!r} with "
                          f"layer_pattern={self.layer_pattern!r} over {self.n_layers} layers has no global "
                          "TAPA layer to read them; they are ignored", stacklevel=3)

    def ignored_settings(self) -> list[str]:
        """'name=value' of each TAPA setting changed from its default on a model that has no global
        TAPA layer to read it."""
        if self.has_tapa_layers:
            return []
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        return [f"{name}={getattr(self, name)!r}" for name in TAPA_SETTINGS
                if getattr(self, name) != defaults[name]]

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
    def has_tapa_layers(self) -> bool:
        """Whether some global layer is TAPA (validate refuses a G that never reaches a layer)."""
        return self.family == "tapa" and "G" in self.layer_pattern

    @property
    def label(self) -> str:
        """The model's name in results, e.g. "TAPA" or "TAPA hybrid (LLLG, w256)" (and its query
        temperature, if any: "TAPA hybrid (LLLG, w256, query temperature 512)")."""
        return model_label(self.pe, self.layer_pattern if self.is_hybrid else "G", self.local_window,
                           query_temperature=(self.query_temperature_base, self.query_temperature_scale))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        return from_dict(cls, values)
