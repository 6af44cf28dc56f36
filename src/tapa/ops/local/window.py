"""Causal sliding-window softmax attention: the attention of the model's local (RoPE) layers.

Query i sits at position q_offset + i and key j at k_offset + j. A query at position p sees the
key at position s iff

    0 <= p - s < window                  (itself and the window - 1 positions before it)

    out[i] = sum over visible j of softmax_j(q_i . k_j / sqrt(D)) * v[j]

Layout (batch, seqlen, heads, head_dim), as flash_attn_func; k and v may have fewer heads than q
(GQA/MQA, heads % kv_heads == 0), and query head h reads kv head h // (heads // kv_heads).
Every query must see at least its own position: the keys must cover the queries,
k_offset <= q_offset and q_offset + Nq <= k_offset + Nk. Training has q_offset = k_offset = 0 and
Nq = Nk; decoding and chunked prefill pass the last Nq positions of the keys
(q_offset + Nq == k_offset + Nk). Keys after a query's own position, or window or more before it,
are simply not seen.

Packed documents (document_ids (B, Nk), a label per key; query i is key i + q_offset - k_offset):
a document is a run of equal labels in a row, and a query also sees only keys of its own document.
Every path takes them: its window then starts at max(p - window + 1, its document's first key).

Three implementations of the one function:
- `dense_local_attention`: materializes the (Nq, Nk) mask ((B, Nq, Nk) with documents) and the
  scores; the spec, float64-capable.
- `chunked_local_attention`: query blocks of C rows, each against only its own key span of at most
  C + window - 1 keys (SDPA with a (C, C + window - 1) boolean mask). Exact, differentiable,
  memory O(N * (C + window)); never an N x N tensor. CPU, and wherever FlexAttention is missing.
- FlexAttention (`impl="flex"`): `torch.nn.attention.flex_attention`, compiled once with
  dynamic=False, with a BlockMask built from the window arithmetic (a block table of
  (Nq/128) x (Nk/128) entries, never an element mask; with documents one table per row, from each
  query's first visible key). The mask_mod captures the position shift and the window as 0-d
  tensors and the document labels as a tensor, so a new offset, window or packing reuses the
  compiled kernel; each new (shape, dtype, grad mode, documents or not) compiles once. Tables
  without documents are cached by their sizes; with documents, by the labels tensor while it lives
  unchanged (the layers of a forward pass share one), so each is made once a pass.

`local_attention` checks the arguments and dispatches; impl="auto" takes FlexAttention on CUDA for
query blocks of 128 rows and more (fp16/bf16/fp32), with or without documents, the chunked path
otherwise: decoding steps, CPU, float64, a FlexAttention that failed to import or to compile (with
a warning), and new shapes once dynamo's recompile limit is reached (past it torch would run
flex_attention unfused, with an N x N score matrix). Inside a model compiled by the caller, the
outer graph takes flex_attention itself and the block table is made outside it (a graph break).
"""

from __future__ import annotations

import math
import operator
import warnings
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

IMPLS = ("auto", "flex", "chunked", "dense")
FLEX_BLOCK = 128  # FlexAttention's sparse block size (rows and columns of one block-table entry)
FLEX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_BLOCK_MASK_CACHE_SIZE = 32


# ---------------------------------------------------------------------------------------------
# Argument checks


