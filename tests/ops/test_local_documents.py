"""Packed documents in sliding-window attention (local_attention(document_ids=)): every path
against each document attended alone (float64), outputs and the gradients of q, k and v; the
per-row FlexAttention block table against the element mask, block by block; FlexAttention on CPU
(forward only: torch 2.13 has no flex backward on CPU) keeping its compiled graph for a new
packing, and (marked slow) inductor's kernel with the table; "auto" on CPU is the chunked path. GPU tests (marked cuda) hold FlexAttention's gradients
and "auto"'s choice of it to the same reference."""

from __future__ import annotations

import pytest
import torch
from helpers import rel_rmse

from tapa.ops.local import local_attention, window_block_mask
from tapa.ops.local import window as local

HAS_CUDA = torch.cuda.is_available()
F64_TOL = 1e-10
BLOCK = 16  # the block of the CPU table tests: documents both shorter and longer than one


def _ids(*rows):
    """(B, N) labels 0, 1, ... from each row's document lengths."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row))
                        for row in rows])


def _inputs(batch, q_len, k_len, heads, kv_heads, head_dim, dtype=torch.float64, device="cpu"):
    gen = torch.Generator().manual_seed(q_len * 1000 + k_len)
    shapes = [(batch, q_len, heads, head_dim), (batch, k_len, kv_heads, head_dim),
              (batch, k_len, kv_heads, head_dim), (batch, q_len, heads, head_dim)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(device, dtype) for s in shapes]


def _each_document_alone(q, k, v, window, ids, q_offset=0, k_offset=0):
    """The reference: each document of each row through the dense spec without document_ids,
    its queries against its keys only, at their true positions."""
    shift = q_offset - k_offset
    rows = []
    for row in range(q.shape[0]):
        lengths = torch.unique_consecutive(ids[row], return_counts=True)[1].tolist()
        parts, first = [], 0
        for length in lengths:
            stop = first + length
            lo, hi = max(first - shift, 0), min(stop - shift, q.shape[1])  # its queries
            if lo < hi:
                parts.append(local_attention(
                    q[row:row + 1, lo:hi], k[row:row + 1, first:stop], v[row:row + 1, first:stop],
                    window, q_offset=q_offset + lo, k_offset=k_offset + first, impl="dense"))
            first = stop
        rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows, dim=0)


def _out_and_grads(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout.to(out.dtype))
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# (row document lengths, Nq, heads, kv_heads, window, q_offset, k_offset); Nk = the rows' length
CASES = {
    # documents shorter and longer than a block (16), boundaries inside blocks, GQA
    "ragged-gqa-w6": (([13, 1, 30, 9, 11], [2, 40, 1, 1, 20]), 64, 4, 2, 6, 0, 0),
    # the window spans several documents and the whole row: plain causal in each document (the
    # softmax global layers); one row is a single document
    "window-past-documents": (([20, 33, 11], [64]), 64, 2, 2, 100, 0, 0),
    "one-token-documents-mqa": (([1] * 20 + [44], [1] * 64), 64, 3, 1, 8, 0, 0),
    # a chunk of queries after 24 cached keys; a document runs across the cache boundary
    "chunked-prefill": (([10, 30, 3, 21], [4, 4, 50, 6]), 40, 4, 2, 20, 124, 100),
    "decode": (([40, 24], [60, 4]), 1, 4, 2, 32, 163, 100),
    "keys-beyond-queries": (([25, 25, 14], [7, 57]), 30, 2, 1, 12, 10, 0),  # later keys unseen
}


def _case(name, dtype=torch.float64):
    lengths, q_len, heads, kv_heads, window, q_offset, k_offset = CASES[name]
    ids = _ids(*lengths)
    q, k, v, dout = _inputs(ids.shape[0], q_len, ids.shape[1], heads, kv_heads, 8, dtype)
    return q, k, v, dout, window, ids, dict(q_offset=q_offset, k_offset=k_offset)


PATHS = {
    "dense": lambda q, k, v, w, ids, **kw: local_attention(q, k, v, w, document_ids=ids,
                                                           impl="dense", **kw),
    "chunked": lambda q, k, v, w, ids, **kw: local_attention(q, k, v, w, document_ids=ids,
                                                             impl="chunked", **kw),
    "chunked-block-7": lambda q, k, v, w, ids, q_offset, k_offset: local._chunked(
        q, k, v, w, q_offset, k_offset, 7, local._document_index(ids)),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CASES)
def test_paths_match_each_document_alone(name, path):
    q, k, v, dout, window, ids, offsets = _case(name)
    exact = _out_and_grads(lambda *t: _each_document_alone(*t, window, ids, **offsets), q, k, v,
                           dout)
    got = _out_and_grads(lambda *t: PATHS[path](*t, window, ids, **offsets), q, k, v, dout)
    errors = {key: rel_rmse(got[key], exact[key]) for key in exact}
    assert max(errors.values()) < F64_TOL, errors


@pytest.mark.parametrize("name", CASES)
def test_cases_need_the_document_mask(name):
    """Without the document condition every case's output moves: the tests above can fail."""
    q, k, v, _, window, ids, offsets = _case(name)
    window_only = local_attention(q, k, v, window, impl="dense", **offsets)
    assert rel_rmse(window_only, _each_document_alone(q, k, v, window, ids, **offsets)) > 1e-2


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", CASES)
def test_flex_mask_mod_matches_each_document_alone(name):
    """FlexAttention's mask_mod (eager flex_attention evaluates it on every element) in float64:
    the document labels at the right query and key indices under the offsets."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v, _, window, ids, offsets = _case(name)
    shift = offsets["q_offset"] - offsets["k_offset"]
    block_mask = window_block_mask(q.shape[1], k.shape[1], window, shift, "cpu", block=BLOCK,
                                   document_ids=local._document_index(ids))
    out = flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         block_mask=block_mask, enable_gqa=q.shape[2] != k.shape[2])
    expected = _each_document_alone(q, k, v, window, ids, **offsets)
    assert rel_rmse(out.transpose(1, 2), expected) < F64_TOL


# ---------------------------------------------------------------------------------------------
# The block table


def _element_mask(q_len, window, shift, ids):
    """(B, Nq, Nk) visibility, element by element: the window and the same label."""
    distance = (torch.arange(q_len)[:, None] + shift) - torch.arange(ids.shape[1])[None, :]
    same = ids[:, shift:shift + q_len, None] == ids[:, None, :]
    return (distance >= 0) & (distance < window) & same


def _block_kinds(block_mask):
    """(B, Qb, KVb) 0 absent, 1 partial, 2 full, read from the BlockMask's kv tables."""
    def flags(counts, indices):
        columns = torch.arange(indices.shape[-1])
        listed = columns[None, None, None, :] < counts[..., None].long()
        dense = torch.zeros(indices.shape, dtype=torch.bool)
        dense.scatter_(-1, indices.long(), listed)
        return dense[:, 0]

    partial = flags(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = flags(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    assert not (partial & full).any(), "a block both partial and full"
    return partial.long() + 2 * full.long()


def _misclassified(kinds, visible, block):
    """Blocks whose kind disagrees with the element mask: full ones with an invisible (or
    padding) element, absent ones with a visible element, partial ones that are all or nothing."""
    batch, q_len, k_len = visible.shape
    q_blocks, k_blocks = kinds.shape[1:]
    padded = torch.zeros(batch, q_blocks * block, k_blocks * block, dtype=torch.bool)
    padded[:, :q_len, :k_len] = visible
    tiles = padded.reshape(batch, q_blocks, block, k_blocks, block).transpose(2, 3)
    count = tiles.sum(dim=(-1, -2))
    expected = torch.where(count == 0, 0, torch.where(count == block * block, 2, 1))
    return (kinds != expected).nonzero().tolist()


TABLE_CASES = [(name, block) for name in CASES for block in (4, BLOCK)] + [
    ("window-past-documents", 128)]  # blocks longer than the row


@pytest.mark.parametrize("name,block", TABLE_CASES)
def test_block_table_classifies_each_block_by_its_elements(name, block):
    """Absent: no visible element; full: every element visible (so no padding); partial: some
    but not all. Exactly torch's create_block_mask, which reads the element mask, too."""
    from torch.nn.attention.flex_attention import create_block_mask

    _, _, _, _, window, ids, offsets = _case(name)
    q_len, shift = CASES[name][1], offsets["q_offset"] - offsets["k_offset"]
    document_ids = local._document_index(ids)
    ours = window_block_mask(q_len, ids.shape[1], window, shift, "cpu", block=block,
                             document_ids=document_ids)
    visible = _element_mask(q_len, window, shift, ids)
    assert _misclassified(_block_kinds(ours), visible, block) == []

    def mask_mod(b, h, q_idx, kv_idx):
        return visible[b, q_idx, kv_idx]

    torch_own = create_block_mask(mask_mod, ids.shape[0], None, q_len, ids.shape[1],
                                  device="cpu", BLOCK_SIZE=block)
    for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                  "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(ours, field), getattr(torch_own, field)), field


def test_block_table_check_catches_a_table_without_documents():
    """The window's own table marks blocks full across document boundaries: the check above
    fails it."""
    _, _, _, _, window, ids, _ = _case("window-past-documents")
    window_only = window_block_mask(64, 64, window, 0, "cpu", block=BLOCK)
    kinds = _block_kinds(window_only).expand(ids.shape[0], -1, -1)
    assert _misclassified(kinds, _element_mask(64, window, 0, ids), BLOCK) != []


def test_mask_mod_is_the_window_and_the_document():
    _, _, _, _, window, ids, offsets = _case("chunked-prefill")
    q_len, shift = CASES["chunked-prefill"][1], offsets["q_offset"] - offsets["k_offset"]
    mask_mod = window_block_mask(q_len, ids.shape[1], window, shift, "cpu",
                                 document_ids=local._document_index(ids)).mask_mod
    batch = torch.arange(ids.shape[0])[:, None, None]
    q_idx = torch.arange(q_len, dtype=torch.int32)[None, :, None]
    kv_idx = torch.arange(ids.shape[1], dtype=torch.int32)[None, None, :]
    assert torch.equal(mask_mod(batch, 0, q_idx, kv_idx), _element_mask(q_len, window, shift, ids))


# ---------------------------------------------------------------------------------------------
# Compiled FlexAttention on CPU (forward), and dispatch


@pytest.fixture
def roomy_recompile_limit():
    """Other tests may have compiled flex for other shapes; let these reach the kernel."""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=256):
        yield


# Nk = 300: documents of 1 and 5 tokens, and of more than two 128-blocks
PACKINGS = [([5, 150, 1, 144], [300]), ([1] * 20 + [130, 150], [100, 100, 100])]


def _flex_over_packings(q_len, q_offset):
    """local_attention(impl="flex") for several packings and windows (the whole-row window of
    the global layers among them) against the reference; the compiled graphs after the first."""
    from torch._dynamo.utils import counters

    q, k, v, _ = _inputs(2, q_len, 300, 4, 2, 16, torch.float32)
    graphs = None
    for lengths, window in zip(PACKINGS * 2, (64, 64, 300, 7)):
        ids = _ids(*lengths)
        with torch.no_grad():
            out = local_attention(q, k, v, window, q_offset=q_offset, impl="flex",
                                  document_ids=ids)
        graphs = counters["stats"]["unique_graphs"] if graphs is None else graphs
        expected = _each_document_alone(q.double(), k.double(), v.double(), window, ids,
                                        q_offset=q_offset)
        assert rel_rmse(out, expected) < 1e-5, (lengths, window)
    return counters["stats"]["unique_graphs"] - graphs


def test_flex_keeps_its_compiled_graph_for_new_packings(monkeypatch, roomy_recompile_limit):
    """The labels reach flex_attention as a tensor captured by the mask_mod: a new packing or
    window passes dynamo's guards (no new graph; dynamo's eager backend here, the guards are
    inductor's too), and its table is neither cached nor taken from the window's cache."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(local, "_compiled_flex",
                        torch.compile(flex_attention, backend="eager", dynamic=False))
    monkeypatch.setattr(local, "_flex_signatures", set())
    monkeypatch.setattr(local, "_block_masks", type(local._block_masks)())
    assert _flex_over_packings(300, 0) == 0
    assert len(local._block_masks) == 0
    assert [signature[-1] for signature in local._flex_signatures] == [True]  # documents


@pytest.mark.slow
@pytest.mark.parametrize("q_len,q_offset", [(300, 0), (150, 150)], ids=["training", "prefill"])
def test_compiled_flex_kernel_matches_each_document_alone(q_len, q_offset, roomy_recompile_limit):
    """Inductor's CPU kernel (forward), which skips absent blocks and the mask_mod in full ones:
    the table at work, and still one graph per shape. About 35 s cold on 2 cores."""
    assert _flex_over_packings(q_len, q_offset) == 0


def test_auto_with_documents_on_cpu_is_the_chunked_path(monkeypatch):
    calls = []
    chunked = local._chunked
    monkeypatch.setattr(local, "_chunked", lambda *a: calls.append(a[-1]) or chunked(*a))
    monkeypatch.setattr(local, "_flex", lambda *a: pytest.fail("flex on CPU"))
    q, k, v, _, window, ids, _ = _case("ragged-gqa-w6", torch.float32)
    q, k, v = (t.repeat(1, 3, 1, 1) for t in (q, k, v))  # Nq = 192: flex's size on CUDA
    out = local_attention(q, k, v, window, document_ids=ids.repeat(1, 3))
    assert len(calls) == 1 and calls[0] is not None
    assert rel_rmse(out, local_attention(q, k, v, window, document_ids=ids.repeat(1, 3),
                                         impl="dense")) < 1e-5


def test_a_document_is_a_run_of_equal_labels():
    """A label that comes back later starts another document, on every path."""
    q, k, v, _, _, _, _ = _case("ragged-gqa-w6")
    returning = torch.tensor([[0] * 20 + [1] * 4 + [0] * 40, [5] * 30 + [2] * 30 + [5] * 4])
    runs = torch.tensor([[0] * 20 + [1] * 4 + [2] * 40, [0] * 30 + [1] * 30 + [2] * 4])
    for impl in ("dense", "chunked"):
        assert torch.equal(local_attention(q, k, v, 64, impl=impl, document_ids=returning),
                           local_attention(q, k, v, 64, impl=impl, document_ids=runs))
    assert rel_rmse(local_attention(q, k, v, 64, impl="dense", document_ids=runs),
                    _each_document_alone(q, k, v, 64, runs)) < F64_TOL


@pytest.mark.parametrize("impl", ["auto", "chunked", "flex", "dense"])
def test_document_ids_shape_is_checked(impl):
    q = torch.randn(2, 8, 2, 16)
    for bad in (torch.zeros(2, 7, dtype=torch.long), torch.zeros(8, dtype=torch.long),
                torch.zeros(1, 8, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"document_ids must be \(batch, Nk\)"):
            local_attention(q, q, q, 4, impl=impl, document_ids=bad)


# ---------------------------------------------------------------------------------------------
# GPU: FlexAttention with documents, gradients included, and "auto" taking it


GPU_CASES = {  # (row document lengths, Nq, window, q_offset): Nk = 1000
    "training-w256": (([3, 400, 1, 1, 128, 467], [1000]), 1000, 256, 0),
    "global-layer": (([700, 300], [1] * 100 + [900]), 1000, 1000, 0),
    "prefill": (([600, 5, 395], [100] * 10), 300, 256, 700),
}


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", GPU_CASES)
def test_flex_with_documents_matches_each_document_alone_cuda(name, roomy_recompile_limit):
    lengths, q_len, window, q_offset = GPU_CASES[name]
    ids = _ids(*lengths).cuda()
    q, k, v, dout = _inputs(2, q_len, 1000, 4, 2, 64, torch.float32, "cuda")
    exact = _out_and_grads(
        lambda *t: _each_document_alone(*(x.double() for x in t), window, ids, q_offset=q_offset),
        q, k, v, dout)
    got = _out_and_grads(lambda *t: local_attention(*t, window, q_offset=q_offset, impl="flex",
                                                    document_ids=ids), q, k, v, dout)
    errors = {key: rel_rmse(got[key], exact[key]) for key in exact}
    assert max(errors.values()) < 1e-5, errors


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_auto_takes_flex_with_documents_on_cuda(monkeypatch, roomy_recompile_limit):
    calls = []
    flex = local._flex
    monkeypatch.setattr(local, "_flex", lambda *a: calls.append(a[-1] is not None) or flex(*a))
    ids = _ids([100, 412], [512]).cuda()
    q, k, v, _ = _inputs(2, 512, 512, 4, 2, 64, torch.bfloat16, "cuda")
    local_attention(q, k, v, 128, document_ids=ids)
    local_attention(q[:, -1:], k, v, 128, q_offset=511, document_ids=ids)  # decoding: chunked
    assert calls == [True]


def test_one_table_per_labels_tensor_while_it_is_unchanged(monkeypatch):
    """The layers of a forward pass share their labels tensor: its index and each FlexAttention
    table are made once for it; a changed (in place) or new labels tensor gets its own."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    built = []
    monkeypatch.setattr(local, "window_block_mask",
                        lambda *args, **kwargs: built.append(args) or object())
    labels = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])
    first = local._packed_documents(labels, "cpu")
    assert local._packed_documents(labels, "cpu") is first
    assert first.index.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]
    table = local._block_mask(8, 8, 4, 0, "cpu", first)
    assert local._block_mask(8, 8, 4, 0, "cpu", first) is table and len(built) == 1
    local._block_mask(8, 8, 3, 0, "cpu", first)  # another window: another table
    assert len(built) == 2
    labels[0, 5:] = 3  # in place: the version counter moves, the labels are read again
    again = local._packed_documents(labels, "cpu")
    assert again is not first and again.masks == {}
    equal = labels.clone()  # equal labels in another tensor: no identity to go by, made afresh
    assert local._packed_documents(equal, "cpu") is not again
