"""Sliding-window attention (tapa.ops.local): every path against the dense float64 spec,
forward and the gradients of q, k and v; locality; bounded memory of the chunked path; argument
checks; the FlexAttention block table against torch's own create_block_mask. GPU tests (marked
cuda) hold FlexAttention to the same spec."""

from __future__ import annotations

import pytest
import torch
from helpers import rel_rmse

from tapa.ops.local import window as local
from tapa.ops.local import (chunked_local_attention, dense_local_attention,
                                   local_attention, window_block_mask)

HAS_CUDA = torch.cuda.is_available()
F64_TOL = 1e-10


def _inputs(batch, q_len, k_len, heads, kv_heads, head_dim, dtype=torch.float64, device="cpu",
            seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, q_len, heads, head_dim), (batch, k_len, kv_heads, head_dim),
              (batch, k_len, kv_heads, head_dim), (batch, q_len, heads, head_dim)]
    q, k, v, dout = (torch.randn(s, generator=gen, dtype=torch.float64).to(device, dtype)
                     for s in shapes)
    return q, k, v, dout


def _out_and_grads(fn, q, k, v, dout, window, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, window, **kwargs)
    out.backward(dout.to(out.dtype))
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _errors(fn, q, k, v, dout, window, **kwargs):
    """{tensor: rel. RMSE vs the dense float64 spec} for fn on (q, k, v)."""
    exact = _out_and_grads(dense_local_attention, q.double(), k.double(), v.double(), dout,
                           window, **kwargs)
    got = _out_and_grads(fn, q, k, v, dout, window, **kwargs)
    return {name: rel_rmse(got[name], exact[name]) for name in exact}


