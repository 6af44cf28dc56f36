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
    # the same upstream gradients whatever the dtype: drawn in float64, then cast
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
    d_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64).to(lse.device, lse.dtype)
    loss = (out * d_out).sum() + (torch.where(torch.isinf(lse), 0, lse) * d_lse).sum()
    loss.backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _rel(a, b):
    a, b = a.detach(), b.detach().to(a.device)
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


# --- the fused kernels (the interpreter on CPU in float32/float16; CUDA where present) --------

triton = pytest.importorskip("triton")
KERNEL_CASES = {
    "ragged": [(5, 5), (1, 1), (40, 40), (0, 0), (9, 9), (33, 33)],
    "prefill": [(9, 20), (3, 37), (16, 16)],
    "more_queries": [(7, 3), (4, 0), (21, 5)],
}


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _kernel_case(case, causal, dtype, head_dim=32, seed=0):
    lengths = KERNEL_CASES[case]
    q, k, v, cu_q, cu_k = _pack(lengths, heads=4, kv_heads=2, head_dim=head_dim, v_dim=head_dim,
                                dtype=torch.float64, seed=seed)
    device = _device()
    q, k, v = (t.to(device) for t in (q, k, v))
    cu_q, cu_k = cu_q.to(device), cu_k.to(device)
    max_q, max_k = max(a for a, _ in lengths), max(b for _, b in lengths)

    def fused(q, k, v):
        return tapa_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, alpha=0.3,
                                     return_lse=True, impl="triton")

    def exact(q, k, v):
        return naive_tapa_attention_varlen(q, k, v, cu_q, cu_k, causal=causal, alpha=0.3,
                                           return_lse=True)

    def same_dtype(q, k, v):
        return tapa_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, alpha=0.3,
                                     return_lse=True, impl="reference")

    low = [t.to(dtype) for t in (q, k, v)]
    return _grads(fused, *low), _grads(exact, q, k, v), _grads(same_dtype, *low)


@pytest.mark.parametrize("case", sorted(KERNEL_CASES))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_varlen_matches_float64(case, causal, dtype):
    """Outputs, lse and every gradient against float64: within 2x (the project's bar) the
    same-dtype reference's error (and float32-grade in float32); queries that see no key get 0
    and -inf exactly."""
    if dtype == torch.float16 and not torch.cuda.is_available() and case != "ragged":
        pytest.skip("one float16 case is enough under the interpreter")
    got, want, same = _kernel_case(case, causal, dtype)
    assert torch.equal(torch.isinf(got[1]), torch.isinf(want[1]))
    blind = torch.isinf(want[1]).all(0)
    assert torch.all(got[0][blind] == 0)
    finite = torch.isfinite(want[1])
    for name, a, b, c in zip(("out", "lse", "dq", "dk", "dv"), got, want, same):
        if name == "lse":
            a, b, c = a[finite], b[finite], c[finite]
        err, bar = _rel(a.double(), b), _rel(c.double(), b)
        assert err <= max(2 * bar, 1e-6 if dtype == torch.float32 else 0), (name, err, bar)


def test_fused_varlen_equals_the_dense_kernel_on_equal_lengths():
    """Equal-length sequences packed: the varlen kernels compute what the dense ones do on the
    (B, N) batch (the same tiles, the same order: equal to float32 rounding)."""
    from tapa import tapa_attention

    device, gen = _device(), torch.Generator().manual_seed(5)
    batch, length = 3, 37
    q, k, v = (torch.randn(batch, length, 4, 32, generator=gen).to(device).requires_grad_()
               for _ in range(3))
    dense, dense_lse = tapa_attention(q, k, v, return_lse=True, impl="triton")
    dense.sum().backward()
    dense_grads = [t.grad.clone() for t in (q, k, v)]
    flat = [t.detach().reshape(batch * length, 4, 32).requires_grad_() for t in (q, k, v)]
    cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)
    packed, packed_lse = tapa_attention_varlen(*flat, cu, cu, length, length, return_lse=True,
                                               impl="triton")
    packed.sum().backward()
    assert _rel(packed.double(), dense.reshape(batch * length, 4, 32).double()) < 1e-6
    assert _rel(packed_lse.double(), dense_lse.permute(1, 0, 2).reshape(4, -1).double()) < 1e-6
    for a, b in zip(flat, dense_grads):
        assert _rel(a.grad.double(), b.reshape(a.shape).double()) < 1e-6
