"""Causal sliding-window attention (the model's local RoPE layers); see `tapa.ops.local.window`."""

from tapa.ops.local.window import (  # noqa: F401
    IMPLS,
    chunked_local_attention,
    check_local_arguments,
    default_block_size,
    dense_local_attention,
    document_starts,
    local_attention,
    window_block_mask,
)

__all__ = ["local_attention", "dense_local_attention", "chunked_local_attention",
           "check_local_arguments", "document_starts", "default_block_size", "window_block_mask", "IMPLS"]