# (batch, Nq, Nk, heads, kv_heads, head_dim, window, q_offset, k_offset)
CASES = {
    "ragged-w3": (2, 300, 300, 4, 4, 16, 3, 0, 0),            # N not a multiple of the block
    "n-below-window": (1, 50, 50, 2, 2, 8, 256, 0, 0),
    "several-windows-gqa": (2, 1000, 1000, 4, 2, 8, 256, 0, 0),
    "mqa-w37": (1, 777, 777, 6, 1, 8, 37, 0, 0),
    "decode-1": (2, 1, 263, 4, 2, 8, 256, 1041, 779),         # Nk = window + 7, k_offset > 0
    "decode-5": (1, 5, 263, 4, 2, 8, 256, 1037, 779),
    "prefill-chunk": (1, 130, 400, 4, 2, 8, 200, 1270, 1000),  # a chunk after 270 cached keys
    "keys-beyond-queries": (1, 60, 200, 2, 1, 8, 16, 30, 0),    # later keys are never seen
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_chunked_matches_dense_float64(case):
    batch, q_len, k_len, heads, kv_heads, head_dim, window, q_offset, k_offset = case
    q, k, v, dout = _inputs(batch, q_len, k_len, heads, kv_heads, head_dim, seed=q_len)
    errors = _errors(chunked_local_attention, q, k, v, dout, window, q_offset=q_offset,
                     k_offset=k_offset)
    assert max(errors.values()) < F64_TOL, errors


@pytest.mark.parametrize("block_size", [1, 7, 64, 1000])
def test_chunked_exact_for_any_block_size(block_size):
    q, k, v, dout = _inputs(1, 300, 300, 2, 1, 8, seed=block_size)
    errors = _errors(lambda *a, **kw: chunked_local_attention(*a, block_size=block_size, **kw),
                     q, k, v, dout, 40)
    assert max(errors.values()) < F64_TOL, errors


def test_window_one_is_the_value_itself():
    """Each query sees only its own key: out = v (of its kv head), and q and k get no gradient."""
    q, k, v, dout = _inputs(2, 150, 150, 4, 2, 8)
    for impl in ("chunked", "dense", "auto"):
        got = _out_and_grads(lambda *a: local_attention(*a, impl=impl), q, k, v, dout, 1)
        assert torch.allclose(got["out"], v.repeat_interleave(2, dim=2), rtol=0, atol=1e-14)
        assert got["dq"].abs().max() < 1e-14 and got["dk"].abs().max() < 1e-14
        assert torch.allclose(got["dv"], dout.reshape(2, 150, 2, 2, 8).sum(3), atol=1e-14)


def test_auto_on_cpu_is_the_chunked_path(monkeypatch):
    calls = []
    monkeypatch.setattr(local, "_chunked", lambda *a: calls.append(a) or a[0].clone())
    q, k, v, _ = _inputs(1, 200, 200, 2, 2, 8)
    local_attention(q, k, v, 16)
    assert len(calls) == 1


def _changed_rows(fn, q, k, v, window, position, tensor, tolerance):
    """Rows whose output moves by more than `tolerance` when the key (or value) at `position`
    changes."""
    before = fn(q, k, v, window)
    k2, v2 = k.clone(), v.clone()
    (k2 if tensor == "k" else v2)[:, position] += 1.0
    diff = (fn(q, k2, v2, window) - before).abs().amax(dim=(0, 2, 3))
    return set(torch.nonzero(diff > tolerance).flatten().tolist())


@pytest.mark.parametrize("impl", ["chunked", "dense"])
@pytest.mark.parametrize("tensor", ["k", "v"])
def test_locality(impl, tensor):
    """Output at t is unchanged when the key/value at t - window changes, and changes for
    t - window + 1: the rows affected by position s are exactly s .. s + window - 1."""
    window, position = 16, 100
    q, k, v, _ = _inputs(1, 200, 200, 2, 1, 8)
    fn = lambda *a: local_attention(*a, impl=impl)  # noqa: E731
    rows = _changed_rows(fn, q, k, v, window, position, tensor, tolerance=1e-12)
    assert rows == set(range(position, position + window))


def test_chunked_never_builds_an_n_by_n_tensor(monkeypatch):
    """N = 16384, window 64: every SDPA call sees at most block + window - 1 keys, and the last
    rows agree with the spec."""
    n, window = 16384, 64
    block = local.default_block_size(window)
    spans = []
    attend = local._attend_block

    def spy(q_block, k_span, v_span, mask, gqa):
        spans.append((q_block.shape[2], k_span.shape[2],
                      0 if mask is None else mask.numel()))
        return attend(q_block, k_span, v_span, mask, gqa)

    monkeypatch.setattr(local, "_attend_block", spy)
    q, k, v, _ = _inputs(1, n, n, 2, 1, 8, dtype=torch.float32)
    out = local_attention(q, k, v, window)
    assert len(spans) == n // block
    assert max(rows for rows, _, _ in spans) <= block
    assert max(keys for _, keys, _ in spans) <= block + window - 1
    assert max(size for _, _, size in spans) <= block * (block + window - 1)
    tail = 100
    expected = dense_local_attention(q[:, -tail:].double(), k.double(), v.double(), window,
                                     q_offset=n - tail)
    assert rel_rmse(out[:, -tail:], expected) < 1e-6


def test_half_precision_keeps_dtype_and_is_close():
    q, k, v, _ = _inputs(1, 300, 300, 4, 2, 16, dtype=torch.bfloat16)
    out = local_attention(q, k, v, 50)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert rel_rmse(out, dense_local_attention(q.double(), k.double(), v.double(), 50)) < 2e-2


def test_empty_queries():
    q, k, v, _ = _inputs(1, 0, 10, 2, 1, 8)
    for impl in ("auto", "chunked", "flex"):
        assert local_attention(q, k, v, 4, impl=impl).shape == (1, 0, 2, 8)


# ---------------------------------------------------------------------------------------------
# Argument checks


def _bad(**change):
    q, k, v, _ = _inputs(1, 8, 8, 4, 2, 8)
    args = dict(q=q, k=k, v=v, window=4, q_offset=0, k_offset=0, impl="auto")
    args.update(change)
    return args


BAD = {
    "q rank": (_bad(q=torch.randn(8, 4, 8, dtype=torch.float64)), "q must have shape"),
    "dtypes": (_bad(k=torch.randn(1, 8, 2, 8)), "share a dtype"),
    "integer": (_bad(q=torch.ones(1, 8, 4, 8, dtype=torch.int64)), "floating-point"),
    "heads": (_bad(k=torch.randn(1, 8, 3, 8, dtype=torch.float64),
                   v=torch.randn(1, 8, 3, 8, dtype=torch.float64)), "multiple of k/v heads"),
    "k vs v": (_bad(v=torch.randn(1, 9, 2, 8, dtype=torch.float64)), "k and v"),
    "head_dim": (_bad(k=torch.randn(1, 8, 2, 4, dtype=torch.float64),
                      v=torch.randn(1, 8, 2, 4, dtype=torch.float64)), "head_dim"),
    "batch": (_bad(k=torch.randn(2, 8, 2, 8, dtype=torch.float64),
                   v=torch.randn(2, 8, 2, 8, dtype=torch.float64)), "batch"),
    "window 0": (_bad(window=0), "window must be >= 1"),
    "window float": (_bad(window=2.5), "window must be an int"),
    "window bool": (_bad(window=True), "window must be an int"),
    "q_offset negative": (_bad(q_offset=-1), "q_offset must be >= 0"),
    "queries before keys": (_bad(q_offset=0, k_offset=1), "cover every query"),
    "queries past keys": (_bad(q_offset=1), "cover every query"),
    "impl": (_bad(impl="sdpa"), "impl must be one of"),
}


@pytest.mark.parametrize("args,message", BAD.values(), ids=BAD.keys())
def test_bad_arguments_raise(args, message):
    with pytest.raises(ValueError, match=message):
        local_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("window"), **args)


