"""TAPA attention against a KV cache, in the style of FlashAttention's `flash_attn_with_kvcache`.

    q        (B, Nq, H, D)   the last Nq tokens of every sequence
    k_cache  (B, L, Hk, D)   preallocated buffers; for sequence b the first cache_seqlens[b] slots
    v_cache  (B, L, Hk, Dv)  are valid, the Nq new tokens' keys and values already written in
    cache_leftpad[b]         optional: leading slots to hide (left padding), default 0

Sequence b's real tokens occupy slots [cache_leftpad[b], cache_seqlens[b]) at positions 0, 1, ...:
query t is the token at slot cache_seqlens[b] - Nq + t and attends causally to the keys up to its
own slot. Slots outside [cache_leftpad[b], cache_seqlens[b]) are never read, so they may hold
anything. `cache_leftpad` is FlashAttention's name; `cache_starts`, this op's name before, is a
deprecated alias for one release. The function computed is the one `tapa.ops.tapa.reference` defines.

Dispatch: the split-KV Triton kernel (`tapa.ops.tapa.decode_kernel`) on CUDA when it takes the shapes
(at most 64 query rows per kv head: Nq * H / Hk) and no gradient is needed (it has no backward);
otherwise `tapa_attention` on each sequence's valid slice, which is exact and differentiable.
"""

from __future__ import annotations

import functools
import warnings

import torch

from tapa.ops.tapa.checks import (
    check_cache_lengths,
    check_impl,
    check_kvcache_args,
    check_triton_device,
)


@functools.cache
def _decode_kernel():
    """The split-KV decode kernel's module, or None without triton (looked up once: this runs at
    every decoding step)."""
    try:
        from tapa.ops.tapa import decode_kernel
    except ImportError:
        return None
    return decode_kernel


def decode_kernel_applies(q, k_cache, v_cache, impl: str = "auto") -> bool:
    """Whether the split-KV kernel computes this call: impl "auto" on CUDA, or "triton" (on CPU
    through Triton's interpreter), for shapes it supports (few query rows per kv head) and with
    no gradient needed (it has no backward)."""
    kernel = _decode_kernel() if impl in ("auto", "triton") else None
    if kernel is None or not kernel.supports(q, k_cache, v_cache):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        return False
    return impl == "triton" or q.is_cuda


def _per_sequence(q, k_cache, v_cache, cache_seqlens, cache_starts, *, impl, **op_args):
    """`tapa_attention` on each sequence's valid slots; one batched call when all spans agree."""
    from tapa.ops import tapa_attention

    batch, q_len = q.shape[:2]
    stops = cache_seqlens.tolist()
    starts = cache_starts.tolist() if cache_starts is not None else [0] * batch
    if len(set(zip(starts, stops))) == 1:
        groups = [(slice(None), starts[0], stops[0])]
    else:
        groups = [(slice(b, b + 1), starts[b], stops[b]) for b in range(batch)]
    outs, lses = [], []
    for rows, start, stop in groups:
        out, lse = tapa_attention(q[rows], k_cache[rows, start:stop], v_cache[rows, start:stop], causal=True,
                                  q_offset=stop - q_len - start, k_offset=0, impl=impl, return_lse=True,
                                  **op_args)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def tapa_attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | int,
    *,
    cache_leftpad: torch.Tensor | None = None,
    theta: float = 0.5,
    alpha: float = 0.1,
    distance: str = "power",
    phase: str = "quadratic",
    impl: str = "auto",
    return_lse: bool = False,
    check_lengths: bool = True,
    cache_starts: torch.Tensor | None = None,
):
    """TAPA attention of the last Nq tokens of each sequence against its KV cache (module docstring).

    cache_seqlens: an int (every sequence) or an int32 tensor (B,); cache_leftpad: int32 (B,) or
    None (cache_starts: its deprecated old name).
    impl: "auto" (the decode kernel on CUDA where it applies, else per-sequence `tapa_attention`),
    "triton" (the decode kernel, an error where it does not apply), "reference" or "naive" (passed
    on to `tapa_attention`). Returns out (B, Nq, H, Dv) in q's dtype, and with return_lse also
    lse (B, H, Nq) (float32; float64 for float64 inputs). check_lengths=False skips the value checks
    of the lengths on the decode kernel's path, where they would cost a device sync; the
    per-sequence path reads the lengths anyway and always checks them.
    """
    if cache_starts is not None:
        if cache_leftpad is not None:
            raise ValueError("pass cache_leftpad only (cache_starts is its deprecated old name)")
        warnings.warn("tapa_attention_with_kvcache: cache_starts is deprecated, pass cache_leftpad "
                      "(FlashAttention's name)", DeprecationWarning, stacklevel=2)
        cache_leftpad = cache_starts
    cache_starts = cache_leftpad  # the decode kernel's own name
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool) and isinstance(q, torch.Tensor):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    op_args = dict(theta=theta, alpha=alpha, distance=distance, phase=phase)
    check_kvcache_args(q, k_cache, v_cache, cache_seqlens, cache_starts, return_lse=return_lse,
                       check_lengths=check_lengths, **op_args)
    check_impl(impl)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache))
    kernel = _decode_kernel() if impl in ("auto", "triton") else None
    if impl == "triton":
        if kernel is None:
            raise ValueError("impl='triton' but the decode kernel is unavailable "
                             "(pip install 'tapa-attention[triton]')")
        check_triton_device(q.device, kernel.interpreting())
        if needs_grad:
            raise ValueError("impl='triton': the decode kernel has no backward pass; "
                             "use impl='auto' or 'reference' when gradients are needed")
    use_kernel = impl == "triton" or decode_kernel_applies(q, k_cache, v_cache, impl)
    if check_lengths or not use_kernel:
        # the per-sequence path reads the lengths on the host anyway, so it always checks them:
        # unchecked, a length past the capacity would be cut short by slicing, a silent wrong result
        check_cache_lengths(q.shape[1], k_cache.shape[1], cache_seqlens, cache_starts)
    if use_kernel:
        result = kernel.tapa_decode_attention(q, k_cache, v_cache, cache_seqlens, cache_starts=cache_starts,
                                              return_lse=True, check_lengths=False, **op_args)
    else:
        result = _per_sequence(q, k_cache, v_cache, cache_seqlens, cache_starts, impl=impl, **op_args)
    return result if return_lse else result[0]
