"""Tests of the fused Triton TAPA kernels against the float64 reference.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1) on CPU tensors, in
float32 and float16 (the interpreter's bfloat16 dot is not trustworthy). With CUDA the same tests
run compiled on the GPU, and the cuda-marked ones add bfloat16 and a long-range check.
Every comparison is relative RMSE against `naive_tapa_attention` in float64 on the same
(rounded) inputs, for out, lse and the gradients of q, k and v.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import rel_rmse

HAS_CUDA = torch.cuda.is_available()
pytest.importorskip("triton")  # without CUDA, tests/conftest.py has selected Triton's interpreter
DEVICE = "cuda" if HAS_CUDA else "cpu"

from tapa.ops import MAX_ALPHA, MAX_POSITION, tapa_attention, triton_attention, triton_launch  # noqa: E402
from tapa.ops.reference import chunked_tapa_attention, naive_tapa_attention  # noqa: E402

GRADS = ("out", "lse", "dq", "dk", "dv")
# float32: the kernel's error is rounding-level (about 1e-6 measured); float16: see _check.
FLOAT32_TOLERANCE = 2e-5


def _inputs(batch, q_len, k_len, heads, kv_heads, head_dim, v_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)
                 for shape in ((batch, q_len, heads, head_dim), (batch, k_len, kv_heads, head_dim),
                               (batch, k_len, kv_heads, v_dim)))


def _run(fn, q, k, v, seed, **kwargs):
    """out, lse and input gradients of a random linear loss on out and lse."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v, return_lse=True, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    out_weight = torch.randn(out.shape, generator=gen).to(out.dtype).to(out.device)
    lse_weight = torch.randn(lse.shape, generator=gen).to(lse.dtype).to(lse.device)
    ((out * out_weight).sum() + (lse * lse_weight).sum()).backward()
    return dict(zip(GRADS, (out, lse, q.grad, k.grad, v.grad)))


def _check(q, k, v, seed=0, **kwargs):
    """Kernel vs float64 reference; float16 within 2x the float16 reference's own error."""
    fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, seed, **kwargs)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), seed, **kwargs)
    errors = {name: rel_rmse(fused[name], exact[name]) for name in GRADS}
    if q.dtype == torch.float32:
        assert max(errors.values()) < FLOAT32_TOLERANCE, errors
    else:
        same_dtype = _run(chunked_tapa_attention, q, k, v, seed, **kwargs)
        for name in GRADS:
            floor = rel_rmse(same_dtype[name], exact[name])
            assert errors[name] <= 2 * floor + 1e-6, (name, errors[name], floor)
    return errors


DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_causal_gqa_ragged(dtype):
    q, k, v = _inputs(2, 45, 45, 4, 2, 32, 32, dtype, seed=1)
    _check(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_noncausal_mqa_unequal_lengths(dtype):
    q, k, v = _inputs(1, 23, 50, 3, 1, 32, 32, dtype, seed=2)
    _check(q, k, v, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_offsets_far_tiles(dtype):
    """q_offset puts most tiles far from the diagonal, where d**alpha is a Taylor series."""
    q, k, v = _inputs(1, 20, 330, 2, 1, 32, 32, dtype, seed=3)
    _check(q, k, v, causal=True, q_offset=310, k_offset=0)
    _check(q, k, v, causal=False, q_offset=7, k_offset=400, alpha=0.37)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uneven_theta_and_value_dim(dtype):
    """d_A = 48, d_P = 16 (padded to 64 and 16 columns in the kernel), v of another width."""
    q, k, v = _inputs(1, 33, 33, 2, 2, 64, 24, dtype, seed=4)
    _check(q, k, v, causal=True, theta=0.75)


@pytest.mark.parametrize("distance,phase", list(itertools.product(("power", "linear"),
                                                                   ("quadratic", "linear"))))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_variants(dtype, distance, phase):
    q, k, v = _inputs(1, 40, 40, 2, 1, 16, 16, dtype, seed=5)
    _check(q, k, v, causal=True, distance=distance, phase=phase, alpha=0.3, q_offset=100,
           k_offset=90)


@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_atomic_dq(phase):
    """dQ by float32 atomics from the dK/dV kernel (the alternative to the dQ kernel)."""
    q, k, v = _inputs(1, 41, 41, 4, 2, 32, 32, torch.float32, seed=11)
    base = triton_launch.default_configs(32, 32, torch.float32)
    with triton_launch.override_configs(triton_launch.LaunchConfigs(
            base.fwd, base.dkdv, base.dq, dq_atomic=True)):
        _check(q, k, v, causal=True, phase=phase, q_offset=5)


@pytest.mark.parametrize("distance", ["power", "linear"])
def test_alpha_at_its_bound(distance):
    """alpha = MAX_ALPHA: at short range, where float32 still resolves the phase (up to 20**4 turns),
    the kernel is within 2x of the float32 reference's error; at the longest range (distance
    ~2**24, phase ~2**96 turns) every output is finite and every logit stays within its amplitude
    (|cos| <= 1), so lse <= max |q_A . k_A| / sqrt(d_A) + log(Nk)."""
    alpha = MAX_ALPHA[distance]
    q, k, v = _inputs(1, 21, 21, 2, 1, 32, 32, torch.float32, seed=12)
    kwargs = dict(alpha=alpha, distance=distance, causal=True)
    fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, 0, **kwargs)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, **kwargs)
    same_dtype = _run(naive_tapa_attention, q, k, v, 0, **kwargs)
    for name in GRADS:
        floor = rel_rmse(same_dtype[name], exact[name])
        assert rel_rmse(fused[name], exact[name]) <= 2 * floor + 1e-6, (name, floor)

    q, k, v = _inputs(1, 40, 37, 2, 2, 32, 32, torch.float32, seed=13)
    far = dict(alpha=alpha, distance=distance, causal=False, q_offset=MAX_POSITION - 40)
    fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, 0, **far)
    for name in GRADS:
        assert torch.isfinite(fused[name]).all(), name
    amplitude = torch.einsum("bqhd,bkhd->bhqk", q[..., :16], k[..., :16]).abs() / 4.0
    bound = amplitude.amax(-1) + torch.log(torch.tensor(37.0))
    assert (fused["lse"] <= bound + 1e-4).all()