def _as_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def check_local_arguments(q, k, v, window, q_offset, k_offset):
    """(window, q_offset, k_offset) as ints, or a ValueError naming the bad argument."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, seqlen, heads, head_dim), got "
                             f"{tuple(tensor.shape)}")
        if not tensor.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {q.shape[0]} and "
                         f"{k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[3]} and {k.shape[3]}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"q heads ({q.shape[2]}) must be a multiple of k/v heads ({k.shape[2]})")
    window = _as_int("window", window, 1)
    q_offset = _as_int("q_offset", q_offset, 0)
    k_offset = _as_int("k_offset", k_offset, 0)
    q_len, k_len = q.shape[1], k.shape[1]
    if q_len and not (k_offset <= q_offset and q_offset + q_len <= k_offset + k_len):
        raise ValueError(
            f"the keys must cover every query's own position: queries sit at "
            f"[{q_offset}, {q_offset + q_len}) (q_offset={q_offset}, Nq={q_len}), keys at "
            f"[{k_offset}, {k_offset + k_len}) (k_offset={k_offset}, Nk={k_len})")
    return window, q_offset, k_offset


# ---------------------------------------------------------------------------------------------
# The spec: a materialized mask


def _dense(q, k, v, window, q_offset, k_offset, document_ids=None):
    batch, q_len, heads, head_dim = q.shape
    k_len, kv_heads = k.shape[1], k.shape[2]
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    q_pos = torch.arange(q_offset, q_offset + q_len, device=q.device)
    k_pos = torch.arange(k_offset, k_offset + k_len, device=q.device)
    distance = q_pos[:, None] - k_pos[None, :]
    visible = (distance >= 0) & (distance < window)
    if document_ids is not None:  # (B, 1, 1, Nq, Nk) over (batch, kv head, group): and the
        own = document_ids[:, q_pos - k_offset]  # query's own document
        visible = (visible & (own[:, :, None] == document_ids[:, None, :]))[:, None, None]
    bias = torch.zeros(visible.shape, dtype=compute, device=q.device).masked_fill(~visible,
                                                                                float("-inf"))
    # query heads grouped onto their kv head (h = kv_head * group + g), never repeating k and v
    grouped_q = q.to(compute).reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim)
    scores = torch.einsum("bihgd,bjhd->bhgij", grouped_q, k.to(compute)) / math.sqrt(head_dim)
    probs = torch.softmax(scores + bias, dim=-1)
    out = torch.einsum("bhgij,bjhd->bihgd", probs, v.to(compute))
    return out.reshape(batch, q_len, heads, head_dim).to(q.dtype)


def dense_local_attention(q, k, v, window: int, *, q_offset: int = 0,
                          k_offset: int = 0) -> torch.Tensor:
    """The spec (module docstring) with the (Nq, Nk) mask materialized as a float bias.

    Scores and softmax in float32 for half-precision inputs, in float64 for float64 inputs; the
    output is cast back to q's dtype. Memory O(Nq * Nk): tests and short sequences only.
    """
    window, q_offset, k_offset = check_local_arguments(q, k, v, window, q_offset, k_offset)
    return _dense(q, k, v, window, q_offset, k_offset)


# ---------------------------------------------------------------------------------------------
# Chunked: query blocks against their own key span


def default_block_size(window: int) -> int:
    """Query rows per block of the chunked path: about the window (64..512), so that the key
    span (block + window - 1) stays within a small multiple of the work a query needs."""
    return min(512, max(64, window))


def _attend_block(q_block, k_span, v_span, mask, gqa):
    """SDPA of one query block (B, H, C, D) against its key span (B, Hk, S, D)."""
    return F.scaled_dot_product_attention(q_block, k_span, v_span, attn_mask=mask,
                                          enable_gqa=gqa)


def document_starts(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, N) index of each token's document's first token, for labels (B, N) that are equal
    within a document and change where a new one starts (and at each row's start)."""
    batch, length = document_ids.shape
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    index = torch.arange(length, device=document_ids.device).expand(batch, length)
    return torch.where(starts, index, 0).cummax(-1).values


