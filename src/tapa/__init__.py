"""Token-Aware Phase Attention (TAPA, arXiv 2509.12635)."""

__version__ = "0.1.0"

from tapa.ops import tapa_attention, tapa_attention_varlen, tapa_attention_with_kvcache  # noqa: E402

__all__ = ["tapa_attention", "tapa_attention_varlen", "tapa_attention_with_kvcache", "__version__"]
