"""A LLaMA-style decoder whose attention is a per-layer choice: TAPA, the RoPE family or NoPE in
global layers, RoPE in a sliding window in local layers (`ModelConfig.layer_pattern`).

Pre-norm blocks (RMSNorm -> attention -> residual, RMSNorm -> SwiGLU -> residual), GQA, optional
tied embeddings. Attention lives in `tapa.model.attention`, the KV cache in `tapa.model.cache`.
The model knows nothing about parallelism beyond an opaque context-parallel shard a trainer
may pass (`forward(context_parallel=)`, see `tapa.model.attention.AttentionContext`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from torch.utils.checkpoint import checkpoint

from tapa.model.attention import Attention, AttentionContext, Documents
from tapa.model.cache import KVCache
from tapa.model.config import ModelConfig
from tapa.model.norm import RMSNorm
from tapa.model.static_decode import StaticDecoder


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.dim, cfg.ffn_dim)

    def forward(self, x, ctx: AttentionContext, cache=None):
        x = x + self.attn(self.attn_norm(x), ctx, cache)
        return x + self.ffn(self.ffn_norm(x))


def _cross_entropy_sum(hidden, weight, targets):
    logits = F.linear(hidden, weight)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits: float32 loss
    return F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")


def chunked_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                              chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the cross-entropies, number of scored targets) of `chunked_cross_entropy`."""
    hidden, targets = hidden.flatten(0, -2), targets.flatten()
    total = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for start in range(0, hidden.shape[0], chunk):
        args = (hidden[start:start + chunk], weight, targets[start:start + chunk])
        total = total + (checkpoint(_cross_entropy_sum, *args, use_reentrant=False) if grad
                         else _cross_entropy_sum(*args))
    return total, (targets != -100).sum()


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk: int) -> torch.Tensor:
    """Mean cross-entropy (float32, or float64 for float64 inputs) of the logits hidden @ weight.T against targets (-100:
    ignored), `chunk` tokens at a time: under autograd each chunk's logits are recomputed in the
    backward pass, so no more than one chunk's (chunk, vocab) logits ever exist."""
    total, count = chunked_cross_entropy_sum(hidden, weight, targets, chunk)
    return total / count.clamp_min(1)