def _document_index(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, N) int32 index of each token's document in its row (a new one wherever the label
    changes): equal indices then mean one run, as the label comparisons of every path assume,
    even for labels that come back (0, 0, 1, 0)."""
    changes = torch.zeros_like(document_ids, dtype=torch.int32)
    changes[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return changes.cumsum(-1, dtype=torch.int32)


class _PackedDocuments:
    """A caller's document labels as the paths read them: `index` (`_document_index`) and the
    FlexAttention tables made from it, by (Nq, Nk, window, shift). Kept per labels tensor while it
    lives and is unchanged (`_packed_documents`): the layers of one forward pass (and their
    recomputation under activation checkpointing) pass the same labels, so each table is made
    once a pass, not once a layer."""

    def __init__(self, index: torch.Tensor, version: int | None = None):
        self.index, self.version, self.masks = index, version, {}


_packed = WeakIdKeyDictionary()  # a caller's labels -> its _PackedDocuments


def _packed_documents(labels: torch.Tensor, device) -> _PackedDocuments:
    """The labels' _PackedDocuments on `device`: the cached one while `labels` is the same,
    unchanged tensor (its version counter), else made afresh (and always inside a compiled graph,
    where the outer compile owns the work)."""
    if torch.compiler.is_compiling():
        return _PackedDocuments(_document_index(labels.to(device)))
    found = _packed.get(labels)
    if found is None or found.version != labels._version or found.index.device != torch.device(device):
        found = _PackedDocuments(_document_index(labels.to(device)), labels._version)
        _packed[labels] = found
    return found


def _chunked(q, k, v, window, q_offset, k_offset, block_size, document_ids=None):
    batch, q_len, heads, head_dim = q.shape
    if q_len == 0:
        return q.new_zeros(batch, 0, heads, head_dim)
    shift = q_offset - k_offset  # query i's own position is key index i + shift
    if document_ids is not None:
        # no block's span reaches before its first query's document (in any row)
        doc_start = document_starts(document_ids).amin(0).tolist()
    gqa = heads != k.shape[2]
    q_heads_first, k_heads_first, v_heads_first = (t.transpose(1, 2) for t in (q, k, v))
    outs = []
    for start in range(0, q_len, block_size):
        stop = min(start + block_size, q_len)
        span_start = max(0, start + shift - window + 1)
        if document_ids is not None:
            span_start = max(span_start, doc_start[start + shift])
        span_stop = stop + shift  # one past the last query's own key; the checks keep it <= Nk
        if stop - start == 1 and document_ids is None:
            mask = None  # one query (decoding), whose span is its window: every key is visible
        else:
            rows = torch.arange(start + shift, stop + shift, device=q.device)
            cols = torch.arange(span_start, span_stop, device=q.device)
            distance = rows[:, None] - cols[None, :]
            mask = (distance >= 0) & (distance < window)
            if document_ids is not None:  # (B, 1, C, S): and in the query's own document
                same = (document_ids[:, start + shift:stop + shift, None]
                        == document_ids[:, None, span_start:span_stop])
                mask = (mask[None] & same)[:, None]
        outs.append(_attend_block(q_heads_first[:, :, start:stop],
                                  k_heads_first[:, :, span_start:span_stop],
                                  v_heads_first[:, :, span_start:span_stop], mask, gqa))
    return torch.cat(outs, dim=2).transpose(1, 2)


def chunked_local_attention(q, k, v, window: int, *, q_offset: int = 0, k_offset: int = 0,
                            block_size: int | None = None) -> torch.Tensor:
    """The spec by query blocks of `block_size` rows (default: `default_block_size(window)`).

    Each block attends to keys [block_first_pos - window + 1, block_last_pos] only, through SDPA
    with a boolean (block, block + window - 1) mask: exact, differentiable, memory
    O(N * (block + window)), no N x N tensor.
    """
    window, q_offset, k_offset = check_local_arguments(q, k, v, window, q_offset, k_offset)
    block = default_block_size(window) if block_size is None else _as_int("block_size",
                                                                          block_size, 1)
    return _chunked(q, k, v, window, q_offset, k_offset, block)


# ---------------------------------------------------------------------------------------------
# FlexAttention


_compiled_flex = None
_block_masks: OrderedDict = OrderedDict()
_flex_signatures: set = set()  # (shapes, strides, dtype, device, grad) sent to the compiled op
_flex_failures: dict = {}  # (device type, dtype, head_dim, gqa) -> why flex failed in "auto"
_budget_warned = False


def _flex_api():
    """The torch.nn.attention.flex_attention module, or a RuntimeError saying why not."""
    try:
        from torch.nn.attention import flex_attention as flex_module
    except ImportError as err:
        raise RuntimeError(f"local_attention(impl='flex') needs torch.nn.attention.flex_attention"
                           f" (torch {torch.__version__}): {err}") from err
    return flex_module


def _compiled():
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(_flex_api().flex_attention, dynamic=False)
    return _compiled_flex


def _ordered_blocks(blocks: torch.Tensor):
    """Block flags (1 or B, Qb, KVb) -> (count per row, column indices with the set ones first),
    shaped (1 or B, 1, ...) to broadcast over heads, as BlockMask stores them."""
    counts = blocks.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)
    return counts[:, None], indices.to(torch.int32)[:, None]


def window_block_mask(q_len: int, k_len: int, window: int, shift: int, device,
                      block: int = FLEX_BLOCK, document_ids: torch.Tensor | None = None):
    """FlexAttention BlockMask of the window: query i sees key j iff 0 <= i + shift - j < window,
    and, given document_ids (B, Nk) (each label one run of keys, as `_document_index` makes
    them), iff also document_ids[b, i + shift] == document_ids[b, j]: one block table per row.

    Built from block arithmetic, never from an element mask: query i sees the keys from its first
    visible one (window start, or its document's first key) to its own, two ends that never
    decrease with i; so a block's corners decide it. A block is partial where the window or a
    document boundary cuts it or where it overhangs the sequence end (as create_block_mask pads),
    full where every element is visible, absent where none is.
    """
    flex = _flex_api()
    own = torch.arange(q_len, device=device) + shift  # each query's own key index
    first_visible = (own - window + 1)[None]  # (1, Nq), or (B, Nq) with documents
    if document_ids is not None:
        first_visible = torch.maximum(first_visible, document_starts(document_ids)[:, own])
    q_first = torch.arange(0, q_len, block, device=device)
    k_first = torch.arange(0, k_len, block, device=device)
    q_last = torch.clamp(q_first + block, max=q_len) - 1
    k_last = torch.clamp(k_first + block, max=k_len) - 1
    whole = ((q_last - q_first + 1) == block)[:, None] & ((k_last - k_first + 1) == block)[None, :]
    # full: the last query sees back to the first key, the first query up to the last key
    full = whole & (first_visible[:, q_last, None] <= k_first) & (
        q_first[:, None] + shift >= k_last[None, :])
    # touched: the first query sees back to the last key, the last query up to the first key
    # (then the first query whose own key is at or past the first key sees a key of the block)
    touched = (first_visible[:, q_first, None] <= k_last) & (
        q_last[:, None] + shift >= k_first[None, :])
    partial = touched & ~full
    shift_t = torch.tensor(shift, dtype=torch.int32, device=device)
    window_t = torch.tensor(window, dtype=torch.int32, device=device)

    def sliding_window(batch, head, q_idx, kv_idx):
        distance = q_idx + shift_t - kv_idx
        return (distance >= 0) & (distance < window_t)

    def window_in_document(batch, head, q_idx, kv_idx):
        return sliding_window(batch, head, q_idx, kv_idx) & (
            document_ids[batch, q_idx + shift_t] == document_ids[batch, kv_idx])

    return flex.BlockMask.from_kv_blocks(
        *_ordered_blocks(partial), *_ordered_blocks(full), BLOCK_SIZE=block,
        mask_mod=sliding_window if document_ids is None else window_in_document,
        seq_lengths=(q_len, k_len))


def _cached_block_mask(q_len, k_len, window, shift, device):
    key = (q_len, k_len, window, shift, str(device))
    mask = _block_masks.get(key)
    if mask is None:
        mask = window_block_mask(q_len, k_len, window, shift, device)
        _block_masks[key] = mask
        if len(_block_masks) > _BLOCK_MASK_CACHE_SIZE:
            _block_masks.popitem(last=False)
    else:
        _block_masks.move_to_end(key)
    return mask


def _recompile_limit() -> int:
    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8)))


def _flex_signature(q, k, v, documents: bool = False):
    """What one compiled flex_attention is specialized on; the document mask_mod and its per-row
    block table make another kernel than the window alone."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return (tuple(q.shape), tuple(k.shape), q.stride(), k.stride(), v.stride(), q.dtype,
            str(q.device), grad, documents)


