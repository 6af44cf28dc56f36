"""A LLaMA-style decoder whose positional encoding is a config choice: TAPA, the RoPE family, NoPE.

Pre-norm blocks (RMSNorm -> attention -> residual, RMSNorm -> SwiGLU -> residual), GQA, optional
tied embeddings. TAPA attention goes through `tapa.ops.tapa_attention` (fused kernel on CUDA,
chunked reference elsewhere); RoPE and NoPE use torch's scaled_dot_product_attention with the
usual 1/sqrt(head_dim) scale. The model knows nothing about parallelism.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tapa.model.config import ModelConfig
from tapa.ops import split_dims, tapa_attention
from tapa.positional import apply_rope, rope_cos_sin, rope_frequencies


class KVCache:
    """Keys and values of the positions seen so far, per layer, each (B, length, Hk, D)."""

    def __init__(self, n_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[1]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append this step's k, v for `layer`; return all keys and values so far."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=1)
            v = torch.cat([self.values[layer], v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def rope_tables(cfg: ModelConfig, start_pos: int, seq_len: int, device):
    """(cos, sin), each (seq_len, head_dim), of positions start_pos.. for the config's RoPE method.
    The frequencies may depend on the total length (dynamic NTK), which every layer shares."""
    inv_freq, attention_factor = rope_frequencies(
        cfg.rope_method, cfg.head_dim, base=cfg.rope_base, factor=cfg.rope_scale,
        original_seq_len=cfg.original_seq_len, seq_len=start_pos + seq_len,
        beta_fast=cfg.yarn_beta_fast, beta_slow=cfg.yarn_beta_slow)
    positions = torch.arange(start_pos, start_pos + seq_len, device=device)
    return rope_cos_sin(inv_freq, positions, attention_factor)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        self.amp_dim = split_dims(hd, cfg.theta)[0] if cfg.family == "tapa" else hd
        phase_dim = hd - self.amp_dim
        if cfg.family == "tapa" and cfg.phase_matrix == "diagonal":
            self.phase_matrix = nn.Parameter(torch.ones(phase_dim))
        elif cfg.family == "tapa" and cfg.phase_matrix == "full":
            self.phase_matrix = nn.Parameter(torch.eye(phase_dim))
        else:
            self.phase_matrix = None

    def _apply_phase_matrix(self, q):
        """phi = q_P^T N k_P: fold N into the query, q_P <- N^T q_P, so the op needs no support."""
        if self.phase_matrix is None:
            return q
        q_amp, q_phase = q[..., :self.amp_dim], q[..., self.amp_dim:]
        if self.phase_matrix.dim() == 1:
            q_phase = q_phase * self.phase_matrix.to(q.dtype)
        else:
            q_phase = q_phase @ self.phase_matrix.to(q.dtype)
        return torch.cat([q_amp, q_phase], dim=-1)

    def project(self, x):
        """q (B, N, H, D), k and v (B, N, Hk, D) of x (B, N, dim), before any rotation."""
        cfg = self.cfg
        batch, seq_len, _ = x.shape
        q = self.wq(x).view(batch, seq_len, cfg.n_heads, cfg.head_dim)
        k = self.wk(x).view(batch, seq_len, cfg.n_kv_heads, cfg.head_dim)
        v = self.wv(x).view(batch, seq_len, cfg.n_kv_heads, cfg.head_dim)
        return q, k, v

    def forward(self, x, start_pos: int = 0, kv_cache: KVCache | None = None, rope=None):
        """rope: (cos, sin) of this pass's positions (`rope_tables`), for the RoPE family."""
        cfg = self.cfg
        batch, seq_len, _ = x.shape
        q, k, v = self.project(x)
        if cfg.family == "rope":
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)
        if cfg.family == "tapa":
            out = tapa_attention(self._apply_phase_matrix(q), k, v, theta=cfg.theta, alpha=cfg.alpha,
                                 distance=cfg.distance, phase=cfg.phase, causal=True,
                                 q_offset=start_pos, k_offset=0, impl=cfg.attn_impl)
        else:
            out = self._sdpa(q, k, v, start_pos)
        return self.wo(out.reshape(batch, seq_len, -1))

    @staticmethod
    def _sdpa(q, k, v, start_pos):
        """Causal softmax attention, queries at start_pos.. against keys at 0.., GQA by grouping."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
        q_len, k_len = q.shape[2], k.shape[2]
        if k.shape[1] != q.shape[1]:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if start_pos == 0 and q_len == k_len:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            q_pos = torch.arange(start_pos, start_pos + q_len, device=q.device)
            visible = torch.arange(k_len, device=q.device)[None, :] <= q_pos[:, None]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        return out.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.dim, cfg.ffn_dim)

    def forward(self, x, start_pos=0, kv_cache=None, rope=None):
        x = x + self.attn(self.attn_norm(x), start_pos, kv_cache, rope)
        return x + self.ffn(self.ffn_norm(x))


class TapaLM(nn.Module):
    """Decoder-only language model. forward(input_ids (B, N)) -> logits (B, N, vocab)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        cfg = self.config
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)  # GPT-2 style residual scaling
        nn.init.normal_(self.embed.weight, std=cfg.init_std)
        if not cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=cfg.init_std)
        for block in self.layers:
            attn = block.attn
            for linear in (attn.wq, attn.wk, attn.wv, block.ffn.w_gate, block.ffn.w_up):
                nn.init.normal_(linear.weight, std=cfg.init_std)
            for linear in (attn.wo, block.ffn.w_down):
                nn.init.normal_(linear.weight, std=residual_std)
            if cfg.family == "tapa" and cfg.phase_init_scale != 1.0:
                hd, amp = cfg.head_dim, attn.amp_dim
                for linear, heads in ((attn.wq, cfg.n_heads), (attn.wk, cfg.n_kv_heads)):
                    rows = linear.weight.view(heads, hd, cfg.dim)
                    rows[:, amp:, :] *= cfg.phase_init_scale

    def forward(self, input_ids: torch.Tensor, start_pos: int = 0, kv_cache: KVCache | None = None):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seqlen), got shape {tuple(input_ids.shape)}")
        if kv_cache is not None and kv_cache.length != start_pos:
            raise ValueError(f"start_pos ({start_pos}) must equal the cache length ({kv_cache.length})")
        x = self.embed(input_ids)
        rope = None
        if self.config.family == "rope":  # once per pass, shared by every layer
            rope = rope_tables(self.config, start_pos, input_ids.shape[1], input_ids.device)
        for block in self.layers:
            x = block(x, start_pos, kv_cache, rope)
        return self.lm_head(self.norm(x))

    def loss(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in float32; targets equal to -100 are ignored."""
        logits = self(input_ids)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        params = {id(p): p for p in self.parameters()}  # tied weights count once
        total = sum(p.numel() for p in params.values())
        if exclude_embeddings:
            total -= self.embed.weight.numel()
        return total

    def set_rope_scale(self, factor: float) -> None:
        """Apply RoPE-family scaling at evaluation (PI, static NTK, YaRN). No-op for other encodings."""
        if factor <= 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        if self.config.pe in ("rope-pi", "rope-ntk", "rope-yarn"):
            self.config.rope_scale = float(factor)
