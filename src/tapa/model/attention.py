"""The model's one attention module: projections, positions, KV cache, and each layer kind's
attention, chosen once at construction.

Layer kinds (`ModelConfig.layer_pattern`):
- global, tapa family: `tapa.ops.tapa_attention` (fused kernel on CUDA); a few new tokens
  against a cache on CUDA go to `tapa.ops.tapa_attention_with_kvcache` (split-KV decoding);
- global, RoPE family or NoPE: softmax attention (SDPA), scale 1/sqrt(head_dim); against a
  cache without cuDNN's SDPA backend (a plan per key length), and one new token per sequence with
  no padding takes no mask (it sees every cached key);
- local: plain RoPE (`rope_base`, never scaled) and softmax inside a causal sliding window of
  `local_window` tokens (`tapa.ops.local.local_attention`).

Positions. Without a padding mask a token's position is its slot (0, 1, ... after the cached
ones). With a padding mask (transformers' padded batches), positions restart at 0 at each
sequence's first real token and skip masked tokens; padded keys are hidden (TAPA layers run each
row's real tokens as one sequence of the varlen op), and a query always sees its own slot so
padded rows stay finite (their outputs are never used). With packed documents (`Documents`: each
row a run of whole documents, as training packs them), no token sees another document: every
layer attends through `Attention.attend_span`, as a context-parallel chunk does. TAPA layers take
the varlen op (their distances are already each document's own), the other layers the
sliding-window op with the documents in its mask (FlexAttention on CUDA, the chunked path
elsewhere), and RoPE positions restart at 0 at each document's first token.

Context parallelism (training only): each rank holds a share of every row, at global positions
(`AttentionContext.parallel`, set by the trainer); the layer hands its queries, keys and values
to that object, which fetches the other ranks' keys and calls `Attention.attend_span` per local
chunk with the chunk's global offsets (and, with packed documents, the keys' document labels:
`SpanDocuments`). The module knows no process group.

In TAPA layers the phase rows of W_q and W_k are parameters of their own (`wq_phase`, `wk_phase`),
so that training can give them their own learning rate; the forward is the same single projection.
Checkpoints written before the split (one `wq`/`wk` of all rows) load unchanged.

Two layouts of converted checkpoints: q/k/v biases (`attention_bias`, Qwen2) are part of the
projection, split into amplitude and phase rows as the weights are; QK-norm (`qk_norm`, Qwen3)
normalizes each whole query and key head (amplitude and phase rows together) right after the
projection, before any rotation, phase matrix or temperature.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from tapa.model.config import ModelConfig
from tapa.model.norm import RMSNorm
from tapa.ops import split_dims, tapa_attention, tapa_attention_varlen, tapa_attention_with_kvcache
from tapa.ops.local import document_starts, local_attention
from tapa.ops.tapa.decode import decode_kernel_applies
from tapa.positional.rope import apply_rope, rope_cos_sin, rope_frequencies

PHASE_PARAMETERS = ("wq_phase", "wk_phase", "phase_matrix")


def is_phase_parameter(name: str) -> bool:
    """Whether a parameter's qualified name (any wrapper prefix) is a TAPA phase parameter."""
    return any(part in PHASE_PARAMETERS for part in name.split("."))


def split_phase_rows(state: dict, prefix: str, cfg: ModelConfig) -> None:
    """In place: a TAPA layer's wq/wk (weight, and bias if any) of the layout before the phase
    split (every head's amplitude then phase rows in one tensor, as Llama conversion and older
    checkpoints write them) become wq/wk (amplitude rows) and wq_phase/wk_phase. Anything else is
    left alone."""
    amp_dim = split_dims(cfg.head_dim, cfg.theta)[0]
    for main, heads in (("wq", cfg.n_heads), ("wk", cfg.n_kv_heads)):
        for kind in ("weight", "bias"):
            whole = state.get(f"{prefix}{main}.{kind}")
            if f"{prefix}{main}_phase.{kind}" in state or whole is None or whole.shape[0] != heads * cfg.head_dim:
                continue
            rows = whole.view(heads, cfg.head_dim, -1)
            tail = whole.shape[1:]
            state[f"{prefix}{main}.{kind}"] = rows[:, :amp_dim].reshape(-1, *tail)
            state[f"{prefix}{main}_phase.{kind}"] = rows[:, amp_dim:].reshape(-1, *tail)