def _flex_budget_left(q, k, v, documents: bool = False) -> bool:
    """Whether the compiled op can take these inputs without passing dynamo's recompile limit,
    past which torch silently runs flex_attention unfused, with an N x N score matrix."""
    signature = _flex_signature(q, k, v, documents)
    return signature in _flex_signatures or len(_flex_signatures) < _recompile_limit()


def _block_mask(q_len, k_len, window, shift, device, documents):
    """The window's cached table, or the documents' own (made once for these labels)."""
    if documents is None:
        return _cached_block_mask(q_len, k_len, window, shift, device)
    key = (q_len, k_len, window, shift)
    if key not in documents.masks:
        documents.masks[key] = window_block_mask(q_len, k_len, window, shift, device,
                                                 document_ids=documents.index)
    return documents.masks[key]


def _flex(q, k, v, window, q_offset, k_offset, documents=None):
    flex = _flex_api()
    shift = q_offset - k_offset
    gqa = q.shape[2] != k.shape[2]
    table_args = (q.shape[1], k.shape[1], window, shift, q.device, documents)
    if torch.compiler.is_compiling():  # inside a compiled model: the outer graph fuses flex
        # The block table is made outside the graph (a graph break): inductor lowers a
        # flex_attention whose table is a graph input, but failed (torch 2.13, CPU) on one
        # computed inside the graph.
        block_mask = torch.compiler.disable(_block_mask)(*table_args)
        attend = flex.flex_attention
    else:
        block_mask = _block_mask(*table_args)
        attend = _compiled()
        _flex_signatures.add(_flex_signature(q, k, v, documents is not None))
    out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask,
                 enable_gqa=gqa)
    return out.transpose(1, 2)


