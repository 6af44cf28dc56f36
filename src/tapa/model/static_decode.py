"""Decoding with static shapes, so that one CUDA graph replays every step.

The eager decoding step (`TapaLM.forward` with a `KVCache`) slices the cache to the filled slots
and builds its masks from the host's position: every step launches kernels of new shapes, and on a
GPU the launches, not the math, set its time (measured on an H200: a batch-1 step of the decode
kernel is 0.13 ms eager and 0.018 ms as a graph replay). `StaticDecoder` runs the same model
on one new token per sequence at a position held in a device tensor, against the cache's full
buffers:

- global TAPA layers: the split-KV decode kernel with lengths pos + 1 (the reference op on CPU
  and where the kernel does not take the shapes or dtype, which a graph cannot capture);
- global softmax layers (RoPE family, NoPE): SDPA over all `max_len` slots, masked past pos;
- local layers: SDPA over the ring of `local_window` slots, masked where a slot holds no token yet;
- RoPE rotations from tables of every position, indexed on the device.

What the layers share (the masks, the rotation at pos, the TAPA lengths) is computed once per step,
not per layer, and each RoPE layer rotates its q and k in one op: fewer kernels in every step.

Nothing in a step reads a device value on the host, so on CUDA the step is captured once
(`StaticDecoder(..., cuda_graph=True)`) and replayed. `TapaLM.generate` uses it.

Supported: one new token per sequence, no padding (every sequence of the batch at the same
position), any layer pattern; not the dynamic-NTK RoPE method, whose frequencies change with the
length at every step.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tapa.model.attention import Attention, _cos_sin, _softmax
from tapa.model.cache import KVCache, ring_positions
from tapa.ops import tapa_attention_with_kvcache
from tapa.ops.tapa.decode import decode_kernel_applies
from tapa.positional.rope import apply_rope


def _first_global(cache: KVCache) -> int | None:
    return next((i for i, local in enumerate(cache.local) if not local), None)


def tapa_impl(cfg, cache: KVCache) -> str | None:
    """How the static step's global TAPA layers attend on `cache` (prefilled; the shapes never
    change, so this is decided once): "triton", the split-KV decode kernel, where it takes them,
    else what the eager step runs, attn_impl's op; None on a model without global TAPA layers."""
    layer = _first_global(cache)
    if not cfg.has_tapa_layers or layer is None:
        return None
    keys, values = cache.keys[layer], cache.values[layer]
    q = keys.new_empty(cache.batch, 1, cfg.n_heads, keys.shape[-1])
    with torch.no_grad():  # decoding needs no gradient
        if decode_kernel_applies(q, keys, values, cfg.attn_impl):
            return "triton"
    return cfg.attn_impl if cfg.attn_impl in ("reference", "naive") else "auto"


def cuda_graph_blocker(cfg, cache: KVCache, impl: str | None) -> str | None:
    """What keeps the static step on `cache` (prefilled) from being captured as a CUDA graph, or
    None: a device other than CUDA, or global TAPA layers the split-KV decode kernel does not take
    (their fallback reads the cache lengths on the host, which a graph cannot capture). impl:
    `tapa_impl(cfg, cache)`."""
    device = cache.keys[0].device
    if device.type != "cuda":
        return f"the model and cache on a CUDA device, got {device}"
    if impl in (None, "triton"):
        return None
    keys = cache.keys[_first_global(cache)]
    return (f"the split-KV decode kernel in the global TAPA layers, which does not take attn_impl="
            f"{cfg.attn_impl!r}, {keys.dtype}, {cfg.n_heads} heads on {keys.shape[2]} kv heads of "
            f"head_dim {keys.shape[-1]} (it takes 'auto' or 'triton', float16/bfloat16/float32, "
            f"few query heads per kv head); the fallback reads the cache lengths on the host, which "
            f"a graph cannot capture: decode with cuda_graph=False")


class StepInputs(NamedTuple):
    """What every layer of one step at slots pos (B,) reads, computed once per step (None where no
    layer reads it)."""

    lengths: torch.Tensor | None  # (B,) int32: the global TAPA layers' filled slots, pos + 1
    rotations: dict  # {local: (cos, sin) (B, D) at pos} for the RoPE layers
    visible: torch.Tensor | None  # (B, 1, max_len) bool: the global softmax layers' slots <= pos
    ring_visible: torch.Tensor | None  # (B, 1, ring) bool: the local layers' ring slots holding a token


