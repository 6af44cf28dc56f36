"""TAPA attention over packed sequences, in FlashAttention's varlen form.

    q (total_q, H, D), k (total_k, Hk, D), v (total_k, Hk, Dv)
    cu_seqlens_q, cu_seqlens_k: int32 (B + 1,), sequence b holds rows cu[b] .. cu[b + 1] - 1

Sequence b is attended on its own: its queries see only its keys. Inside it, query i sits at
position (Lk_b - Lq_b) + i and key j at position j (bottom-right alignment, as FlashAttention:
with fewer queries than keys, the queries are the last Lq_b positions). The logit is the one of
`tapa.ops.tapa.reference`; TAPA depends on |m - n| only, so a packed document needs no position
reset, just the mask.

A query that sees no key (an empty key sequence, or with causal and Lq_b > Lk_b the first
Lq_b - Lk_b queries) gets out = 0 and lse = -inf. (FlashAttention-2 reports +inf there; -inf is
the log of an empty sum and merges correctly by lse.)

Two implementations of the same function live here, beside the fused kernel:
- `naive_tapa_attention_varlen`: every pair of the pack at once, masked to the block diagonal; the
  readable spec, float64-capable, memory O(total_q * total_k).
- `sequence_tapa_attention_varlen`: each sequence through the dense `tapa_attention` (reference or
  fused), one after the other: memory of the longest sequence.
"""

from __future__ import annotations

import numbers

import torch

from tapa.ops.tapa.checks import MAX_POSITION, _check_qkv, check_flag, check_impl, check_variant

MAX_SEQLEN_NAMES = ("max_seqlen_q", "max_seqlen_k")


