"""`Attention.attend_span` with packed documents (`SpanDocuments`), the piece context parallelism
calls per chunk: queries at q_offset.. against keys k_offset.. that end with them, where documents
start before the span, inside it and on its edges. Each layer kind's span equals, in float64 to
1e-10, the same queries' rows of attention computed document by document over the whole row (each
document alone through the ops), for outputs and the q/k/v gradients, on fresh random packings."""

from __future__ import annotations

import pytest
import torch

from tapa.model import ModelConfig
from tapa.model.attention import Attention, SpanDocuments
from tapa.ops import tapa_attention
from tapa.ops.local import local_attention

HEADS, KV_HEADS, HEAD_DIM, LENGTH = 2, 1, 16, 48
WINDOW = 7
# name -> (model settings, layer): a local layer, a TAPA global, a softmax global
KINDS = {
    "local": (dict(pe="tapa", layer_pattern="LG", local_window=WINDOW), 0),
    "tapa": (dict(pe="tapa", theta=0.5, alpha=0.1), 0),
    "softmax": (dict(pe="nope"), 0),
}


def _layer(kind: str) -> Attention:
    settings, layer = KINDS[kind]
    cfg = ModelConfig(vocab_size=16, dim=HEADS * HEAD_DIM, n_layers=2, n_heads=HEADS,
                      n_kv_heads=KV_HEADS, attn_impl="reference", **settings)
    return Attention(cfg, layer)


def _labels(batch: int, gen: torch.Generator) -> torch.Tensor:
    """Random packings: document lengths 1-12 (many one-token documents)."""
    rows = []
    for _ in range(batch):
        lengths, total = [], 0
        while total < LENGTH:
            lengths.append(min(int(torch.randint(1, 13, (1,), generator=gen)), LENGTH - total))
            total += lengths[-1]
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)))
    return torch.stack(rows)


def _per_document(kind: str, layer: Attention, q, k, v, labels) -> torch.Tensor:
    """The whole row's attention, each document alone through the ops (the spec)."""
    out = torch.zeros_like(q)
    for row in range(q.shape[0]):
        for doc in labels[row].unique():
            index = (labels[row] == doc).nonzero().flatten()
            qs, ks, vs = (t[row:row + 1, index] for t in (q, k, v))
            if kind == "local":
                part = local_attention(qs, ks, vs, WINDOW)
            elif kind == "tapa":
                cfg = layer.cfg
                part = tapa_attention(qs, ks, vs, causal=True, impl="reference", theta=cfg.theta,
                                      alpha=cfg.alpha, distance=cfg.distance, phase=cfg.phase)
            else:
                part = local_attention(qs, ks, vs, len(index))  # causal softmax
            out[row, index] = part[0]
    return out


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("seed", range(4))
def test_a_span_over_packed_documents_equals_each_document_alone(kind, seed):
    gen = torch.Generator().manual_seed(seed)
    layer = _layer(kind)
    batch = 2
    q, k, v = (torch.randn(batch, LENGTH, heads, HEAD_DIM, generator=gen, dtype=torch.float64)
               for heads in (HEADS, KV_HEADS, KV_HEADS))
    labels = _labels(batch, gen)
    weights = torch.randn(batch, LENGTH, HEADS, HEAD_DIM, generator=gen, dtype=torch.float64)
    start = int(torch.randint(1, LENGTH - 8, (1,), generator=gen))
    end = int(torch.randint(start + 1, LENGTH + 1, (1,), generator=gen))
    # global layers see every key before; local ones the window's (a halo, as under CP)
    first = max(0, start - (WINDOW - 1)) if kind == "local" else 0

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = _per_document(kind, layer, *leaves, labels)[:, start:end]
    (want * weights[:, start:end]).sum().backward()
    want_grads = [t.grad for t in leaves]

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    lq, lk, lv = leaves
    got = layer.attend_span(lq[:, start:end], lk[:, first:end], lv[:, first:end], start, first,
                            documents=SpanDocuments(labels[:, first:end]))
    (got * weights[:, start:end]).sum().backward()
    scale = want.detach().abs().max()
    assert float((got - want).detach().abs().max() / scale) < 1e-10, (kind, start, end)
    for name, grad, want_grad in zip("qkv", (t.grad for t in leaves), want_grads):
        error = float((grad - want_grad).abs().max() / want_grad.abs().max())
        assert error < 1e-10, (kind, name, start, end, error)


def test_the_varlen_plan_of_a_span():
    """Queries 4..9 of keys 0..9 in one row: documents [0, 5), [5, 6), [6, 10). The queries' runs
    are 4 | 5 | 6..9; their keys 0..4 | 5 | 6..9; the keys before the first query's document are
    dropped (none here), and in a second row starting a document at its first query, they are."""
    labels = torch.tensor([[0, 0, 0, 0, 0, 1, 2, 2, 2, 2], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])
    kept, cu_q, cu_k, longest_q, longest_k = SpanDocuments(labels).varlen(6)
    assert kept.tolist() == [[True] * 10, [False] * 4 + [True] * 6]
    assert cu_q.tolist() == [0, 1, 2, 6, 12]
    assert cu_k.tolist() == [0, 5, 6, 10, 16]
    assert (longest_q, longest_k) == (6, 6)
    assert cu_q.dtype == cu_k.dtype == torch.int32


def test_a_span_whose_keys_do_not_end_with_its_queries_is_an_error():
    layer = _layer("tapa")
    q = torch.zeros(1, 4, HEADS, HEAD_DIM)
    k = torch.zeros(1, 6, KV_HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="must end where its queries"):
        layer.attend_span(q, k, k, 4, 0)