class StaticDecoder:
    """Greedy-decoding steps of `model` against `cache` (a `KVCache` already holding the prompt).

    decoder(tokens (B, 1)) -> logits (B, 1, vocab) of the next position, and the cache gains the
    token. With cuda_graph the first call captures the step and every call replays it; the logits
    returned then live in the graph's output buffer, overwritten by the next call (copy them to
    keep them). cuda_graph=None: wherever the step can be captured (`cuda_graph_blocker`).
    """

    def __init__(self, model, cache: KVCache, *, cuda_graph: bool | None = False):
        cfg = model.config
        if not isinstance(cache, KVCache):
            raise TypeError(f"StaticDecoder needs a tapa.model.KVCache, got {type(cache).__name__}")
        if cache.length < 1 or any(keys is None for keys in cache.keys):
            raise ValueError("StaticDecoder needs a cache that already holds the prompt (prefill first)")
        if cache.length >= cache.max_len:
            raise ValueError(f"the cache is full ({cache.length} of max_len={cache.max_len} slots)")
        rope_globals = cfg.family == "rope" and any(cfg.layer_kind(i) == "global" for i in range(cfg.n_layers))
        if rope_globals and cfg.rope_method == "dynamic-ntk":
            raise ValueError("static decoding does not support the dynamic-NTK RoPE method (its "
                             "frequencies change with the length at every step); decode eagerly")
        self.tapa_impl = tapa_impl(cfg, cache)
        blocker = cuda_graph_blocker(cfg, cache, self.tapa_impl) if cuda_graph is not False else None
        if blocker and cuda_graph:
            raise ValueError(f"cuda_graph=True needs {blocker}")
        cuda_graph = blocker is None if cuda_graph is None else cuda_graph
        self.model, self.cache, self.cfg = model, cache, cfg
        device = cache.keys[0].device
        self.rows = torch.arange(cache.batch, device=device)
        self.slots = torch.arange(cache.max_len, device=device)
        self.pos = torch.full((cache.batch,), cache.length, dtype=torch.long, device=device)
        self.length = cache.length  # the host's copy of pos, to catch a cache advanced elsewhere
        self.tables = {}  # the rotations of every slot's position
        for local in {block.attn.local for block in model.layers if block.attn.family == "rope"}:
            self.tables[local] = _cos_sin(cfg, local, self.slots, cache.max_len)
        kinds = {"local" if block.attn.local else block.attn.family for block in model.layers}
        self.has_tapa, self.has_softmax = "tapa" in kinds, bool(kinds & {"rope", "nope"})
        self.ring = cache.capacity(cache.local.index(True)) if "local" in kinds else None
        self.cuda_graph = cuda_graph
        self.graph = self.tokens = self.logits = None

    # --- one step, static shapes ------------------------------------------------------------------
    def step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, vocab) of tokens (B, 1) at slots pos (B,); writes their keys and values."""
        model = self.model
        x = model.embed(tokens)
        shared = self._step_inputs(pos)
        for block in model.layers:
            x = x + self._attention(block.attn, block.attn_norm(x), pos, shared)
            x = x + block.ffn(block.ffn_norm(x))
        return model.lm_head(model.norm(x))

    def _step_inputs(self, pos: torch.Tensor) -> StepInputs:
        ring_visible = None
        if self.ring is not None:
            held = ring_positions(pos[:, None], self.slots[None, :self.ring], self.ring)
            ring_visible = (held >= 0)[:, None, :]
        return StepInputs(
            lengths=(pos + 1).to(torch.int32) if self.has_tapa else None,
            rotations={local: (cos[pos], sin[pos]) for local, (cos, sin) in self.tables.items()},
            visible=(self.slots[None, :] <= pos[:, None])[:, None, :] if self.has_softmax else None,
            ring_visible=ring_visible)

    def _attention(self, attn: Attention, h: torch.Tensor, pos: torch.Tensor, shared: StepInputs) -> torch.Tensor:
        cfg, cache = self.cfg, self.cache
        q, k, v = attn.project(h)
        if attn.family == "rope":
            q, k = _rotate(q, k, *shared.rotations[attn.local])
        elif attn.family == "tapa":
            q = attn._apply_phase_matrix(q)
        q = attn.temper(q, pos[:, None])
        keys, values = cache.write_at(attn.layer, k, v, pos, self.rows)
        if attn.family == "tapa":
            out = tapa_attention_with_kvcache(q, keys, values, shared.lengths, impl=self.tapa_impl,
                                              check_lengths=False, theta=cfg.theta, alpha=cfg.alpha,
                                              distance=cfg.distance, phase=cfg.phase)
        else:
            out = _softmax(q, keys, values, mask=shared.ring_visible if attn.local else shared.visible)
        return attn.wo(out.reshape(*h.shape[:2], -1))

    # --- the loop ---------------------------------------------------------------------------------
    @torch.no_grad()  # decoding: with autograd on, TAPA layers would leave the decode kernel
    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        if tokens.shape != (cache.batch, 1):
            raise ValueError(f"tokens must be (batch, 1) = {(cache.batch, 1)}, got {tuple(tokens.shape)}")
        if cache.length != self.length:
            raise ValueError(f"the cache holds {cache.length} slots but this decoder is at {self.length}: "
                             "it was advanced outside the decoder; make a new StaticDecoder")
        if cache.length >= cache.max_len:
            raise ValueError(f"the cache is full ({cache.length} of max_len={cache.max_len} slots)")
        if not self.cuda_graph:
            logits = self.step(tokens, self.pos)
        else:
            if self.graph is None:
                self._capture(tokens)
            self.tokens.copy_(tokens)
            self.graph.replay()
            logits = self.logits
        self.pos.add_(1)
        self.length += 1
        cache.advance(1)
        return logits

    def _capture(self, tokens: torch.Tensor) -> None:
        """Warm up on a side stream (compiles and tunes every kernel), then capture one step. The
        warm-up steps write this step's own keys and values, which the replay writes again."""
        self.tokens = tokens.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.step(self.tokens, self.pos)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.step(self.tokens, self.pos)


def _rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q (B, 1, H, D) and k (B, 1, Hk, D) rotated by cos/sin (B, D) of each sequence's position,
    in one apply_rope (half the kernels of two)."""
    batch, _, heads, head_dim = q.shape
    both = torch.cat([q, k], dim=2).view(1, batch, -1, head_dim)
    both = apply_rope(both, cos, sin).view(batch, 1, -1, head_dim)
    return both[:, :, :heads], both[:, :, heads:]
