"""Operators, one folder each: `tapa.ops.tapa` (TAPA attention: reference, fused kernels, decode,
kernel configs) and `tapa.ops.local` (sliding-window attention). Nothing here imports the rest of
the project."""

from tapa.ops.tapa import (  # noqa: F401
    DISTANCES,
    IMPLS,
    MAX_ALPHA,
    MAX_POSITION,
    PHASES,
    check_args,
    check_variant,
    chunked_tapa_attention,
    naive_tapa_attention,
    split_dims,
    tapa_attention,
    tapa_attention_with_kvcache,
)
from tapa.ops.tapa.varlen import tapa_attention_varlen  # noqa: F401

__all__ = ["tapa_attention", "tapa_attention_varlen", "tapa_attention_with_kvcache", "naive_tapa_attention",
           "chunked_tapa_attention", "check_args", "check_variant", "split_dims", "DISTANCES", "PHASES",
           "IMPLS", "MAX_ALPHA", "MAX_POSITION"]
