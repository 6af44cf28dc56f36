"""`tapa_attention_with_kvcache` against a per-sequence float64 reference written out here: the
per-sequence path on any device, and the split-KV kernel path (Triton's interpreter on CPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import rel_rmse

import tapa
from tapa.ops import tapa_attention_with_kvcache
from tapa.ops.tapa.reference import naive_tapa_attention

HAS_TRITON = importlib.util.find_spec("triton") is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def expected(q, k_cache, v_cache, seqlens, starts, **op_args):
    """Sequence b alone: its real keys are slots [start, seqlen) at positions 0.., its queries the
    last q_len of them; the naive op on that slice, in float64."""
    outs, lses = [], []
    q_len = q.shape[1]
    for b in range(q.shape[0]):
        start = 0 if starts is None else int(starts[b])
        stop = int(seqlens[b])
        keys = slice(start, stop)
        out, lse = naive_tapa_attention(q[b:b + 1].double(), k_cache[b:b + 1, keys].double(),
                                        v_cache[b:b + 1, keys].double(), q_offset=stop - q_len - start,
                                        return_lse=True, **op_args)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def cache_case(batch, q_len, heads, kv_heads, capacity, dtype, *, seed, head_dim=16, v_dim=12):
    """Random q and caches, ragged lengths (one cache full), left padding, NaN in every unused slot."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, heads, head_dim, generator=gen, dtype=torch.float64)
    k_cache = torch.randn(batch, capacity, kv_heads, head_dim, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(batch, capacity, kv_heads, v_dim, generator=gen, dtype=torch.float64)
    seqlens = torch.randint(q_len, capacity + 1, (batch,), generator=gen, dtype=torch.int32)
    seqlens[0] = capacity
    starts = (torch.rand(batch, generator=gen) * (seqlens - q_len + 1).float()).to(torch.int32)
    starts = torch.minimum(starts, seqlens - q_len)
    for b in range(batch):  # slots the op must never read
        for cache in (k_cache, v_cache):
            cache[b, :starts[b]] = float("nan")
            cache[b, seqlens[b]:] = float("nan")
    return (*(t.to(DEVICE, dtype) for t in (q, k_cache, v_cache)), seqlens.to(DEVICE), starts.to(DEVICE))


CASES = [  # batch, q_len, heads, kv_heads, capacity
    (3, 1, 4, 2, 29),  # GQA, one new token
    (3, 3, 4, 1, 33),  # MQA, three new tokens (chunked decoding / speculative verification)
    (2, 3, 2, 2, 17),
]
VARIANTS = [dict(), dict(distance="linear", alpha=0.05, phase="linear", theta=0.25)]


@pytest.mark.parametrize("variant", VARIANTS, ids=["power-quadratic", "linear-linear"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Nq{}-H{}-Hk{}-L{}".format(*c))
@pytest.mark.parametrize("padded", [False, True], ids=["no-starts", "starts"])
def test_reference_path_matches_each_sequence_alone(case, variant, padded):
    q, k_cache, v_cache, seqlens, starts = cache_case(*case, torch.float64, seed=CASES.index(case))
    starts = starts if padded else None
    if not padded:  # the NaN before each start would be real keys here
        k_cache, v_cache = k_cache.nan_to_num(0.5), v_cache.nan_to_num(0.5)
    exact_out, exact_lse = expected(q, k_cache, v_cache, seqlens, starts, **variant)
    for impl in ("reference", "naive"):
        out, lse = tapa_attention_with_kvcache(q, k_cache, v_cache, seqlens, cache_leftpad=starts, impl=impl,
                                               return_lse=True, **variant)
        assert rel_rmse(out, exact_out) < 1e-12 and rel_rmse(lse, exact_lse) < 1e-12, impl
    # float32 through "auto" (the per-sequence path off-GPU) within float32 rounding
    out = tapa_attention_with_kvcache(q.float(), k_cache.float(), v_cache.float(), seqlens, cache_leftpad=starts,
                                      **variant)
    assert out.dtype == torch.float32 and rel_rmse(out, exact_out) < 1e-5


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Nq{}-H{}-Hk{}-L{}".format(*c))
def test_kernel_path_matches_each_sequence_alone(case):
    """impl="triton" (the split-KV kernel), float32, against float64; within 2x of the float32
    per-sequence path's own error."""
    q, k_cache, v_cache, seqlens, starts = cache_case(*case, torch.float32, seed=10 + CASES.index(case))
    for cache_starts in (starts, None):
        k, v = (k_cache, v_cache) if cache_starts is not None else (k_cache.nan_to_num(0.5), v_cache.nan_to_num(0.5))
        exact_out, exact_lse = expected(q, k, v, seqlens, cache_starts)
        out, lse = tapa_attention_with_kvcache(q, k, v, seqlens, cache_leftpad=cache_starts, impl="triton",
                                               return_lse=True)
        same = tapa_attention_with_kvcache(q, k, v, seqlens, cache_leftpad=cache_starts, impl="reference")
        assert rel_rmse(out, exact_out) <= 2 * rel_rmse(same, exact_out) + 1e-6
        assert rel_rmse(lse, exact_lse) < 1e-5


def test_gradients_flow_through_the_per_sequence_path():
    q, k_cache, v_cache, seqlens, starts = cache_case(2, 2, 2, 1, 9, torch.float64, seed=5)
    k_cache, v_cache = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    grads = []
    for fn in (lambda *a: tapa_attention_with_kvcache(*a, seqlens, cache_leftpad=starts, return_lse=True),
               lambda *a: expected(*a, seqlens, starts)):
        inputs = [t.detach().clone().requires_grad_(True) for t in (q, k_cache, v_cache)]
        out, lse = fn(*inputs)
        (out.square().sum() + lse.sum()).backward()
        grads.append([t.grad for t in inputs])
    for got, want in zip(*grads):
        assert rel_rmse(got, want) < 1e-12
    if HAS_TRITON:
        with pytest.raises(ValueError, match="no backward"):
            tapa_attention_with_kvcache(q.float().requires_grad_(True), k_cache.float(), v_cache.float(), seqlens,
                                        impl="triton")


def test_exported_and_int_seqlens():
    assert tapa.tapa_attention_with_kvcache is tapa_attention_with_kvcache
    q, k_cache, v_cache, _, _ = cache_case(2, 1, 2, 2, 7, torch.float64, seed=6)
    k_cache, v_cache = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    full = torch.full((2,), 7, dtype=torch.int32, device=DEVICE)
    assert torch.equal(tapa_attention_with_kvcache(q, k_cache, v_cache, 7),
                       tapa_attention_with_kvcache(q, k_cache, v_cache, full))


@pytest.mark.parametrize("impl", ["reference", "naive"])
def test_reference_impls_never_take_the_kernel(monkeypatch, impl):
    """impl "reference"/"naive" run per sequence even where the kernel would apply (on CUDA: here
    simulated by a decode_kernel_applies that says yes to "auto"); found on the H200, where these
    impls called a kernel they had not loaded."""
    from tapa.ops.tapa import decode

    real = decode.decode_kernel_applies
    monkeypatch.setattr(decode, "decode_kernel_applies",
                        lambda q, k, v, impl="auto": impl == "auto" or real(q, k, v, impl))
    q, k, v, seqlens, starts = cache_case(2, 1, 2, 1, 9, torch.float64, seed=3)
    exact, _ = expected(q, k, v, seqlens, starts)
    out = tapa_attention_with_kvcache(q, k, v, seqlens, cache_leftpad=starts, impl=impl)
    assert rel_rmse(out, exact) < 1e-12


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_on_cuda_takes_the_kernel_where_it_applies(monkeypatch):
    """bf16 (which the interpreter cannot check): the kernel for Nq * H / Hk <= 64, per-sequence
    fused attention above; both within 2x of the same-dtype per-sequence reference's error."""
    from tapa.ops.tapa import decode_kernel

    calls = []
    real = decode_kernel.tapa_decode_attention
    monkeypatch.setattr(decode_kernel, "tapa_decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    for q_len, uses_kernel in ((2, True), (40, False)):
        q, k, v, seqlens, starts = cache_case(3, q_len, 16, 4, 3000, torch.bfloat16, seed=q_len, head_dim=128,
                                              v_dim=128)
        calls.clear()
        out = tapa_attention_with_kvcache(q, k, v, seqlens, cache_leftpad=starts)
        assert bool(calls) == uses_kernel
        exact, _ = expected(q, k, v, seqlens, starts)
        same = tapa_attention_with_kvcache(q, k, v, seqlens, cache_leftpad=starts, impl="reference")
        assert rel_rmse(out, exact) <= 2 * rel_rmse(same, exact) + 1e-6


BAD = {
    "seqlens int64": (dict(cache_seqlens="int64"), r"cache_seqlens must be an int32 tensor"),
    "seqlens shape": (dict(cache_seqlens=torch.tensor([5], dtype=torch.int32)), r"cache_seqlens"),
    "seqlens below q_len": (dict(cache_seqlens=torch.tensor([1, 5], dtype=torch.int32)), r"cache_seqlens must lie"),
    "seqlens past capacity": (dict(cache_seqlens=torch.tensor([9, 5], dtype=torch.int32)), r"cache_seqlens must lie"),
    "starts hide a query": (dict(cache_leftpad=torch.tensor([0, 4], dtype=torch.int32)), r"cache_leftpad"),
    "cache heads": (dict(k_cache="3 heads"), r"heads"),
    "v_cache length": (dict(v_cache="short"), r"seqlen"),
    "dtype": (dict(k_cache="half"), r"dtype"),
    "alpha": (dict(alpha=float("inf")), r"alpha"),
    "impl": (dict(impl="flash"), r"impl"),
    "zero batch": (dict(q="empty batch"), r"batch size must be positive"),
    # check_lengths=False skips only the kernel's device sync: the per-sequence path sliced a
    # length past the capacity short and returned a wrong result
    "unchecked seqlens past capacity": (dict(cache_seqlens=torch.tensor([9, 5], dtype=torch.int32),
                                             check_lengths=False), r"cache_seqlens must lie"),
    "unchecked starts hide a query": (dict(cache_leftpad=torch.tensor([0, 4], dtype=torch.int32),
                                           check_lengths=False), r"cache_leftpad must lie"),
    "return_lse a string": (dict(return_lse="no"), r"return_lse must be True or False"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_value_error(case):
    q = torch.randn(2, 2, 4, 8)
    k_cache, v_cache = torch.randn(2, 8, 2, 8), torch.randn(2, 8, 2, 8)
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=torch.tensor([8, 5], dtype=torch.int32))
    changes, pattern = BAD[case]
    replacements = {"int64": args["cache_seqlens"].long(), "3 heads": torch.randn(2, 8, 3, 8),
                    "short": v_cache[:, :7], "half": k_cache.half(), "empty batch": q[:0]}
    args.update({name: replacements.get(value, value) if isinstance(value, str) and name != "impl" else value
                 for name, value in changes.items()})
    with pytest.raises(ValueError, match=pattern):
        tapa_attention_with_kvcache(**args)


def test_cache_starts_is_a_deprecated_alias_of_cache_leftpad():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 1, 4, 16, generator=gen)
    k_cache, v_cache = (torch.randn(2, 12, 2, 16, generator=gen) for _ in range(2))
    seqlens = torch.tensor([12, 9], dtype=torch.int32)
    leftpad = torch.tensor([0, 3], dtype=torch.int32)
    new = tapa_attention_with_kvcache(q, k_cache, v_cache, seqlens, cache_leftpad=leftpad)
    with pytest.warns(DeprecationWarning, match="cache_leftpad"):
        old = tapa_attention_with_kvcache(q, k_cache, v_cache, seqlens, cache_starts=leftpad)
    assert torch.equal(new, old)
    with pytest.raises(ValueError, match="cache_leftpad only"):
        tapa_attention_with_kvcache(q, k_cache, v_cache, seqlens, cache_leftpad=leftpad,
                                    cache_starts=leftpad)