def test_broadcast_output_gradients():
    """loss = out.sum() + lse.sum(): autograd hands the backward expanded (stride-0) gradients."""
    q, k, v = _inputs(1, 37, 37, 2, 2, 32, 32, torch.float32, seed=14)

    def grads(fn, *inputs):
        inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
        out, lse = fn(*inputs, return_lse=True)
        (out.sum() + lse.sum()).backward()
        return [t.grad for t in inputs]

    fused = grads(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v)
    exact = grads(naive_tapa_attention, q.double(), k.double(), v.double())
    for got, want in zip(fused, exact):
        assert rel_rmse(got, want) < FLOAT32_TOLERANCE


def test_every_output_element_written(monkeypatch):
    """The launchers' output buffers (out, lse, delta, dq, dk, dv) start as NaN."""
    q, k, v = _inputs(1, 37, 37, 3, 1, 32, 24, torch.float32, seed=6)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, causal=True)
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(triton_launch.torch, "empty",
                        lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(triton_launch.torch, "empty_like",
                        lambda *a, **kw: empty_like(*a, **kw).fill_(float("nan")))
    fused = _run(lambda *a, **kw: triton_attention.tapa_attention_triton(
        *a, theta=0.5, alpha=0.1, distance="power", phase="quadratic", q_offset=0, k_offset=0,
        **kw), q, k, v, 0, causal=True)
    monkeypatch.undo()
    for name in GRADS:
        assert rel_rmse(fused[name], exact[name]) < FLOAT32_TOLERANCE, name


def test_taylor_distance_weight_matches_pow():
    """The host constants give (1 + u)**alpha to 1e-8 over |u| <= rho for several alphas."""
    for alpha in (0.05, 0.1, 0.5, 1.0, 1.7, 3.0):
        rho, coefficients = triton_launch.taylor_constants(alpha)
        u = torch.linspace(-rho, rho, 1001, dtype=torch.float64)
        series = 1 + sum(c * u ** (i + 1) for i, c in enumerate(coefficients))
        assert (series - (1 + u) ** alpha).abs().max() < 1.1e-8, alpha


def test_dispatch_and_custom_op():
    q, k, v = _inputs(1, 17, 17, 2, 1, 16, 16, torch.float32, seed=8)
    assert triton_attention.supports(q, k, v, theta=0.5)
    assert not triton_attention.supports(q.double(), k.double(), v.double(), theta=0.5)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        tapa_attention(q.double(), k.double(), v.double(), impl="triton")
    out = torch.ops.tapa.fused_attention_fwd(q, k, v, 8, 0.1, "power", "quadratic", True, 0, 0)[0]
    exact = naive_tapa_attention(q.double(), k.double(), v.double())
    assert rel_rmse(out, exact) < FLOAT32_TOLERANCE


def test_torch_compile_has_no_graph_break():
    q, k, v = _inputs(1, 19, 19, 2, 1, 16, 16, torch.float32, seed=9)
    q.requires_grad_(True)

    def loss(q, k, v):
        return tapa_attention(q, k, v, impl="triton").square().sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    value = compiled(q, k, v)
    value.backward()
    expected = loss(q, k, v)
    assert torch.allclose(value, expected, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# GPU only: bfloat16 at the benchmark's head split, and long-range accuracy


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("causal", [True, False])
def test_bfloat16_within_twice_reference_error(causal):
    q, k, v = _inputs(1, 1000, 1000, 4, 2, 128, 128, torch.bfloat16, seed=10)
    _check(q, k, v, causal=causal)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("distance", ["power", "linear"])
def test_long_range_rows_as_accurate_as_near_rows(distance):
    """N = 64k: the last rows (keys up to 64k away) match float64 as well as the first rows."""
    from tapa.bench.attention import long_range_errors

    errors = long_range_errors(65536, distance=distance, dtype=torch.bfloat16)
    assert errors["far_kernel"] <= 2 * errors["far_reference"] + 1e-6, errors
    assert errors["near_kernel"] <= 2 * errors["near_reference"] + 1e-6, errors