def _is_fatal(err: Exception) -> bool:
    """Errors that a fallback must not hide: out of memory, or a device fault (the context is
    poisoned after one)."""
    return (isinstance(err, torch.OutOfMemoryError)
            or isinstance(err, getattr(torch, "AcceleratorError", ()))
            or "CUDA error" in str(err))


def _auto(q, k, v, window, q_offset, k_offset, documents=None):
    global _budget_warned
    flex_shape = q.is_cuda and q.dtype in FLEX_DTYPES and q.shape[1] >= FLEX_BLOCK
    if flex_shape and torch.compiler.is_compiling():  # the outer compile owns flex's kernel
        return _flex(q, k, v, window, q_offset, k_offset, documents)
    masked = documents is not None
    failure_key = (q.device.type, q.dtype, q.shape[3], q.shape[2] != k.shape[2], masked)
    if flex_shape and failure_key not in _flex_failures:
        if _flex_budget_left(q, k, v, masked):
            try:
                return _flex(q, k, v, window, q_offset, k_offset, documents)
            except Exception as err:  # noqa: BLE001 - import or compile failure: say why, fall back
                if _is_fatal(err):
                    raise
                _flex_failures[failure_key] = err
                warnings.warn(f"local_attention: FlexAttention failed for {failure_key}, using "
                              f"the chunked path instead: {str(err).splitlines()[0][:300]}",
                              stacklevel=3)
        elif not _budget_warned:
            _budget_warned = True
            warnings.warn(f"local_attention: FlexAttention was compiled for "
                          f"{len(_flex_signatures)} input shapes, dynamo's recompile limit; new "
                          f"shapes take the chunked path", stacklevel=3)
    return _chunked(q, k, v, window, q_offset, k_offset, default_block_size(window),
                    None if documents is None else documents.index)


def local_attention(q, k, v, window: int, *, q_offset: int = 0, k_offset: int = 0,
                    impl: str = "auto", document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Causal sliding-window softmax attention, scale 1/sqrt(head_dim).

    q (B, Nq, H, D), k/v (B, Nk, Hk, D) (GQA: H % Hk == 0). Query i sits at position q_offset+i,
    key j at k_offset+j; query at p sees key at s iff 0 <= p - s < window (itself and the
    window-1 before it). The keys must cover every query's own position (k_offset <= q_offset,
    q_offset + Nq <= k_offset + Nk). Returns (B, Nq, H, D) in q's dtype.

    impl: "auto" (FlexAttention on CUDA for Nq >= 128 in fp16/bf16/fp32, else the chunked
    fallback; a FlexAttention that fails to import or compile falls back with a warning),
    "flex" (FlexAttention or a RuntimeError), "chunked", "dense" (materialized float mask; the
    test reference).

    document_ids: (B, Nk) labels of the keys' documents (packed rows; query i is the key at its
    position, i + q_offset - k_offset; a document is a run of equal labels): a query also sees
    only keys of its own document. Every impl takes them, and "auto" chooses as without them
    (FlexAttention with a per-row block table and the labels in its mask_mod on CUDA, the chunked
    path elsewhere); no path builds an (N, N) mask but "dense".
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    window, q_offset, k_offset = check_local_arguments(q, k, v, window, q_offset, k_offset)
    if document_ids is not None:
        if tuple(document_ids.shape) != (k.shape[0], k.shape[1]):
            raise ValueError(f"document_ids must be (batch, Nk) = {(k.shape[0], k.shape[1])}, got "
                             f"{tuple(document_ids.shape)}")
    documents = None if document_ids is None else _packed_documents(document_ids, q.device)
    index = None if documents is None else documents.index
    if impl == "dense":
        return _dense(q, k, v, window, q_offset, k_offset, index)
    if impl == "chunked":
        return _chunked(q, k, v, window, q_offset, k_offset, default_block_size(window), index)
    if q.shape[1] == 0:
        return q.new_zeros(q.shape)
    if impl == "flex":
        return _flex(q, k, v, window, q_offset, k_offset, documents)
    return _auto(q, k, v, window, q_offset, k_offset, documents)
