"""The TAPA operator: argument checks and dispatch between the reference and the fused kernel.

The function itself is defined once, in `tapa.ops.reference`; see its docstring.
"""

from __future__ import annotations

import numbers

import torch

from tapa.ops.reference import (
    DISTANCES,
    PHASES,
    chunked_tapa_attention,
    naive_tapa_attention,
    split_dims,
)

IMPLS = ("auto", "triton", "reference", "naive")
# Below this many logits (batch * heads * Nq * Nk) "auto" off-GPU uses the materialized reference:
# at short lengths it is several times faster than the chunked one and its memory is small.
NAIVE_MAX_LOGITS = 1 << 24


def check_variant(head_dim: int, *, theta, alpha, distance, phase) -> None:
    """Raise ValueError, naming the argument, for TAPA settings the op does not define."""
    if not isinstance(theta, (int, float)) or not 0.0 < theta < 1.0:
        raise ValueError(f"theta must be a float in (0, 1), got {theta!r}")
    amp_dim, phase_dim = split_dims(head_dim, theta)
    if amp_dim == 0 or phase_dim == 0:
        raise ValueError(f"theta={theta} with head_dim={head_dim} leaves an empty "
                         f"{'amplitude' if amp_dim == 0 else 'phase'} part (d_A={amp_dim}, d_P={phase_dim})")
    if not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


def check_args(q, k, v, *, theta, alpha, distance, phase, causal, q_offset, k_offset):
    """Raise ValueError, naming the argument, for anything the op cannot compute correctly."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (batch, seqlen, heads, head_dim), "
                             f"got shape {tuple(t.shape)}")
    if not q.is_floating_point():
        raise ValueError(f"q must be a floating-point tensor, got dtype {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must share a dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"batch size differs: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"k and v seqlen differ: k {k.shape[1]}, v {v.shape[1]}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"head_dim of q ({q.shape[3]}) and k ({k.shape[3]}) differ")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"k and v must have the same number of heads, got {k.shape[2]} and {v.shape[2]}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"heads: q heads ({q.shape[2]}) must be a multiple of kv heads ({k.shape[2]})")
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"seqlen must be positive, got q {q.shape[1]} and k {k.shape[1]}")
    check_variant(q.shape[3], theta=theta, alpha=alpha, distance=distance, phase=phase)
    for name, offset in (("q_offset", q_offset), ("k_offset", k_offset)):
        if not isinstance(offset, numbers.Integral) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"{name} must be a non-negative int, got {offset!r}")
    if causal:
        if q_offset < k_offset:
            raise ValueError(f"causal: the first query (position q_offset={q_offset}) would see no "
                             f"key (first key at k_offset={k_offset})")
        if q.shape[1] > k.shape[1]:  # with q_offset >= k_offset, queries would pass the last key
            raise ValueError(f"causal with more queries ({q.shape[1]}) than keys ({k.shape[1]}): "
                             f"the last queries would sit past the last key")


def _triton_backend():
    """The fused kernel module, or None if triton (or the kernel) is unavailable."""
    try:
        from tapa.ops import triton_attention
    except ImportError:
        return None
    return triton_attention


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
    The function is defined in `tapa.ops.reference`. impl: "auto" (the fused Triton kernel on
    CUDA tensors when available; elsewhere the materialized reference for small problems, below
    NAIVE_MAX_LOGITS logits, and the chunked reference above), "triton", "reference" (chunked)
    or "naive" (materialized logits).
    """
    check_args(q, k, v, theta=theta, alpha=alpha, distance=distance, phase=phase, causal=causal,
               q_offset=q_offset, k_offset=k_offset)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    kwargs = dict(theta=float(theta), alpha=float(alpha), distance=distance, phase=phase,
                  causal=causal, q_offset=int(q_offset), k_offset=int(k_offset), return_lse=return_lse)
    if impl in ("auto", "triton"):
        backend = _triton_backend()
        usable = backend is not None and backend.supports(q, k, v, theta=theta)
        if impl == "triton" and backend is None:
            raise ValueError("impl='triton' but the fused kernel is unavailable "
                             "(pip install 'tapa-attention[triton]')")
        if impl == "triton" or (usable and q.is_cuda):
            return backend.tapa_attention_triton(q, k, v, **kwargs)
    n_logits = q.shape[0] * q.shape[2] * q.shape[1] * k.shape[1]
    if impl == "naive" or (impl == "auto" and n_logits <= NAIVE_MAX_LOGITS):
        return naive_tapa_attention(q, k, v, **kwargs)
    return chunked_tapa_attention(q, k, v, **kwargs)


__all__ = ["tapa_attention", "naive_tapa_attention", "chunked_tapa_attention", "check_args", "check_variant",
           "split_dims", "DISTANCES", "PHASES"]
