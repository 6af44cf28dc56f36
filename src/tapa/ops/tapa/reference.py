"""The reference TAPA operator: the single definition of Token-Aware Phase Attention.

For a head vector of size D split into an amplitude part (first d_A = round(theta * D) dims)
and a phase part (the remaining d_P = D - d_A dims), query position m and key position n:

    logit[m, n] = (q_A . k_A) / sqrt(d_A) * cos(2 * pi * f(|m - n|) * phi(q, k))
    phi(q, k)   = (q_P . k_P) / sqrt(d_P)                  phase="quadratic" (paper Eq. 12)
                = (sum(q_P) + sum(k_P)) / sqrt(d_P)        phase="linear"    (paper Eq. 16)
    f(d)        = d ** alpha                               distance="power"
                = alpha * d                                distance="linear"
    out[m]      = sum_n softmax_n(logit[m, n]) * v[n]      causal: only n <= m

Positions are m = q_offset + i and n = k_offset + j. There is no other softmax scale.
The phase argument t = f * phi is reduced in turns, t - round(t), before the cosine, so that
float32 keeps its precision when t reaches hundreds of turns at long range.

Two implementations of the same function live here:
- `naive_tapa_attention` materializes the (Nq, Nk) logits: the readable spec, float64-capable.
- `chunked_tapa_attention` runs an online softmax over query x key blocks and never holds an
  Nq x Nk matrix; under autograd each query block is recomputed in the backward pass
  (activation checkpointing), so memory stays bounded by one block row.

Layout is (batch, seqlen, heads, head_dim). k and v may have fewer heads than q (GQA/MQA);
query heads are grouped onto their kv head by a reshape, never by repeating k and v.
Half-precision inputs are computed in float32 and the output is cast back to the input dtype;
float64 inputs are computed in float64. `lse` is float32 (float64 for float64 inputs) with
shape (batch, heads, Nq).

These functions do not validate their arguments; `tapa.ops.tapa_attention` does.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

DISTANCES = ("power", "linear")
PHASES = ("quadratic", "linear")


def split_dims(head_dim: int, theta: float) -> tuple[int, int]:
    """(d_A, d_P): the amplitude part is the first round(theta * head_dim) dims (half up)."""
    amp_dim = int(math.floor(theta * head_dim + 0.5))
    return amp_dim, head_dim - amp_dim


def distance_weight(dist: torch.Tensor, alpha: float, distance: str) -> torch.Tensor:
    """f(|m - n|): d ** alpha ("power", f(0) = 0) or alpha * d ("linear")."""
    if distance == "power":
        return dist.pow(alpha)
    return dist * alpha


def tapa_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    *,
    amp_dim: int,
    alpha: float,
    distance: str,
    phase: str,
) -> torch.Tensor:
    """TAPA logits for q (..., Nq, D) against k (..., Nk, D) at positions q_pos (Nq,), k_pos (Nk,).

    Returns (..., Nq, Nk), broadcasting the leading dims of q and k.
    """
    phase_dim = q.shape[-1] - amp_dim
    amplitude = (q[..., :amp_dim] @ k[..., :amp_dim].transpose(-1, -2)) / math.sqrt(amp_dim)
    q_phase, k_phase = q[..., amp_dim:], k[..., amp_dim:]
    if phase == "quadratic":
        phi = (q_phase @ k_phase.transpose(-1, -2)) / math.sqrt(phase_dim)
    else:
        phi = (q_phase.sum(-1)[..., :, None] + k_phase.sum(-1)[..., None, :]) / math.sqrt(phase_dim)
    dist = (q_pos[:, None] - k_pos[None, :]).abs().to(q.dtype)
    turns = distance_weight(dist, alpha, distance) * phi
    turns = turns - torch.round(turns)  # round() has zero gradient, so d(turns) passes through
    return amplitude * torch.cos(2 * math.pi * turns)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """(B, N, H, D) -> q (B, Hk, G, Nq, D), k/v (B, Hk, 1, Nk, D), upcast to the compute dtype."""
    batch, q_len, heads, _ = q.shape
    kv_heads = k.shape[2]
    cdt = _compute_dtype(q.dtype)
    qg = q.to(cdt).reshape(batch, q_len, kv_heads, heads // kv_heads, -1).permute(0, 2, 3, 1, 4)
    kg = k.to(cdt).permute(0, 2, 1, 3).unsqueeze(2)
    vg = v.to(cdt).permute(0, 2, 1, 3).unsqueeze(2)
    return qg, kg, vg


def _ungroup(out: torch.Tensor, lse: torch.Tensor, dtype: torch.dtype):
    """out (B, Hk, G, Nq, Dv) -> (B, Nq, H, Dv) in dtype; lse (B, Hk, G, Nq) -> (B, H, Nq)."""
    batch, kv_heads, group, q_len, v_dim = out.shape
    out = out.permute(0, 3, 1, 2, 4).reshape(batch, q_len, kv_heads * group, v_dim).to(dtype)
    lse = lse.reshape(batch, kv_heads * group, q_len)
    if lse.dtype != torch.float64:
        lse = lse.float()
    return out, lse


def _positions(length: int, offset: int, device) -> torch.Tensor:
    return torch.arange(offset, offset + length, device=device, dtype=torch.int64)


def naive_tapa_attention(
    q, k, v, *, theta=0.5, alpha=0.1, distance="power", phase="quadratic", causal=True,
    q_offset=0, k_offset=0, return_lse=False,
):
    """TAPA attention with the full logit matrix materialized. See the module docstring."""
    amp_dim, _ = split_dims(q.shape[-1], theta)
    qg, kg, vg = _grouped(q, k, v)
    q_pos = _positions(q.shape[1], q_offset, q.device)
    k_pos = _positions(k.shape[1], k_offset, q.device)
    logits = tapa_logits(qg, kg, q_pos, k_pos, amp_dim=amp_dim, alpha=alpha, distance=distance,
                         phase=phase)
    if causal:
        logits = logits.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.softmax(logits, dim=-1) @ vg
    out, lse = _ungroup(out, lse, q.dtype)
    return (out, lse) if return_lse else out


def _attend_query_block(qg, kg, vg, q_pos, k_pos, amp_dim, alpha, distance, phase, causal,
                        block_k):
    """Online softmax of one query block against all visible key blocks.

    Returns out (B, Hk, G, bq, Dv) and lse (B, Hk, G, bq).
    """
    shape = qg.shape[:-1]
    row_max = qg.new_full(shape, float("-inf"))
    row_sum = qg.new_zeros(shape)
    acc = qg.new_zeros(*shape, vg.shape[-1])
    last_visible = int(q_pos[-1]) if causal else None
    for start in range(0, kg.shape[-2], block_k):
        if causal and int(k_pos[start]) > last_visible:
            break  # this and every later key block lies entirely in the future
        stop = start + block_k
        kp = k_pos[start:stop]
        logits = tapa_logits(qg, kg[..., start:stop, :], q_pos, kp, amp_dim=amp_dim, alpha=alpha,
                             distance=distance, phase=phase)
        if causal and int(kp[-1]) > int(q_pos[0]):
            logits = logits.masked_fill(kp[None, :] > q_pos[:, None], float("-inf"))
        # the result does not depend on the shift, so it carries no gradient
        new_max = torch.maximum(row_max, logits.detach().amax(-1))
        # rows with no visible key yet keep max -inf; shift by 0 there to avoid inf - inf
        safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        rescale = torch.exp(row_max - safe_max)
        probs = torch.exp(logits - safe_max[..., None])
        row_sum = row_sum * rescale + probs.sum(-1)
        acc = acc * rescale[..., None] + probs @ vg[..., start:stop, :]
        row_max = new_max
    return acc / row_sum[..., None], row_max + torch.log(row_sum)


def chunked_tapa_attention(
    q, k, v, *, theta=0.5, alpha=0.1, distance="power", phase="quadratic", causal=True,
    q_offset=0, k_offset=0, return_lse=False, block_q=256, block_k=512,
):
    """TAPA attention by online softmax over (block_q x block_k) tiles. See the module docstring."""
    amp_dim, _ = split_dims(q.shape[-1], theta)
    qg, kg, vg = _grouped(q, k, v)
    q_pos = _positions(q.shape[1], q_offset, q.device)
    k_pos = _positions(k.shape[1], k_offset, q.device)
    recompute = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    outs, lses = [], []
    for start in range(0, qg.shape[-2], block_q):
        args = (qg[..., start:start + block_q, :], kg, vg, q_pos[start:start + block_q], k_pos,
                amp_dim, alpha, distance, phase, causal, block_k)
        if recompute:
            out, lse = checkpoint(_attend_query_block, *args, use_reentrant=False)
        else:
            out, lse = _attend_query_block(*args)
        outs.append(out)
        lses.append(lse)
    out, lse = _ungroup(torch.cat(outs, dim=-2), torch.cat(lses, dim=-1), q.dtype)
    return (out, lse) if return_lse else out
