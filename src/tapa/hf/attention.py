"""Attention of a `tapa.model.Attention` module under transformers: KV cache, padding, decoding.

`TapaLM` assumes every sequence of a batch starts at position 0 and has no padding. Under
transformers a batch may be left-padded (generate) or carry any 0/1 attention mask, and the
cache is a transformers `Cache`. This module runs one attention layer for that setting, reusing
the layer's weights and helpers:

- no padding: the same op calls as `TapaLM` (`tapa_attention` with q_offset = cached length, or
  SDPA for the RoPE family); on CUDA, one or a few new tokens against a long cache go to the
  split-KV decode kernel `tapa.ops.decode_kernel.tapa_decode_attention`;
- left padding (generate's batches): the op runs per sequence on that sequence's real keys,
  which sit at positions 0, 1, ... (so the fused kernel still serves prefill); decoding on CUDA
  goes to the decode kernel, whose per-sequence start hides the padded slots;
- any other mask (zeros inside a sequence): the op has no mask argument, so the logits come from
  `tapa.ops.reference.tapa_logits` (the single definition of TAPA), the causal and padding masks
  are applied explicitly, then the softmax. Positions restart at 0 at each sequence's first real
  token and skip masked tokens (cumsum of the mask); a query always sees itself, so padded rows
  stay finite (their outputs are never used).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tapa.model import Attention
from tapa.ops import tapa_attention
from tapa.ops.reference import tapa_logits
from tapa.positional import apply_rope, rope_cos_sin, rope_frequencies

# query rows per block of the masked reference path (bounds its logits memory)
MASKED_BLOCK_Q = 128


@dataclass
class AttentionContext:
    """What every layer of one forward pass shares.

    past_len: number of cached slots before this call's tokens.
    positions: (B, past_len + N) position of every slot (for RoPE rotation and TAPA distances).
    key_mask: (B, past_len + N) bool, False at padded slots; None when nothing is padded.
    left_pad: (B,) int32 number of leading padded slots, when the mask is pure left padding.
    uniform: every row's positions are the slots 0, 1, ... (no padding, no position_ids).
    """

    past_len: int
    positions: torch.Tensor
    key_mask: torch.Tensor | None = None
    left_pad: torch.Tensor | None = None
    uniform: bool = False
    rope_cache: dict = field(default_factory=dict)  # cos/sin of this pass, shared by all layers

    @property
    def query_positions(self) -> torch.Tensor:
        return self.positions[:, self.past_len:]


def _cos_sin(cfg, head_dim: int, row: torch.Tensor):
    """RoPE-family cos/sin (len, D) of one sequence's positions; the frequencies follow its length
    (dynamic NTK depends on it), exactly as `TapaLM` computes them for an unpadded sequence."""
    inv_freq, attention_factor = rope_frequencies(
        cfg.rope_method, head_dim, base=cfg.rope_base, factor=cfg.rope_scale,
        original_seq_len=cfg.original_seq_len, seq_len=int(row.max()) + 1,
        beta_fast=cfg.yarn_beta_fast, beta_slow=cfg.yarn_beta_slow)
    return rope_cos_sin(inv_freq, row, attention_factor)


def rotate(attn: Attention, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """RoPE-family rotation of x (B, N, H, D) at the context's per-sequence query positions."""
    cfg = attn.cfg
    batch, seq_len, heads, head_dim = x.shape
    if "cos" not in ctx.rope_cache:
        rows = ctx.query_positions[:1] if ctx.uniform else ctx.query_positions
        pairs = [_cos_sin(cfg, head_dim, row) for row in rows]
        ctx.rope_cache["cos"] = torch.cat([cos for cos, _ in pairs])
        ctx.rope_cache["sin"] = torch.cat([sin for _, sin in pairs])
    cos, sin = ctx.rope_cache["cos"], ctx.rope_cache["sin"]
    if ctx.uniform:
        return apply_rope(x, cos, sin)
    flat = apply_rope(x.reshape(1, batch * seq_len, heads, head_dim), cos, sin)  # (B * N, D) cos/sin
    return flat.view(batch, seq_len, heads, head_dim)


def layer_attention(attn: Attention, x: torch.Tensor, ctx: AttentionContext, cache=None,
                    layer_idx: int = 0) -> torch.Tensor:
    """attn's output for x (B, N, dim); appends this call's k, v to the transformers `cache`."""
    cfg = attn.cfg
    batch, seq_len, _ = x.shape
    q, k, v = attn.project(x)
    if cfg.family == "rope":
        q, k = rotate(attn, q, ctx), rotate(attn, k, ctx)
    if cache is not None:  # transformers caches hold (B, Hk, len, D)
        k, v = cache.update(k.transpose(1, 2), v.transpose(1, 2), layer_idx)
        # a static cache returns its whole buffer: keep the filled slots only
        total = ctx.past_len + seq_len
        k, v = k.transpose(1, 2)[:, :total], v.transpose(1, 2)[:, :total]
    if cfg.family == "tapa":
        q = attn._apply_phase_matrix(q)
        out = _tapa(attn, q, k, v, ctx)
    elif ctx.key_mask is None:
        out = Attention._sdpa(q, k, v, ctx.past_len)
    else:
        out = _masked_sdpa(q, k, v, ctx)
    return attn.wo(out.reshape(batch, seq_len, -1))