def upgrade_state_dict(state: dict, cfg: ModelConfig, prefix: str = "") -> dict:
    """A copy of a TapaLM state dict (keys under `prefix`) in the current layout."""
    state = dict(state)
    for layer in range(cfg.n_layers):
        if cfg.family == "tapa" and cfg.layer_kind(layer) == "global":
            split_phase_rows(state, f"{prefix}layers.{layer}.attn.", cfg)
    return state


@dataclass(frozen=True)
class Documents:
    """Packed documents of a batch of rows (B, N): every row a run of whole documents.

    ids: (B, N) int64, each token's document index within its row (non-decreasing);
    positions: (B, N) int64, each token's position inside its document;
    span: the rows as one `SpanDocuments` (every layer attends through it, made once a pass);
    cu_seqlens: int32 (D + 1,), the documents of all rows as FlashAttention's varlen offsets over
    the flattened B * N tokens; max_seqlen: the longest document (both the span's);
    row_lengths: each row's longest document, the length RoPE frequencies that follow it see.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    span: "SpanDocuments" = field(repr=False, compare=False)

    @classmethod
    def from_ids(cls, ids: torch.Tensor) -> "Documents":
        """From per-token document labels (B, N): a new document starts wherever the label
        changes along a row (and at every row's start)."""
        if ids.dim() != 2:
            raise ValueError(f"document_ids must be (batch, seqlen), got shape {tuple(ids.shape)}")
        positions = torch.arange(ids.shape[1], device=ids.device) - document_starts(ids)
        index = (positions == 0).long().cumsum(-1) - 1  # document index within the row
        return cls(index, positions, SpanDocuments(index))

    @property
    def cu_seqlens(self) -> torch.Tensor:
        return self.span.varlen(self.ids.shape[1])[1]

    @property
    def max_seqlen(self) -> int:
        return self.span.varlen(self.ids.shape[1])[3] if self.ids.numel() else 0

    @property
    def row_lengths(self) -> list[int]:
        return (self.positions.amax(1) + 1).tolist()

    @classmethod
    def from_tokens(cls, input_ids: torch.Tensor, eot_id: int) -> "Documents":
        """Documents that end with the end-of-text token eot_id (inclusive), as the corpus packs
        them: a token's document is the count of eot tokens before it in its row."""
        eot = (input_ids == eot_id).long()
        return cls.from_ids(eot.cumsum(-1) - eot)


class SpanDocuments:
    """The packed documents of one span of keys (`Attention.attend_span`): labels (B, Nk), equal
    within a document and changing where one starts, for keys whose last Nq are the span's
    queries. Made once per span by whoever cuts the rows (context parallelism) and shared by the
    layers of a pass, which keep what they derive from it in `tables`."""

    def __init__(self, labels: torch.Tensor):
        self.labels = labels
        self.tables: dict = {}

    def varlen(self, n_queries: int):
        """The span as varlen sequences for the last n_queries keys' queries: (kept, cu_q, cu_k,
        longest q, longest k). Each run of one document among the queries is a sequence whose keys
        run from that document's first key to its last query, so the varlen op's bottom-right
        causal alignment gives every query its own position; kept (B, Nk) bool marks the keys any
        query needs (a row's keys from its first query's document on), in the flat order the
        offsets count, or is None when every key is needed (queries and keys the same tokens)."""
        if n_queries not in self.tables:
            labels = self.labels
            batch, n_keys = labels.shape
            shift = n_keys - n_queries
            starts = document_starts(labels)  # (B, Nk) each key's document's first key
            kept = torch.arange(n_keys, device=labels.device)[None] >= starts[:, shift:shift + 1]
            new = torch.ones(batch, n_queries, dtype=torch.bool, device=labels.device)
            new[:, 1:] = labels[:, shift + 1:] != labels[:, shift:-1]
            run_starts = torch.nonzero(new.flatten()).flatten()  # flat (B * Nq) query index
            cu_q = torch.cat([run_starts, run_starts.new_tensor([batch * n_queries])])
            rows, firsts = run_starts // n_queries, run_starts % n_queries
            lasts = torch.cat([run_starts[1:], run_starts.new_tensor([batch * n_queries])])
            lasts = torch.where(lasts // n_queries == rows, lasts % n_queries, n_queries)  # exclusive
            key_lengths = shift + lasts - starts[rows, shift + firsts]
            cu_k = F.pad(key_lengths.cumsum(0), (1, 0))
            longest = torch.stack([cu_q.diff().max(), key_lengths.max()]).tolist()
            self.tables[n_queries] = (None if shift == 0 else kept, cu_q.to(torch.int32),
                                      cu_k.to(torch.int32), *longest)
        return self.tables[n_queries]


@dataclass
class AttentionContext:
    """What every layer of one forward pass shares.

    start: slots cached before this pass; seq_len: new tokens.
    positions: (B, start + seq_len) position of every slot.
    key_mask: (B, start + seq_len) bool, False at padded slots; None when nothing is padded.
    left_pad: (B,) int32 leading padded slots, when key_mask is pure left padding.
    uniform: every row's positions are the same: its slots, or a context-parallel shard's.
    row_lengths: where positions are not uniform, each row's length as RoPE frequencies that follow
    the length see it (packed documents: their `Documents.row_lengths`, also for a context-parallel
    shard's part of the rows); None: each row's largest position + 1.
    documents: packed documents that must not see each other (`Documents`), or None.
    parallel: this rank's share of the rows under context parallelism, or None. Set by a trainer
    (`tapa.train.context_parallel.ContextShard`); the model only calls it:
        .positions (N,) int64, the global positions of the N local tokens of every row;
        .length, the whole row's length (RoPE frequencies that follow the length use it);
        .documents, the whole rows' packed documents (`Documents`), or None; with them
            .document_positions (B, N), each local token's position inside its document;
        .attend(q, k, v, span, window) -> out: the local queries' attention given the local
            keys, where span(q, k, v, q_offset, k_offset, documents=None) is the layer's causal
            attention of queries at global positions q_offset.. against keys at k_offset..
            (window: the local layers' window, None for global layers; documents: the keys'
            `SpanDocuments` when the rows are packed documents);
        .mean_loss(total, count) -> the mean loss over every rank's tokens.
    """

    start: int
    seq_len: int
    positions: torch.Tensor
    key_mask: torch.Tensor | None = None
    left_pad: torch.Tensor | None = None
    uniform: bool = True
    tables: dict = field(default_factory=dict)  # per pass: RoPE cos/sin per (local, method), padding
    documents: Documents | None = None
    parallel: object | None = None
    row_lengths: list[int] | None = None

    @classmethod
    def build(cls, batch: int, start: int, seq_len: int, device, *, attention_mask=None,
              position_ids=None, cfg: ModelConfig | None = None,
              documents: Documents | None = None, parallel=None) -> "AttentionContext":
        """attention_mask (B, start + seq_len) of 0/1 marks padding. position_ids (B, seq_len), if
        given, rotate RoPE layers; where TAPA layers exist they must agree with the positions the
        mask implies (TAPA distances come from the mask). documents: packed documents of these
        tokens (training and scoring only: no cache, no padding mask, no position_ids).
        parallel: a context-parallel shard (see the class docstring; training only: none of the
        others; its packed documents, if any, come with the shard)."""
        if parallel is not None:
            if start or attention_mask is not None or position_ids is not None or documents is not None:
                raise ValueError("context parallelism takes whole rows (no KV cache, attention_mask "
                                 "or position_ids), and their packed documents with the shard "
                                 "(ContextParallel.shard(documents=)), not as document_ids")
            if len(parallel.positions) != seq_len:
                raise ValueError(f"the context-parallel shard holds {len(parallel.positions)} tokens "
                                 f"of each row, but input_ids has {seq_len}")
            if parallel.documents is not None:
                positions = parallel.document_positions.to(device)
                if tuple(positions.shape) != (batch, seq_len):
                    raise ValueError(f"the context-parallel shard's documents are of "
                                     f"{positions.shape[0]} rows, but input_ids has {batch}")
                return cls(0, seq_len, positions, uniform=False, parallel=parallel,
                           row_lengths=parallel.documents.row_lengths)
            positions = parallel.positions.to(device).expand(batch, seq_len)
            return cls(0, seq_len, positions, parallel=parallel)
        if documents is not None:
            if start or attention_mask is not None or position_ids is not None:
                raise ValueError("document masking takes whole rows of packed documents: no KV "
                                 "cache, attention_mask or position_ids with document_ids")
            if tuple(documents.ids.shape) != (batch, seq_len):
                raise ValueError(f"document_ids must be (batch, seqlen) = {(batch, seq_len)}, got "
                                 f"{tuple(documents.ids.shape)}")
            return cls(0, seq_len, documents.positions.to(device), uniform=False,
                       documents=documents, row_lengths=documents.row_lengths)
        total = start + seq_len
        if attention_mask is not None:
            if attention_mask.dim() == 4:
                raise ValueError("4D attention masks are not supported: pass the 2D 0/1 mask "
                                 "(batch, cached + new)")
            if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, total):
                raise ValueError(f"attention_mask must be (batch, cached + new tokens) = {(batch, total)}, "
                                 f"got {tuple(attention_mask.shape)}")
            if bool(attention_mask.all()):
                attention_mask = None
        if attention_mask is None:
            positions = torch.arange(total, device=device).expand(batch, total)
            key_mask = left_pad = None
        else:
            key_mask = attention_mask.to(device=device, dtype=torch.bool)
            positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)
            left_pad = _left_pad(key_mask)
        rotates = cfg is not None and (cfg.family == "rope" or cfg.is_hybrid)
        if position_ids is not None and cfg is not None:
            position_ids = position_ids.to(device).expand(batch, seq_len)
            if cfg.family == "tapa":
                _check_tapa_position_ids(position_ids, positions[:, start:], key_mask, start)
            elif rotates:
                positions = torch.cat([positions[:, :start], position_ids], dim=1)
                return cls(start, seq_len, positions, key_mask, left_pad, uniform=False)
        return cls(start, seq_len, positions, key_mask, left_pad, uniform=key_mask is None)

    def padded_sequences(self):
        """(key_mask, query_mask, offsets (2, B + 1) int32 of the queries' and keys' real tokens,
        longest query run, longest key run): the padded batch as varlen sequences. Made once a
        pass (the lengths' maxima are a device sync), shared by every TAPA layer."""
        if "padded" not in self.tables:
            query_mask = self.key_mask[:, self.start:]
            lengths = torch.stack([query_mask.sum(1), self.key_mask.sum(1)])  # (2, B)
            offsets = F.pad(lengths.cumsum(1), (1, 0)).to(torch.int32)
            self.tables["padded"] = (self.key_mask, query_mask, offsets, *lengths.amax(1).tolist())
        return self.tables["padded"]

    @property
    def query_positions(self) -> torch.Tensor:
        return self.positions[:, self.start:]

    def rotate(self, x: torch.Tensor, cfg: ModelConfig, local: bool) -> torch.Tensor:
        """RoPE rotation of x (B, N, H, D) at the query positions: plain RoPE for local layers,
        the config's RoPE method for global ones."""
        key = (local, cfg.rope_method, cfg.rope_scale)
        if key not in self.tables:
            if self.uniform:  # the length is known on the host: no device sync
                length = self.parallel.length if self.parallel is not None else self.start + self.seq_len
                pairs = [_cos_sin(cfg, local, self.query_positions[0], length)]
            else:
                lengths = self.row_lengths or [int(row.max()) + 1 for row in self.query_positions]
                pairs = [_cos_sin(cfg, local, row, length)
                         for row, length in zip(self.query_positions, lengths)]
            self.tables[key] = (torch.cat([cos for cos, _ in pairs]), torch.cat([sin for _, sin in pairs]))
        cos, sin = self.tables[key]
        if self.uniform:
            return apply_rope(x, cos, sin)
        batch, seq_len, heads, head_dim = x.shape
        flat = apply_rope(x.reshape(1, batch * seq_len, heads, head_dim), cos, sin)  # (B * N, D) cos/sin
        return flat.view(batch, seq_len, heads, head_dim)

    def visible(self, key_slots: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """(B or 1, Nq, Nk) bool: causal by slot, padded keys hidden, each query sees its own slot;
        with `window`, only keys whose position is within window - 1 of the query's."""
        query_slots = torch.arange(self.start, self.start + self.seq_len, device=key_slots.device)
        causal = key_slots[None, :] <= query_slots[:, None]
        if self.key_mask is None:
            seen = causal[None]
            if window is not None:
                seen = seen & ((query_slots[:, None] - key_slots[None, :]) < window)[None]
            return seen
        own = key_slots[None, :] == query_slots[:, None]
        seen = causal[None] & (self.key_mask[:, key_slots][:, None, :] | own[None])
        if window is not None:
            distance = self.query_positions[:, :, None] - self.positions[:, key_slots][:, None, :]
            seen = seen & (distance < window)
        return seen


def _check_tapa_position_ids(position_ids, implied, key_mask, start: int) -> None:
    """TAPA takes its distances from the mask, so position_ids may only shift a row's positions by a
    constant (generate gives an empty left-padded prompt's first token position 1, not 0); anything
    else would be silently ignored, so it is an error."""
    real = key_mask[:, start:] if key_mask is not None else torch.ones_like(position_ids, dtype=torch.bool)
    shift = position_ids - implied
    first = torch.where(real, shift, shift.new_tensor(0)).gather(1, real.long().argmax(1, keepdim=True))
    if bool(((shift != first) & real).any()):
        raise ValueError("position_ids disagree with the positions implied by attention_mask; TAPA "
                         "computes distances from the attention mask (positions restart at 0 at each "
                         "sequence's first real token and skip masked tokens)")


def _left_pad(key_mask: torch.Tensor) -> torch.Tensor | None:
    """(B,) count of leading False if every row is False... then True..., else None."""
    mask = key_mask.long()
    if bool((mask[:, 1:] < mask[:, :-1]).any()):
        return None
    return (mask == 0).sum(-1).to(torch.int32)


def _cos_sin(cfg: ModelConfig, local: bool, row: torch.Tensor, length: int):
    """cos/sin (len, D) of one row of positions; the frequencies follow the sequence's length
    (dynamic NTK depends on it)."""
    inv_freq, attention_factor = rope_frequencies(
        "rope" if local else cfg.rope_method, cfg.head_dim, base=cfg.rope_base,
        factor=1.0 if local else cfg.rope_scale, original_seq_len=cfg.original_seq_len,
        seq_len=length, beta_fast=cfg.yarn_beta_fast, beta_slow=cfg.yarn_beta_slow)
    return rope_cos_sin(inv_freq, row, attention_factor)


@contextlib.contextmanager
def _without_cudnn():
    """SDPA without its cuDNN backend inside: for queries against a KV cache, whose key length
    grows by one every decoding step. cuDNN builds an execution plan for every new shape (its plan
    cache is keyed on the sequence lengths and strides), milliseconds on the host, and torch (2.10+
    with cuDNN > 9.15) tries it first on H100/H200. Only cuDNN's flag moves (`sdpa_kernel` would
    set every backend's, at 14 µs a call on this hot path); where no other backend is enabled,
    cuDNN stays."""
    cuda = torch.backends.cuda
    was = cuda.cudnn_sdp_enabled()
    others = cuda.flash_sdp_enabled() or cuda.mem_efficient_sdp_enabled() or cuda.math_sdp_enabled()
    if was and others:
        cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        cuda.enable_cudnn_sdp(was)


def _softmax(q, k, v, mask=None, is_causal=False, bias=None):
    """SDPA on (B, N, H, D) tensors, GQA by grouping; mask (B or 1, Nq, Nk) bool, or bias: a torch
    attention bias object (`causal_lower_right`), which SDPA takes without materializing it."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if mask is not None:
        mask = mask[:, None]
    elif bias is not None:
        mask = bias
    gqa = k.shape[1] != q.shape[1]
    if gqa:  # repeat rather than enable_gqa: every SDPA backend and torch version takes it
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal).transpose(1, 2)


class Attention(nn.Module):
    """One layer's attention; its kind (global TAPA / global softmax / local) is fixed at construction."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.local = cfg.layer_kind(layer) == "local"
        self.family = "rope" if self.local else cfg.family
        self.window = cfg.local_window if self.local else None
        hd = cfg.head_dim
        self.amp_dim = split_dims(hd, cfg.theta)[0] if self.family == "tapa" else hd
        phase_dim = hd - self.amp_dim
        bias = cfg.attention_bias
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.amp_dim, bias=bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.amp_dim, bias=bias)
        self.wq_phase = nn.Linear(cfg.dim, cfg.n_heads * phase_dim, bias=bias) if phase_dim else None
        self.wk_phase = nn.Linear(cfg.dim, cfg.n_kv_heads * phase_dim, bias=bias) if phase_dim else None
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=bias)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        # each head's norm weight in this layer's row order (TAPA: amplitude dims, then phase dims)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        if self.family == "tapa" and cfg.phase_matrix == "diagonal":
            self.phase_matrix = nn.Parameter(torch.ones(phase_dim))
        elif self.family == "tapa" and cfg.phase_matrix == "full":
            self.phase_matrix = nn.Parameter(torch.eye(phase_dim))
        else:
            self.phase_matrix = None
        self.attend = self._local if self.local else {
            "tapa": self._tapa, "rope": self._global_softmax, "nope": self._global_softmax}[self.family]

    @torch.no_grad()
    def reset_parameters(self, std: float, residual_std: float, phase_init_scale: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.normal_(linear.weight, std=std)
        for linear in (self.wq_phase, self.wk_phase):
            if linear is not None:
                nn.init.normal_(linear.weight, std=std * phase_init_scale)
        nn.init.normal_(self.wo.weight, std=residual_std)
        for linear in (self.wq, self.wk, self.wq_phase, self.wk_phase, self.wv):
            if linear is not None and linear.bias is not None:
                nn.init.zeros_(linear.bias)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                nn.init.ones_(norm.weight)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.wq_phase is not None:
            split_phase_rows(state_dict, prefix, self.cfg)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def projection_weight(self, which: str) -> torch.Tensor:
        """W_q or W_k ("q" / "k") as one (heads * head_dim, dim) matrix: each head's amplitude rows,
        then its phase rows."""
        return self._joined(which, "weight")

    def projection_bias(self, which: str) -> torch.Tensor | None:
        """The bias of `projection_weight(which)` (same row order), or None without biases."""
        return self._joined(which, "bias")

    def _joined(self, which: str, kind: str) -> torch.Tensor | None:
        """The `kind` ("weight" / "bias") of W_q or W_k over every head's rows, amplitude then phase
        (the inverse of `split_phase_rows`)."""
        main, phase = (self.wq, self.wq_phase) if which == "q" else (self.wk, self.wk_phase)
        tensor = getattr(main, kind)
        if tensor is None or phase is None:
            return tensor
        heads, rest = tensor.shape[0] // self.amp_dim, tensor.shape[1:]
        rows = torch.cat([tensor.view(heads, self.amp_dim, *rest), getattr(phase, kind).view(heads, -1, *rest)], 1)
        return rows.view(-1, *rest)

    def project(self, x):
        """q (B, N, H, D), k and v (B, N, Hk, D) of x (B, N, dim), before any rotation (with
        qk_norm: each head of q and k normalized)."""
        cfg = self.cfg
        q = F.linear(x, self.projection_weight("q"), self.projection_bias("q"))
        k = F.linear(x, self.projection_weight("k"), self.projection_bias("k"))
        q = q.view(*x.shape[:2], cfg.n_heads, cfg.head_dim)
        k = k.view(*x.shape[:2], cfg.n_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.wv(x).view(*x.shape[:2], cfg.n_kv_heads, cfg.head_dim)
        return q, k, v

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

    def temper(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A global layer's query temperature (`ModelConfig.query_temperature_base`): q (B, N, H, D)
        at positions (B, N) scaled by 1 + scale * log1p(floor((p + 1) / base)); TAPA's amplitude
        part only (the phase is not a logit scale). Identity when off or for local layers."""
        cfg = self.cfg
        if self.local or not cfg.query_temperature_base:
            return q
        steps = torch.div(positions + 1, cfg.query_temperature_base, rounding_mode="floor")
        factor = (1 + cfg.query_temperature_scale * torch.log1p(steps.to(torch.float32)))
        factor = factor.to(q.dtype)[..., None, None]
        if self.family == "tapa":
            return torch.cat([q[..., :self.amp_dim] * factor, q[..., self.amp_dim:]], dim=-1)
        return q * factor

    def forward(self, x: torch.Tensor, ctx: AttentionContext, cache=None) -> torch.Tensor:
        """x (B, N, dim) at slots ctx.start ..; `cache` follows `tapa.model.cache`'s interface."""
        q, k, v = self.project(x)
        if self.family == "rope":
            q, k = ctx.rotate(q, self.cfg, self.local), ctx.rotate(k, self.cfg, self.local)
        elif self.family == "tapa":
            q = self._apply_phase_matrix(q)
        q = self.temper(q, ctx.query_positions)
        if ctx.parallel is not None:  # context parallelism: keys of other ranks, by global position
            if cache is not None:
                raise ValueError("context parallelism takes no KV cache")
            out = ctx.parallel.attend(q, k, v, self.attend_span, self.window)
            return self.wo(out.reshape(*x.shape[:2], -1))
        key_slots = 0
        if cache is not None:
            k, v, key_slots = cache.update(self.layer, k, v, ctx.start)
        elif ctx.start:
            raise ValueError(f"start position {ctx.start} needs a KV cache")
        if ctx.documents is not None:  # whole packed rows: each document alone, as under CP
            out = self.attend_span(q, k, v, 0, 0, documents=ctx.documents.span)
        else:
            out = self.attend(q, k, v, key_slots, ctx)
        return self.wo(out.reshape(*x.shape[:2], -1))

    def attend_span(self, q, k, v, q_offset: int, k_offset: int,
                    documents: SpanDocuments | None = None):
        """This layer's causal attention, unpadded, of queries q (B, Nq, H, D) at positions
        q_offset.. against keys k, v (B, Nk, Hk, D) at positions k_offset.., which end where the
        queries do. With documents (`SpanDocuments` of the keys), a query sees only its own
        document's keys; without, the span is one document."""
        cfg = self.cfg
        n_queries, n_keys = q.shape[1], k.shape[1]
        if q_offset + n_queries != k_offset + n_keys:
            raise ValueError(f"a span's keys ({k_offset}..{k_offset + n_keys - 1}) must end where its "
                             f"queries ({q_offset}..{q_offset + n_queries - 1}) do")
        labels = documents.labels if documents is not None else None
        if self.local:
            return local_attention(q, k, v, self.window, q_offset=q_offset, k_offset=k_offset,
                                   document_ids=labels)
        if self.family == "tapa":
            op_args = dict(impl=cfg.attn_impl, theta=cfg.theta, alpha=cfg.alpha,
                           distance=cfg.distance, phase=cfg.phase)
            if documents is None:
                return tapa_attention(q, k, v, causal=True, q_offset=q_offset, k_offset=k_offset,
                                      **op_args)
            # each document's queries against its keys, bottom-right aligned: their distances
            kept, cu_q, cu_k, longest_q, longest_k = documents.varlen(n_queries)
            if kept is None:
                k, v = k.flatten(0, 1), v.flatten(0, 1)
            else:
                kept = kept.to(k.device)
                k, v = k[kept], v[kept]
            out = tapa_attention_varlen(q.flatten(0, 1), k, v, cu_q.to(q.device), cu_k.to(q.device),
                                        longest_q, longest_k, causal=True, check_seqlens=False,
                                        **op_args)
            return out.view(*q.shape[:3], -1)
        if documents is not None:  # causal inside each document: a window as long as the span
            return local_attention(q, k, v, n_keys, q_offset=q_offset, k_offset=k_offset,
                                   document_ids=labels)
        if n_queries == n_keys:
            return _softmax(q, k, v, is_causal=True)
        # the queries are the last keys: causal aligned at the bottom right, no (Nq, Nk) mask
        return _softmax(q, k, v, bias=causal_lower_right(n_queries, n_keys))

    # --- each kind's attention: q (B, Nq, H, D) at slots ctx.start..; keys at key_slots -------
    def _tapa(self, q, k, v, key_slots, ctx: AttentionContext):
        """Global TAPA layers; their keys are always the slots 0 .. start + N - 1."""
        cfg = self.cfg
        op_args = dict(theta=cfg.theta, alpha=cfg.alpha, distance=cfg.distance, phase=cfg.phase)
        padding_ok = ctx.key_mask is None or ctx.left_pad is not None
        if padding_ok and decode_kernel_applies(q, k, v, cfg.attn_impl):  # few new tokens, no grad
            lengths = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
            # The lengths are valid by construction (every row holds all k.shape[1] >= Nq slots), so
            # their value check, a device sync per layer and step, is skipped. A left-padded row's
            # queries at padded slots see no key: their outputs are never used.
            return tapa_attention_with_kvcache(q, k, v, lengths, cache_leftpad=ctx.left_pad, impl="triton",
                                               check_lengths=False, **op_args)
        if ctx.key_mask is None:
            return tapa_attention(q, k, v, causal=True, q_offset=ctx.start, k_offset=key_slots,
                                  impl=cfg.attn_impl, **op_args)
        return _padded_tapa(q, k, v, ctx, impl=cfg.attn_impl, **op_args)

    def _global_softmax(self, q, k, v, key_slots, ctx: AttentionContext):
        """Keys are the slots 0 .. start + N - 1."""
        if ctx.start == 0:  # prefill, training: torch's choice of backend
            if ctx.key_mask is None:
                return _softmax(q, k, v, is_causal=True)
            return _softmax(q, k, v, mask=ctx.visible(torch.arange(k.shape[1], device=q.device)))
        with _without_cudnn():
            if ctx.key_mask is None and ctx.seq_len == 1 and k.shape[1] == ctx.start + 1:
                return _softmax(q, k, v)  # one new token after every cached one: it sees them all
            return _softmax(q, k, v, mask=ctx.visible(torch.arange(k.shape[1], device=q.device)))

    def _local(self, q, k, v, key_slots, ctx: AttentionContext):
        if ctx.key_mask is None and isinstance(key_slots, int):
            return local_attention(q, k, v, self.window, q_offset=ctx.start, k_offset=key_slots)
        if isinstance(key_slots, int):
            key_slots = torch.arange(key_slots, key_slots + k.shape[1], device=q.device)
        return _softmax(q, k, v, mask=ctx.visible(key_slots, self.window))


def _padded_tapa(q, k, v, ctx: AttentionContext, *, impl, **op_args):
    """A padded batch as packed sequences: each row's real queries against its real keys through
    the varlen op (positions count real tokens only, so distances skip the padding). The new
    tokens are a row's last slots, so its real queries are its last real keys: the varlen op's
    bottom-right alignment. Queries at padded slots get 0 (their outputs are never used)."""
    key_mask, query_mask, offsets, longest_q, longest_k = ctx.padded_sequences()
    packed = tapa_attention_varlen(q[query_mask], k[key_mask], v[key_mask], offsets[0], offsets[1],
                                   longest_q, longest_k, causal=True, impl=impl,
                                   check_seqlens=False, **op_args)
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    out[query_mask] = packed.to(out.dtype)
    return out