def _check_cu_seqlens(name: str, cu: torch.Tensor, device) -> None:
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int32 tensor of B + 1 offsets, got "
                         f"{tuple(cu.shape) if isinstance(cu, torch.Tensor) else type(cu).__name__}"
                         f"{' ' + str(cu.dtype) if isinstance(cu, torch.Tensor) else ''}")
    if cu.numel() < 2:
        raise ValueError(f"{name} must hold at least two offsets (one sequence), got {cu.numel()}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device}, q on {device}")


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, theta,
                      alpha, distance, phase, causal, return_lse, check_seqlens=True) -> None:
    """Raise ValueError, naming the argument, for a call `tapa_attention_varlen` cannot compute.
    The offsets' values (a device sync) are checked only with check_seqlens."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must have rank 3 (total, heads, head_dim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    check_flag("check_seqlens", check_seqlens)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must hold the same number of sequences, got "
                         f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1}")
    for name, value in zip(MAX_SEQLEN_NAMES, (max_seqlen_q, max_seqlen_k)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    check_flag("causal", causal)
    check_flag("return_lse", return_lse)
    # shapes, dtypes, devices and heads as the dense op checks them (empty packs included)
    _check_qkv(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
    check_variant(q.shape[-1], theta=theta, alpha=alpha, distance=distance, phase=phase)
    if not check_seqlens:
        return
    for name, cu, total, longest in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                     ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)):
        offsets = cu.tolist()
        if offsets[0] != 0 or offsets[-1] != total:
            raise ValueError(f"{name} must start at 0 and end at the total rows ({total}), got "
                             f"{offsets[0]} .. {offsets[-1]}")
        lengths = [b - a for a, b in zip(offsets, offsets[1:])]
        if min(lengths) < 0:
            raise ValueError(f"{name} must be non-decreasing, got {offsets}")
        if max(lengths) >= MAX_POSITION:
            raise ValueError(f"{name}: a sequence of {max(lengths)} rows passes the kernels' "
                             f"position limit ({MAX_POSITION})")
        if max(lengths) > longest:
            raise ValueError(f"{MAX_SEQLEN_NAMES[name == 'cu_seqlens_k']} ({longest}) is below the "
                             f"longest sequence in {name} ({max(lengths)})")


def varlen_positions(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int,
                     total_k: int):
    """(doc_q, pos_q, doc_k, pos_k), int64: each row's sequence and its position inside it, the
    queries aligned bottom-right (query i of sequence b at Lk_b - Lq_b + i)."""
    device = cu_seqlens_q.device
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    rows_q = torch.arange(total_q, device=device)
    rows_k = torch.arange(total_k, device=device)
    doc_q = torch.searchsorted(cu_q[1:], rows_q, right=True)
    doc_k = torch.searchsorted(cu_k[1:], rows_k, right=True)
    len_q, len_k = cu_q.diff(), cu_k.diff()
    pos_q = rows_q - cu_q[doc_q] + (len_k - len_q)[doc_q]
    pos_k = rows_k - cu_k[doc_k]
    return doc_q, pos_q, doc_k, pos_k


def naive_tapa_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                                max_seqlen_k=None, *, theta=0.5, alpha=0.1, distance="power",
                                phase="quadratic", causal=True, return_lse=False):
    """The varlen spec: all total_q x total_k logits, masked to each sequence (and causally)."""
    from tapa.ops.tapa.reference import _compute_dtype, split_dims, tapa_logits

    del max_seqlen_q, max_seqlen_k  # the offsets say everything
    total_q, heads, _ = q.shape
    kv_heads = k.shape[1]
    amp_dim, _ = split_dims(q.shape[-1], theta)
    cdt = _compute_dtype(q.dtype)
    doc_q, pos_q, doc_k, pos_k = varlen_positions(cu_seqlens_q, cu_seqlens_k, total_q, k.shape[0])
    # (Hk, G, total_q, D) queries against (Hk, 1, total_k, D) keys
    qg = q.to(cdt).view(total_q, kv_heads, heads // kv_heads, -1).permute(1, 2, 0, 3)
    kg = k.to(cdt).permute(1, 0, 2).unsqueeze(1)
    vg = v.to(cdt).permute(1, 0, 2).unsqueeze(1)
    logits = tapa_logits(qg, kg, pos_q, pos_k, amp_dim=amp_dim, alpha=alpha, distance=distance,
                         phase=phase)
    visible = doc_q[:, None] == doc_k[None, :]
    if causal:
        visible = visible & (pos_k[None, :] <= pos_q[:, None])
    logits = logits.masked_fill(~visible, float("-inf"))
    # a row that sees no key: out 0, lse -inf, and gradients 0 (never inf * 0)
    row_max = logits.detach().amax(-1, keepdim=True)
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    probs = torch.exp(logits - row_max)
    row_sum = probs.sum(-1)
    seen = row_sum > 0
    safe_sum = torch.where(seen, row_sum, torch.ones_like(row_sum))
    out = (probs @ vg) / safe_sum[..., None]
    lse = torch.where(seen, row_max.squeeze(-1) + torch.log(safe_sum),
                      torch.full_like(row_sum, float("-inf")))
    out = out.permute(2, 0, 1, 3).reshape(total_q, heads, -1).to(q.dtype)
    lse = lse.reshape(heads, total_q)
    lse = lse if lse.dtype == torch.float64 else lse.float()
    return (out, lse) if return_lse else out


def sequence_tapa_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                                   max_seqlen_k=None, *, theta=0.5, alpha=0.1, distance="power",
                                   phase="quadratic", causal=True, return_lse=False, impl="auto"):
    """Each sequence through the dense op (`impl` as `tapa_attention` takes it), one at a time."""
    from tapa.ops.tapa import tapa_attention

    del max_seqlen_q, max_seqlen_k
    total_q, heads, _ = q.shape
    out = q.new_zeros(total_q, heads, v.shape[-1])
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.full((heads, total_q), float("-inf"), dtype=lse_dtype, device=q.device)
    outs, lses, rows = [], [], []
    offsets = zip(cu_seqlens_q.tolist(), cu_seqlens_q[1:].tolist(), cu_seqlens_k.tolist(),
                  cu_seqlens_k[1:].tolist())
    for q_start, q_end, k_start, k_end in offsets:
        len_q, len_k = q_end - q_start, k_end - k_start
        # queries before the first key see nothing under causal alignment: they keep 0 / -inf
        first = q_start + (max(len_q - len_k, 0) if causal else 0)
        if first >= q_end or len_k == 0:
            continue
        shift = len_k - len_q  # query i at position shift + i
        q_offset, k_offset = max(shift + (first - q_start), 0), max(-(shift + (first - q_start)), 0)
        seq_out, seq_lse = tapa_attention(
            q[first:q_end].unsqueeze(0), k[k_start:k_end].unsqueeze(0),
            v[k_start:k_end].unsqueeze(0), theta=theta, alpha=alpha, distance=distance,
            phase=phase, causal=causal, q_offset=q_offset, k_offset=k_offset, return_lse=True,
            impl=impl)
        outs.append(seq_out[0])
        lses.append(seq_lse[0])
        rows.append((first, q_end))
    if outs:  # one scatter, so that autograd sees a single out-of-place write per tensor
        index = torch.cat([torch.arange(a, b, device=q.device) for a, b in rows])
        out = out.index_copy(0, index, torch.cat(outs).to(out.dtype))
        lse = lse.index_copy(1, index, torch.cat(lses, dim=1).to(lse.dtype))
    return (out, lse) if return_lse else out


def tapa_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                          causal=True, theta=0.5, alpha=0.1, distance="power", phase="quadratic",
                          return_lse=False, impl="auto", check_seqlens=True):
    """Token-Aware Phase Attention over packed sequences, as `flash_attn_varlen_func` takes them.

    q (total_q, H, D), k (total_k, Hk, D), v (total_k, Hk, Dv); cu_seqlens_q/k int32 (B + 1,) on
    q's device; max_seqlen_q/k at least the longest sequence. Returns out (total_q, H, Dv) in q's
    dtype, and with return_lse also lse (H, total_q) float32. See the module docstring for the
    alignment and for queries that see no key. impl: "auto" (the fused kernel on CUDA when
    available, else the reference), "triton", "reference" (each sequence through the chunked
    reference) or "naive" (the whole pack's logits at once). check_seqlens=False skips the value
    checks of the offsets, a device sync, for callers that built them.
    """
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, theta=theta,
                      alpha=alpha, distance=distance, phase=phase, causal=causal,
                      return_lse=return_lse, check_seqlens=check_seqlens)
    check_impl(impl)
    kwargs = dict(theta=float(theta), alpha=float(alpha), distance=distance, phase=phase,
                  causal=causal, return_lse=return_lse)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))
    if impl == "naive":
        return naive_tapa_attention_varlen(*args, **kwargs)
    from tapa.ops.tapa import fused_backend

    backend = fused_backend(impl, q, k, v, theta)
    if backend is not None:
        return backend.tapa_attention_varlen_triton(*args, **kwargs)
    return sequence_tapa_attention_varlen(*args, impl="reference", **kwargs)