def _decode_kernel():
    """The split-KV decode kernel's module, or None without triton."""
    try:
        from tapa.ops import decode_kernel
    except ImportError:
        return None
    return decode_kernel


def _tapa(attn: Attention, q, k, v, ctx: AttentionContext):
    cfg = attn.cfg
    op_args = dict(theta=cfg.theta, alpha=cfg.alpha, distance=cfg.distance, phase=cfg.phase)
    # "auto": the decode kernel on CUDA; "triton" forces it (on CPU through Triton's interpreter)
    wanted = cfg.attn_impl == "triton" or (q.is_cuda and cfg.attn_impl == "auto")
    kernel = _decode_kernel() if wanted else None
    if kernel is not None and kernel.supports(q, k, v) and (ctx.key_mask is None or ctx.left_pad is not None):
        lengths = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
        return kernel.tapa_decode_attention(q, k, v, lengths, cache_starts=ctx.left_pad,
                                            check_lengths=False, **op_args)
    if ctx.key_mask is None:
        return tapa_attention(q, k, v, causal=True, q_offset=ctx.past_len, k_offset=0,
                              impl=cfg.attn_impl, **op_args)
    if ctx.left_pad is not None:
        return _left_padded_tapa(q, k, v, ctx, impl=cfg.attn_impl, **op_args)
    return _masked_tapa(q, k, v, ctx, amp_dim=attn.amp_dim, **op_args)


def _left_padded_tapa(q, k, v, ctx: AttentionContext, *, impl, **op_args):
    """Left padding: the op on each sequence's real keys (slots pad.. are positions 0..), so the
    fused kernel still runs. Queries at padded slots get 0 (their outputs are never used)."""
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    for row, pad in enumerate(ctx.left_pad.tolist()):
        first_query = max(pad - ctx.past_len, 0)
        if first_query >= q.shape[1]:
            continue
        out[row:row + 1, first_query:] = tapa_attention(
            q[row:row + 1, first_query:], k[row:row + 1, pad:], v[row:row + 1, pad:], causal=True,
            q_offset=ctx.past_len + first_query - pad, k_offset=0, impl=impl, **op_args)
    return out


def _visible(ctx: AttentionContext, row: int, q_start: int, q_stop: int) -> torch.Tensor:
    """(nq, Nk) bool: causal by slot, padded keys hidden, each query sees its own slot."""
    n_keys = ctx.positions.shape[1]
    key_slots = torch.arange(n_keys, device=ctx.positions.device)
    query_slots = key_slots[ctx.past_len + q_start:ctx.past_len + q_stop]
    causal = key_slots[None, :] <= query_slots[:, None]
    return causal & (ctx.key_mask[row][None, :] | (key_slots[None, :] == query_slots[:, None]))


def _masked_tapa(q, k, v, ctx: AttentionContext, *, amp_dim, theta, alpha, distance, phase):
    """TAPA with an explicit mask: tapa_logits, mask, softmax; one sequence and query block at a time."""
    del theta  # amp_dim already encodes it
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = q.new_empty(batch, q_len, heads, v.shape[-1])
    for row in range(batch):
        # (Hk, G, Nq, D) queries against (Hk, 1, Nk, D) keys: query heads grouped on their kv head
        q_row = q[row].to(compute).view(q_len, kv_heads, heads // kv_heads, head_dim).permute(1, 2, 0, 3)
        k_row = k[row].to(compute).transpose(0, 1).unsqueeze(1)
        v_row = v[row].to(compute).transpose(0, 1).unsqueeze(1)
        k_pos = ctx.positions[row]
        for start in range(0, q_len, MASKED_BLOCK_Q):
            stop = min(start + MASKED_BLOCK_Q, q_len)
            logits = tapa_logits(q_row[:, :, start:stop], k_row, k_pos[ctx.past_len + start:ctx.past_len + stop],
                                 k_pos, amp_dim=amp_dim, alpha=alpha, distance=distance, phase=phase)
            logits = logits.masked_fill(~_visible(ctx, row, start, stop), float("-inf"))
            block = torch.softmax(logits, dim=-1) @ v_row  # (Hk, G, nq, Dv)
            out[row, start:stop] = block.permute(2, 0, 1, 3).reshape(stop - start, heads, -1).to(q.dtype)
    return out


def _masked_sdpa(q, k, v, ctx: AttentionContext):
    """Softmax attention (RoPE family, NoPE) with the causal and padding masks, GQA by repeat."""
    q_len = q.shape[1]
    visible = torch.stack([_visible(ctx, row, 0, q_len) for row in range(q.shape[0])])[:, None]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible).transpose(1, 2)
