"""tapa_attention_varlen: a packed batch equals each sequence alone (outputs, lse, every gradient),
in float64, for every implementation; queries that see no key; argument errors."""

import pytest
import torch

import tapa
from tapa.ops.tapa.reference import naive_tapa_attention
from tapa.ops.tapa.varlen import (naive_tapa_attention_varlen, sequence_tapa_attention_varlen,
                                  tapa_attention_varlen)

# (Lq, Lk) per sequence: ragged, one-token, empty on either side, Lq < Lk (bottom-right), Lq > Lk,
# and one sequence longer than the chunked reference's 256-row query block
CASES = {
    "ragged": [(5, 5), (1, 1), (17, 17), (0, 0), (9, 9)],
    "prefill": [(3, 11), (1, 7), (6, 6), (0, 4)],
    "more_queries": [(7, 3), (4, 0), (2, 2)],
    "long": [(300, 300), (13, 40)],
}


def _pack(lengths, heads=4, kv_heads=2, head_dim=12, v_dim=10, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(a for a, _ in lengths), sum(b for _, b in lengths)
    q = torch.randn(total_q, heads, head_dim, generator=gen, dtype=dtype)
    k = torch.randn(total_k, kv_heads, head_dim, generator=gen, dtype=dtype)
    v = torch.randn(total_k, kv_heads, v_dim, generator=gen, dtype=dtype)
    cu_q = torch.tensor([0] + [sum(a for a, _ in lengths[:i + 1]) for i in range(len(lengths))],
                        dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(b for _, b in lengths[:i + 1]) for i in range(len(lengths))],
                        dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def _alone(q, k, v, cu_q, cu_k, causal, **variant):
    """Each sequence by the dense spec, its queries at positions Lk - Lq + i: out, lse."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=q.dtype)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        for i in range(qs, qe):  # one query at a time: its own offset, never a negative one
            pos = (ke - ks) - (qe - qs) + (i - qs)
            n_keys = min(pos + 1, ke - ks) if causal else ke - ks
            if n_keys <= 0:
                continue
            o, l = naive_tapa_attention(q[None, i:i + 1], k[None, ks:ks + n_keys],
                                        v[None, ks:ks + n_keys], causal=False, q_offset=max(pos, 0),
                                        k_offset=max(-pos, 0), return_lse=True, **variant)
            out[i], lse[:, i] = o[0, 0], l[0, :, 0]
    return out, lse


def _grads(fn, q, k, v, seed=1):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    gen = torch.Generator().manual_seed(seed)
    loss = (out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum()
    loss = loss + (torch.where(torch.isinf(lse), 0, lse)
                   * torch.randn(lse.shape, generator=gen, dtype=lse.dtype)).sum()
    loss.backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("impl", ["naive", "reference"])
def test_packed_batch_equals_each_sequence_alone(case, causal, impl):
    lengths = CASES[case]
    q, k, v, cu_q, cu_k = _pack(lengths, seed=len(case))
    variant = dict(theta=0.5, alpha=0.3, distance="power", phase="quadratic")
    max_q, max_k = max(a for a, _ in lengths), max(b for _, b in lengths)

    def packed(q, k, v):
        return tapa_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                     return_lse=True, impl=impl, **variant)

    def alone(q, k, v):
        return _alone(q, k, v, cu_q, cu_k, causal, **variant)

    got, want = _grads(packed, q, k, v), _grads(alone, q, k, v)
    assert got[1].shape == (q.shape[1], q.shape[0]) and got[1].dtype == torch.float64
    assert torch.equal(torch.isinf(got[1]), torch.isinf(want[1]))
    finite = torch.isfinite(want[1])
    assert _rel(got[0], want[0]) < 1e-10
    assert _rel(got[1][finite], want[1][finite]) < 1e-10
    for name, a, b in zip(("dq", "dk", "dv"), got[2:], want[2:]):
        assert _rel(a, b) < 1e-10, name


def test_queries_that_see_no_key_give_zero_and_minus_inf():
    q, k, v, cu_q, cu_k = _pack([(4, 2), (3, 0)])
    for fn in (naive_tapa_attention_varlen, sequence_tapa_attention_varlen):
        q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse = fn(q_, k_, v_, cu_q, cu_k, causal=True, return_lse=True)
        blind = [0, 1, 4, 5, 6]  # the first Lq - Lk queries of sequence 0, all of sequence 1
        assert torch.all(out[blind] == 0) and torch.all(torch.isneginf(lse[:, blind]))
        assert torch.isfinite(lse[:, 2:4]).all()
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q_, k_, v_))
        assert torch.all(q_.grad[blind] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_in_low_precision_is_close_to_float64(dtype):
    q, k, v, cu_q, cu_k = _pack([(37, 37), (5, 20), (64, 64)], dtype=torch.float64, seed=3)
    ref = naive_tapa_attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    out = tapa_attention_varlen(q.to(dtype), k.to(dtype), v.to(dtype), cu_q, cu_k, 64, 64)
    assert out.dtype == dtype
    assert _rel(out.double(), ref) < (1e-5 if dtype == torch.float32 else 2e-3)


def test_public_name():
    assert tapa.tapa_attention_varlen is tapa_attention_varlen


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].long()}, "int32"),
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"][:1]}, "at least two"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:-1]}, "same number of sequences"),
    (lambda a: {**a, "cu_seqlens_q": torch.tensor([0, 6, 5, 12], dtype=torch.int32)}, "non-decreasing"),
    (lambda a: {**a, "cu_seqlens_q": torch.tensor([1, 5, 9, 12], dtype=torch.int32)}, "start at 0"),
    (lambda a: {**a, "cu_seqlens_k": torch.tensor([0, 5, 9, 11], dtype=torch.int32)}, "end at"),
    (lambda a: {**a, "max_seqlen_q": 3}, "max_seqlen_q"),
    (lambda a: {**a, "max_seqlen_k": -1}, "max_seqlen_k"),
    (lambda a: {**a, "q": a["q"][None]}, "rank 3"),
    (lambda a: {**a, "k": a["k"].float()}, "dtype"),
    (lambda a: {**a, "alpha": 0.0}, "alpha"),
])
def test_bad_arguments_name_what_is_wrong(change, message):
    q, k, v, cu_q, cu_k = _pack([(5, 5), (4, 4), (3, 3)])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5,
                max_seqlen_k=5, alpha=0.1)
    with pytest.raises(ValueError, match=message):
        tapa_attention_varlen(**change(args))