def test_numpy_and_tensor_integers_are_accepted():
    import numpy as np

    q, k, v, _ = _inputs(1, 8, 8, 2, 2, 8)
    expected = local_attention(q, k, v, 4)
    assert torch.equal(local_attention(q, k, v, np.int64(4), q_offset=torch.tensor(0)), expected)


# ---------------------------------------------------------------------------------------------
# FlexAttention pieces that run on CPU: the block table and the mask_mod


BLOCK_CASES = [(300, 300, 3, 0), (1000, 1000, 256, 0), (512, 512, 129, 0), (130, 400, 200, 270),
               (5, 263, 256, 258), (129, 1129, 1000, 1000)]


@pytest.mark.parametrize("q_len,k_len,window,shift", BLOCK_CASES)
def test_block_table_equals_create_block_mask(q_len, k_len, window, shift):
    """The analytic block table (no element mask) is torch's own, entry for entry, full and
    partial blocks and both directions."""
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(batch, head, q_idx, kv_idx):
        return (q_idx + shift - kv_idx >= 0) & (q_idx + shift - kv_idx < window)

    ours = window_block_mask(q_len, k_len, window, shift, "cpu")
    torch_own = create_block_mask(visible, None, None, q_len, k_len, device="cpu")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(ours, name), getattr(torch_own, name)), name
    assert ours.seq_lengths == (q_len, k_len)


@pytest.mark.parametrize("q_len,k_len,window,shift", BLOCK_CASES[:4])
def test_mask_mod_is_the_window(q_len, k_len, window, shift):
    mask_mod = window_block_mask(q_len, k_len, window, shift, "cpu").mask_mod
    q_idx = torch.arange(q_len, dtype=torch.int32)[:, None]
    kv_idx = torch.arange(k_len, dtype=torch.int32)[None, :]
    distance = q_idx + shift - kv_idx
    assert torch.equal(mask_mod(0, 0, q_idx, kv_idx), (distance >= 0) & (distance < window))


def test_flex_budget_stops_before_the_recompile_limit(monkeypatch):
    """Past dynamo's recompile limit torch would run flex unfused (N x N scores): auto must
    switch to the chunked path before that."""
    q, k, v, _ = _inputs(1, 8, 8, 2, 2, 8)
    monkeypatch.setattr(local, "_flex_signatures", {("other", i) for i in range(3)})
    monkeypatch.setattr(local, "_recompile_limit", lambda: 3)
    assert not local._flex_budget_left(q, k, v)
    local._flex_signatures.add(local._flex_signature(q, k, v))
    assert local._flex_budget_left(q, k, v)


# ---------------------------------------------------------------------------------------------
# GPU: FlexAttention against the spec


@pytest.fixture
def roomy_recompile_limit():
    """This file compiles many shapes; let each reach the compiled kernel."""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=256):
        yield


