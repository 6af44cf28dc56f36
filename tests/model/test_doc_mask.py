"""Document masking: a packed row gives each document's logits as if it were alone."""

import pytest
import torch

from tapa.model import Documents, ModelConfig, TapaLM

VOCAB, EOT = 61, 0
# documents of one row, each ending with EOT except the row's last (cut by the window)
LENGTHS = [(7, 1, 12, 20), (25, 15), (40,)]


def _model(pe, pattern, temperature_base=0):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, dim=48, n_layers=4, n_heads=4, n_kv_heads=2, pe=pe,
                      layer_pattern=pattern, local_window=6, init_std=0.2,
                      query_temperature_base=temperature_base, query_temperature_scale=0.5)
    return TapaLM(cfg).double().eval()


def _rows(seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows, docs = [], []
    for lengths in LENGTHS:
        row, row_docs = [], []
        for i, n in enumerate(lengths):
            doc = torch.randint(1, VOCAB, (n,), generator=gen)
            if i < len(lengths) - 1:
                doc[-1] = EOT
            row.append(doc)
            row_docs.append(doc)
        rows.append(torch.cat(row))
        docs.append(row_docs)
    return torch.stack(rows), docs


def test_documents_from_tokens():
    ids = torch.tensor([[5, 0, 3, 3, 0, 0, 7], [0, 1, 2, 3, 4, 5, 6]])
    docs = Documents.from_tokens(ids, eot_id=0)
    assert docs.ids.tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]
    assert docs.positions.tolist() == [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5]]
    assert docs.cu_seqlens.tolist() == [0, 2, 5, 6, 7, 8, 14]
    assert docs.cu_seqlens.dtype == torch.int32 and docs.max_seqlen == 6


def _with_kv_cache(model, doc):
    """The document's logits through the KV cache: its first half prefilled, then one token a step."""
    cache = model.new_kv_cache(1, len(doc))
    half = max(1, len(doc) // 2)
    parts = [model(doc[None, :half], 0, cache)[0]]
    for slot in range(half, len(doc)):
        parts.append(model(doc[None, slot:slot + 1], slot, cache)[0])
    return torch.cat(parts)


# the global layers' query temperature (base 4: it changes every document longer than 3 tokens)
# follows each token's position inside its document, as a document alone has it
@pytest.mark.parametrize("pe, pattern, temperature_base",
                         [("tapa", "G", 0), ("rope", "G", 0), ("nope", "G", 0), ("tapa", "LLLG", 0),
                          ("nope", "LLLG", 0), ("rope-yarn", "LG", 0), ("tapa", "LLLG", 4),
                          ("nope", "LLLG", 4)])
def test_packed_row_equals_each_document_alone(pe, pattern, temperature_base):
    model = _model(pe, pattern, temperature_base)
    ids, docs = _rows()
    with torch.no_grad():
        packed = model(ids, document_ids=Documents.from_tokens(ids, EOT))
        crossing = model(ids)
    for row, row_docs in enumerate(docs):
        start = 0
        for doc in row_docs:
            with torch.no_grad():
                alone = model(doc[None])[0]
                cached = _with_kv_cache(model, doc)
            got = packed[row, start:start + len(doc)]
            assert float((got - alone).norm() / alone.norm()) < 1e-10, (row, start)
            # and as served: the document alone through the KV cache, a prefill then token by token
            assert float((got - cached).norm() / cached.norm()) < 1e-10, (row, start)
            start += len(doc)
    # without the mask, later documents do see earlier ones
    assert float((crossing[0, 8:] - packed[0, 8:]).abs().max()) > 1e-6


def test_gradients_stay_inside_documents():
    model = _model("tapa", "LLLG")
    ids, _ = _rows(seed=1)
    embeddings = model.embed(ids).detach().requires_grad_()
    from tapa.model.attention import AttentionContext

    ctx = AttentionContext.build(ids.shape[0], 0, ids.shape[1], ids.device,
                                 documents=Documents.from_tokens(ids, EOT))
    hidden = model.blocks(embeddings, ctx)
    hidden[0, 7:8].sum().backward()  # the second document of row 0 is the one token at slot 7
    grad = embeddings.grad[0].abs().sum(-1)
    assert float(grad[:7].max()) == 0 and float(grad[8:].max()) == 0 and float(grad[7]) > 0


def test_document_ids_refuse_a_cache_and_padding():
    model = _model("tapa", "G")
    ids, _ = _rows()
    docs = Documents.from_tokens(ids, EOT)
    with pytest.raises(ValueError, match="document masking"):
        model(ids, attention_mask=torch.ones_like(ids), document_ids=docs)
    cache = model.new_kv_cache(ids.shape[0], ids.shape[1] + 1)
    model(ids[:, :1], 0, cache)
    with pytest.raises(ValueError, match="document masking"):
        model(ids[:, 1:], 1, cache, document_ids=torch.zeros_like(ids[:, 1:]))
    with pytest.raises(ValueError, match="document_ids must be"):
        model(ids, document_ids=docs.ids[:, :-1])
