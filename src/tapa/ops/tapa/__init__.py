"""The TAPA operator: dispatch between the reference and the fused kernel.

The function itself is defined once, in `tapa.ops.tapa.reference`; see its docstring. Argument checks
live in `tapa.ops.tapa.checks`; decoding against a KV cache, `tapa_attention_with_kvcache`, in
`tapa.ops.tapa.decode`.
"""

from __future__ import annotations

import torch

from tapa.ops.tapa.checks import (
    IMPLS,
    MAX_ALPHA,
    MAX_POSITION,
    check_args,
    check_impl,
    check_triton_device,
    check_variant,
)
from tapa.ops.tapa.decode import tapa_attention_with_kvcache
from tapa.ops.tapa.reference import (
    DISTANCES,
    PHASES,
    chunked_tapa_attention,
    naive_tapa_attention,
    split_dims,
)

# Below this many logits (batch * heads * Nq * Nk) "auto" off-GPU uses the materialized reference:
# at short lengths it is several times faster than the chunked one and its memory is small.
NAIVE_MAX_LOGITS = 1 << 24


def _triton_backend():
    """The fused kernel module, or None if triton (or the kernel) is unavailable."""
    try:
        from tapa.ops.tapa import fused
    except ImportError:
        return None
    return fused


def fused_backend(impl: str, q, k, v, theta: float):
    """The fused kernel module if `impl` takes it, else None: impl="triton" always (a ValueError
    when it is unavailable or the device cannot run it), "auto" on CUDA tensors it supports."""
    if impl not in ("auto", "triton"):
        return None
    backend = _triton_backend()
    if impl == "triton":
        if backend is None:
            raise ValueError("impl='triton' but the fused kernel is unavailable "
                             "(pip install 'tapa-attention[triton]')")
        check_triton_device(q.device, backend.interpreting())
        return backend
    if q.is_cuda and backend is not None and backend.supports(q, k, v, theta=theta):
        return backend
    return None


def tapa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    theta: float = 0.5,
    alpha: float = 0.1,
    distance: str = "power",
    phase: str = "quadratic",
    causal: bool = True,
    q_offset: int = 0,
    k_offset: int = 0,
    return_lse: bool = False,
    impl: str = "auto",
):
    """Token-Aware Phase Attention. q (B, Nq, H, D), k (B, Nk, Hk, D), v (B, Nk, Hk, Dv).

    Returns out (B, Nq, H, Dv) in q's dtype, and with return_lse also lse (B, H, Nq) in float32.
    The function is defined in `tapa.ops.tapa.reference`. impl: "auto" (the fused Triton kernel on
    CUDA tensors when available; elsewhere the materialized reference for small problems, below
    NAIVE_MAX_LOGITS logits, and the chunked reference above), "triton", "reference" (chunked)
    or "naive" (materialized logits). alpha is bounded (MAX_ALPHA: 4 for "power") so that the
    phase stays finite in float32 at every position up to MAX_POSITION; see `tapa.ops.tapa.checks`.
    """
    check_args(q, k, v, theta=theta, alpha=alpha, distance=distance, phase=phase, causal=causal,
               q_offset=q_offset, k_offset=k_offset, return_lse=return_lse)
    check_impl(impl)
    kwargs = dict(theta=float(theta), alpha=float(alpha), distance=distance, phase=phase,
                  causal=causal, q_offset=int(q_offset), k_offset=int(k_offset), return_lse=return_lse)
    backend = fused_backend(impl, q, k, v, theta)
    if backend is not None:
        return backend.tapa_attention_triton(q, k, v, **kwargs)
    n_logits = q.shape[0] * q.shape[2] * q.shape[1] * k.shape[1]
    if impl == "naive" or (impl == "auto" and n_logits <= NAIVE_MAX_LOGITS):
        return naive_tapa_attention(q, k, v, **kwargs)
    return chunked_tapa_attention(q, k, v, **kwargs)


__all__ = ["tapa_attention", "tapa_attention_with_kvcache", "naive_tapa_attention",
           "chunked_tapa_attention", "check_args", "check_variant", "split_dims", "DISTANCES", "PHASES",
           "IMPLS", "MAX_ALPHA", "MAX_POSITION"]