GPU_CASES = {
    "ragged-gqa": (2, 1000, 1000, 4, 2, 64, 256, 0, 0),
    "d128-w1024": (1, 2085, 2085, 8, 8, 128, 1024, 0, 0),
    "mqa-w3": (1, 700, 700, 4, 1, 128, 3, 0, 0),
    "prefill-chunk": (1, 300, 560, 4, 2, 64, 256, 1260, 1000),
    "decode-5": (1, 5, 263, 4, 2, 64, 256, 1037, 779),
}


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_flex_matches_dense_float64(case, dtype, roomy_recompile_limit):
    """fp32: close to float64; bf16: within 2x the error of the same-dtype dense reference."""
    batch, q_len, k_len, heads, kv_heads, head_dim, window, q_offset, k_offset = case
    q, k, v, dout = _inputs(batch, q_len, k_len, heads, kv_heads, head_dim, dtype, "cuda")
    kw = dict(q_offset=q_offset, k_offset=k_offset)
    flex = _errors(lambda *a, **x: local_attention(*a, impl="flex", **x), q, k, v, dout, window,
                   **kw)
    same = _errors(dense_local_attention, q, k, v, dout, window, **kw)
    for name in flex:
        if dtype == torch.float32:
            assert flex[name] < 1e-5, (name, flex, same)
        else:
            assert flex[name] <= 2 * same[name] + 1e-6, (name, flex, same)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("tensor", ["k", "v"])
def test_flex_locality(tensor, roomy_recompile_limit):
    window, position = 256, 700
    q, k, v, _ = _inputs(1, 1500, 1500, 4, 2, 64, torch.float32, "cuda")
    fn = lambda *a: local_attention(*a, impl="flex")  # noqa: E731
    assert _changed_rows(fn, q, k, v, window, position, tensor, tolerance=1e-5) == set(
        range(position, position + window))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_auto_takes_flex_on_cuda_and_chunked_for_decoding(monkeypatch, roomy_recompile_limit):
    calls = []
    flex = local._flex
    monkeypatch.setattr(local, "_flex", lambda *a: calls.append(a[0].shape[1]) or flex(*a))
    q, k, v, _ = _inputs(1, 512, 512, 4, 2, 64, torch.bfloat16, "cuda")
    local_attention(q, k, v, 128)
    local_attention(q[:, -1:], k, v, 128, q_offset=511)
    assert calls == [512]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_flex_new_offset_or_window_does_not_recompile(roomy_recompile_limit):
    from torch._dynamo.utils import counters

    q, k, v, _ = _inputs(1, 384, 640, 4, 2, 64, torch.bfloat16, "cuda")
    local_attention(q, k, v, 128, q_offset=256, impl="flex")
    graphs = counters["stats"]["unique_graphs"]
    for window, q_offset, k_offset in ((64, 256, 0), (300, 1000, 744), (1, 256, 0)):
        out = local_attention(q, k, v, window, q_offset=q_offset, k_offset=k_offset, impl="flex")
        expected = dense_local_attention(q.double(), k.double(), v.double(), window,
                                         q_offset=q_offset, k_offset=k_offset)
        assert rel_rmse(out, expected) < 1e-2
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("block", [4, 16, 64])
@pytest.mark.parametrize("window", [6, 100])
def test_document_ids_keep_each_window_inside_its_document(block, window):
    """Packed documents through the chunked path equal each document alone (float64), with blocks
    smaller and larger than the documents, GQA, and a window longer than some documents or than
    the row (plain causal attention inside each document: the model's softmax global layers)."""
    gen = torch.Generator().manual_seed(11)
    lengths = [(13, 1), (1, 1), (30, 1), (9, 1)]
    total = sum(n for n, _ in lengths)
    q = torch.randn(2, total, 4, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, total, 2, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor([n for n, _ in lengths]))
    ids = torch.stack([ids, ids.flip(0)])  # the second row: other boundaries
    got = local.local_attention(q, k, v, window, document_ids=ids)  # the default block
    got_block = local._chunked(q, k, v, window, 0, 0, block, ids)
    for row in range(2):
        for doc in ids[row].unique():
            where = (ids[row] == doc).nonzero().flatten()
            first, last = int(where[0]), int(where[-1]) + 1
            alone = local.dense_local_attention(q[row:row + 1, first:last], k[row:row + 1, first:last],
                                                v[row:row + 1, first:last], window)
            for result in (got, got_block):
                assert torch.allclose(result[row:row + 1, first:last], alone, atol=1e-12, rtol=0)


def test_document_ids_are_checked():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="document_ids must be"):
        local.local_attention(q, q, q, 4, document_ids=torch.zeros(1, 7, dtype=torch.long))