class TapaLM(nn.Module):
    """Decoder-only language model. forward(input_ids (B, N)) -> logits (B, N, vocab), or with
    targets the mean next-token loss without ever holding every token's logits.

    checkpoint_blocks: recompute each block's activations in the backward pass instead of keeping
    them (activation checkpointing), for long rows: True for every block, an int n for the first n
    only (selective: the others keep theirs, a middle ground of memory and speed), False for none;
    loss_chunk_tokens: tokens per chunk of the loss's logits.
    """

    checkpoint_blocks: bool | int = False
    loss_chunk_tokens: int = 8192

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
            block.attn.reset_parameters(cfg.init_std, residual_std, cfg.phase_init_scale)
            for linear in (block.ffn.w_gate, block.ffn.w_up):
                nn.init.normal_(linear.weight, std=cfg.init_std)
            nn.init.normal_(block.ffn.w_down.weight, std=residual_std)

    def forward(self, input_ids: torch.Tensor, start_pos: int = 0, kv_cache: KVCache | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                document_ids: torch.Tensor | Documents | None = None,
                targets: torch.Tensor | None = None, context_parallel=None, logits_to_keep: int = 0):
        """Logits (B, N, vocab) of input_ids (B, N) at slots start_pos ..; with logits_to_keep
        k > 0, those of the last k positions only, (B, k, vocab) (transformers' name): a prompt's
        prefill then never holds (B, N, vocab) logits, which at 128k tokens and a 128k vocabulary
        would be 32 GiB in bf16.

        kv_cache: a `KVCache` (`new_kv_cache`) holding the first start_pos slots; it gains these.
        attention_mask (B, start_pos + N) of 0/1 marks padding; position_ids (B, N) rotate RoPE
        layers (see `AttentionContext.build`). document_ids (B, N), labels equal within each
        packed document (or a `Documents`), keep every token inside its own document: attention
        never crosses a document, and RoPE positions restart at each one. targets (B, N): return
        the mean cross-entropy (float32; -100 ignored) instead of the logits, computed
        `loss_chunk_tokens` at a time (`chunked_cross_entropy`).
        context_parallel: this rank's share of the rows under context parallelism (training; see
        `AttentionContext.parallel`): input_ids and targets are then that share's tokens, and the
        loss is the mean over every rank's.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seqlen), got shape {tuple(input_ids.shape)}")
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be an int >= 0 (0: every position), got {logits_to_keep!r}")
        if logits_to_keep and targets is not None:
            raise ValueError("logits_to_keep applies to logits; with targets the loss covers every position")
        if kv_cache is not None and kv_cache.length != start_pos:
            raise ValueError(f"start_pos ({start_pos}) must equal the cache length ({kv_cache.length})")
        if document_ids is not None and not isinstance(document_ids, Documents):
            document_ids = Documents.from_ids(document_ids.to(input_ids.device))
        ctx = AttentionContext.build(input_ids.shape[0], start_pos, input_ids.shape[1], input_ids.device,
                                     attention_mask=attention_mask, position_ids=position_ids, cfg=self.config,
                                     documents=document_ids, parallel=context_parallel)
        hidden = self.norm(self.blocks(self.embed(input_ids), ctx, kv_cache))
        if targets is not None and context_parallel is not None:
            total, count = chunked_cross_entropy_sum(hidden, self.lm_head.weight, targets,
                                                     self.loss_chunk_tokens)
            return context_parallel.mean_loss(total, count)
        if targets is not None:
            return chunked_cross_entropy(hidden, self.lm_head.weight, targets, self.loss_chunk_tokens)
        return self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)

    def blocks(self, x: torch.Tensor, ctx: AttentionContext, cache=None) -> torch.Tensor:
        """Run every block on embeddings x (B, N, dim); `cache` follows `tapa.model.cache`'s interface."""
        recompute = 0
        if cache is None and torch.is_grad_enabled():
            recompute = len(self.layers) if self.checkpoint_blocks is True else int(self.checkpoint_blocks)
        for index, block in enumerate(self.layers):
            if index < recompute:
                x = checkpoint(block, x, ctx, cache, use_reentrant=False)
            else:
                x = block(x, ctx, cache)
        if cache is not None:
            cache.advance(ctx.seq_len)
        return x

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int | None = None, generator: torch.Generator | None = None,
                 cuda_graph: bool | None = None) -> torch.Tensor:
        """Continuation (B, max_new_tokens) of unpadded prompts input_ids (B, N), the new tokens
        only (transformers' generate returns the prompt followed by them: `torch.cat([input_ids,
        out], 1)` gives that form). The prompt in one
        pass through a new KVCache, then one `StaticDecoder` step per token, captured once as a CUDA
        graph and replayed when cuda_graph (default: on CUDA, where the step can be captured:
        `tapa.model.static_decode.cuda_graph_blocker`).

        temperature 0 (the default) is greedy; above 0 each token is sampled from
        softmax(logits / temperature), over the top_k logits when top_k is given, with `generator`
        (on the model's device) for reproducible draws.
        """
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be (batch, seqlen) with seqlen > 0, got {tuple(input_ids.shape)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")

        def pick(logits: torch.Tensor) -> torch.Tensor:  # (B, 1, V) -> (B, 1)
            logits = logits[:, -1].float()
            if temperature == 0:
                return logits.argmax(-1, keepdim=True)
            if top_k is not None and top_k < logits.shape[-1]:
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits / temperature, dim=-1)
            return torch.multinomial(probs, 1, generator=generator)

        if cuda_graph and not input_ids.is_cuda:
            raise ValueError(f"cuda_graph=True needs the model and input_ids on a CUDA device, got "
                             f"{input_ids.device}")
        cache = self.new_kv_cache(input_ids.shape[0], input_ids.shape[1] + max_new_tokens)
        token = pick(self(input_ids, 0, cache, logits_to_keep=1))
        generated = [token]
        if max_new_tokens > 1:
            decoder = StaticDecoder(self, cache, cuda_graph=cuda_graph)
            for _ in range(max_new_tokens - 1):
                token = pick(decoder(token))
                generated.append(token)
        return torch.cat(generated, dim=1)

    def new_kv_cache(self, batch: int, max_len: int) -> KVCache:
        """A cache for `batch` sequences of up to max_len tokens (local layers keep local_window)."""
        return KVCache(self.config, batch, max_len)

    def loss(self, input_ids: torch.Tensor, targets: torch.Tensor,
             document_ids: torch.Tensor | Documents | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy in float32; targets equal to -100 are ignored."""
        return self(input_ids, document_ids=document_ids, targets=targets)

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
        if self.config.kind.scaled_at_eval:
            self.config.rope_scale = float(factor)
