"""Tests of the fused Triton TAPA kernels against the float64 reference.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1) on CPU tensors, in
float32 and float16 (the interpreter's bfloat16 dot is not trustworthy). With CUDA the same tests
run compiled on the GPU, and the cuda-marked ones add bfloat16 and a long-range check.
Every comparison is relative RMSE against `naive_tapa_attention` in float64 on the same
(rounded) inputs, for out, lse and the gradients of q, k and v.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from helpers import rel_rmse

HAS_CUDA = torch.cuda.is_available()
pytest.importorskip("triton")  # without CUDA, tests/conftest.py has selected Triton's interpreter
DEVICE = "cuda" if HAS_CUDA else "cpu"

from tapa.ops import MAX_ALPHA, MAX_POSITION, tapa_attention
from tapa.ops.tapa import fused as triton_attention, launch as triton_launch  # noqa: E402
from tapa.ops.tapa.reference import chunked_tapa_attention, naive_tapa_attention  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from tapa.ops.tapa import logits as triton_logits  # noqa: E402

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
    """Kernel vs float64 reference; float16: out and the gradients within 2x the float16
    reference's own error, and lse (float32 for every input dtype) within the bound that the
    16-bit defaults' approximations allow (the GPU's 16-bit defaults take a shorter trig and
    d ** alpha series than the reference's float32 ones: _lse_error_bound)."""
    fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, seed, **kwargs)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), seed, **kwargs)
    errors = {name: rel_rmse(fused[name], exact[name]) for name in GRADS}
    if q.dtype == torch.float32:
        assert max(errors.values()) < FLOAT32_TOLERANCE, errors
        return errors
    same_dtype = _run(chunked_tapa_attention, q, k, v, seed, **kwargs)
    for name in ("out", "dq", "dk", "dv"):
        floor = rel_rmse(same_dtype[name], exact[name])
        assert errors[name] <= 2 * floor + 1e-6, (name, errors[name], floor)
    configs = triton_launch.default_configs(q.shape[-1], v.shape[-1], q.dtype)
    _check_lse(fused, exact, same_dtype, _lse_error_bound(q, k, configs, **kwargs))
    return errors


def _check_lse(fused, exact, same_dtype, bound):
    lse_error = (fused["lse"].double() - exact["lse"]).abs().max().item()
    floor = (same_dtype["lse"].double() - exact["lse"]).abs().max().item()
    assert lse_error <= bound + 2 * floor + 1e-6, (lse_error, bound, floor)


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


@pytest.mark.parametrize("transpose", [False, True], ids=["dq", "dq_t"])
@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_atomic_dq(phase, transpose):
    """dQ by float32 atomics from the dK/dV kernel (the alternative to the dQ kernel), its
    products as dS^T K or transposed (dQ^T = K^T dS)."""
    q, k, v = _inputs(1, 41, 41, 4, 2, 32, 32, torch.float32, seed=11)
    base = triton_launch.default_configs(32, 32, torch.float32)
    with triton_launch.override_configs(triton_launch.LaunchConfigs(
            base.fwd, base.dkdv, base.dq, dq_atomic=True, dq_transpose=transpose)):
        _check(q, k, v, causal=True, phase=phase, q_offset=5)


@pytest.mark.parametrize("atomic", [False, True], ids=["dkdv", "dkdv_atomic_dq_t"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_dkdv_reverse_query_order(causal, atomic):
    """dkdv_reverse: the dK/dV kernel's unmasked query blocks from the last one down. Ragged N =
    101 in query tiles of 16 gives each key block 2-7 unmasked blocks to mirror (a wrong mirror
    drops or repeats one); GQA, so each program sweeps two query heads."""
    q, k, v = _inputs(1, 101, 101, 4, 2, 32, 32, torch.float32, seed=13)
    base = triton_launch.default_configs(32, 32, torch.float32)
    with triton_launch.override_configs(triton_launch.LaunchConfigs(
            base.fwd, base.dkdv, base.dq, dq_atomic=atomic, dq_transpose=atomic, dkdv_reverse=True)):
        assert triton_launch.dkdv_flags(triton_launch.default_configs(32, 32, torch.float32))["REVERSE_Q"]
        _check(q, k, v, causal=causal, q_offset=0 if causal else 7)


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


# ---------------------------------------------------------------------------------------------
# Kernel variants (`triton_launch.parse_variant`): opt-in, timed by `tapa bench attention
# --variants`; each must meet the accuracy bar before its timing means anything.

HALF_BAR = 1.5  # the bar: kernel error <= 1.5x the same-dtype reference's, vs float64
FAR = dict(q_offset=6000)  # every tile of these tests sits far from the diagonal (asserted)


def test_trig_polynomial_error_bounds():
    """Each polynomial pair, evaluated in float32 as the kernels do, is within its table bound."""
    from tapa.ops.tapa.logits import TRIG_COEFFICIENTS

    u64 = torch.linspace(-0.25, 0.25, 100001, dtype=torch.float64)
    u = u64.float()
    w = u * u
    for terms, (sin_c, cos_c, bound) in TRIG_COEFFICIENTS.items():
        assert len(sin_c) == terms and len(cos_c) == terms + 1
        for coefficients, odd, exact in ((sin_c, True, torch.sin), (cos_c, False, torch.cos)):
            poly = torch.full_like(u, float(coefficients[-1].value))
            for c in coefficients[-2::-1]:
                poly = poly * w + float(c.value)
            if odd:
                poly = poly * u
            error = (poly.double() - exact(2 * torch.pi * u64)).abs().max().item()
            assert error <= bound, (terms, odd, error, bound)


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5, 6])
def test_taylor_constants_hold_their_tolerance(order):
    """rho from the host keeps the series within tolerance on a grid 8x denser than its own check."""
    for alpha in (0.05, 0.1, 0.5, 1.7, 7.0):
        for tolerance in (1e-8, 1e-7, 1e-6):
            rho, _ = triton_launch.taylor_constants(alpha, order, tolerance)
            assert triton_launch.taylor_series_error(alpha, order, rho, points=2049) <= tolerance * 1.001
    # the default is the series the kernels have always used
    assert triton_launch.taylor_constants(0.1) == triton_launch.taylor_constants(0.1, 6, 1e-8)


def test_parse_variant_round_trip_and_errors(monkeypatch):
    spec = ("fwd=128x64/8/3/ws,dkdv=64x128/8/2,dq=128x32,dq_atomic=1,trig_poly=0,trig_terms=4,"
            "taylor_order=3,taylor_tolerance=1e-07,dq_transpose=1")
    base = triton_launch.default_configs(128, 128, torch.bfloat16)
    configs = triton_launch.with_variant(base, spec)
    assert configs.fwd == triton_launch.KernelConfig(128, 64, 8, 3, warp_specialize=True)
    assert configs.dq == triton_launch.KernelConfig(128, 32)
    assert (configs.dq_atomic, configs.trig_poly, configs.trig_terms) == (True, False, 4)
    assert (configs.taylor_order, configs.taylor_tolerance, configs.dq_transpose) == (3, 1e-7, True)
    assert triton_launch.with_variant(base, triton_launch.describe(configs)) == configs
    assert triton_launch.with_variant(base, "") == base
    for bad, name in (("fwd=128x48", "block_n"), ("fwd_long=64x48", "fwd_long.*block_n"),
                      ("dq_atomic=yes", "dq_atomic"),
                      ("dq_transpose=2", "dq_transpose"),
                      ("trig_terms=2", "trig_terms"), ("taylor_order=7", "taylor_order"),
                      ("blocks=1", "key=value"), ("fwd=128", "BMxBN"),
                      ("fwd=64x64/4/2/r7", "register cap"), ("fwd=64x64/4/2/r256", "register cap"),
                      ("fwd=64x64/4/2/r16x", "register cap"), ("fwd=64x64/r168/4", "BMxBN")):
        with pytest.raises(ValueError, match=name):
            triton_launch.parse_variant(bad)
    # a register cap: parsed, written back, and handed to the launch as Triton's maxnreg
    capped = triton_launch.with_variant(base, "fwd=64x64/4/2/r168/ws,fwd_long=128x64/8/3")
    assert capped.fwd == triton_launch.KernelConfig(64, 64, 4, 2, warp_specialize=True, max_registers=168)
    assert str(capped.fwd) == "64x64/4/2/r168/ws" and capped.fwd_long.max_registers is None
    assert triton_launch.with_variant(base, triton_launch.describe(capped)) == capped
    assert capped.fwd.launch_options() == dict(num_warps=4, num_stages=2, maxnreg=168)
    assert capped.fwd_long.launch_options() == dict(num_warps=8, num_stages=3)
    d64 = triton_launch.default_configs(64, 64, torch.float16)
    monkeypatch.setenv(triton_launch.VARIANT_ENV, "dq_atomic=1,trig_terms=5")
    chosen = triton_launch.default_configs(64, 64, torch.float16)
    assert (chosen.dq_atomic, chosen.trig_terms, chosen.fwd) == (True, 5, d64.fwd)
    monkeypatch.setenv(triton_launch.VARIANT_ENV, "trig_terms=9")
    with pytest.raises(ValueError, match=triton_launch.VARIANT_ENV):
        triton_launch.default_configs(64, 64, torch.float16)


def test_gpu_defaults_by_head_size_and_dtype(monkeypatch):
    """The GPU defaults (results/kernel-h200/probe-2026-12-01, run-9.md): 16-bit D=128 takes dQ by
    atomics, MUFU trig, the degree-2 far-tile series at tolerance 1e-5 (in the forward in the column
    term, run-14.md), the lean forward (split distances, MUFU scalars, cos in radians) and the dK/dV
    kernel's trig in radians; 16-bit D=64 a 64x32/4/2 dQ
    kernel, MUFU trig, the same series and the same forward, with the forward and dK/dV kernels
    under a 168-register cap (run-11.md, run-12.md) and both backward kernels' trig in radians
    (run-17.md), their far-tile scalars from the MUFU and the dQ kernel's split distances
    (run-18.md); D=128's forward takes its K/V tiles by TMA (run-24.md); float32 none of them (its
    grades would show in float32 results)."""
    monkeypatch.setattr(triton_launch, "_INTERPRETING", False)
    monkeypatch.delenv(triton_launch.VARIANT_ENV, raising=False)
    lean = (True, True, True)
    d128 = triton_launch.default_configs(128, 128, torch.bfloat16)
    assert (d128.dq_atomic, d128.dq_transpose, d128.trig_poly, d128.taylor_order, d128.taylor_tolerance,
            d128.fwd_row_series) == (True, True, False, 2, 1e-5, True)
    assert triton_launch.fwd_flags(d128)["SPLIT_S"] == 2
    assert (d128.fwd_split_s, d128.fwd_fast_scalars, d128.fwd_cos_radians, d128.dkdv_cos_radians) == (*lean, True)
    assert triton_launch.default_configs(128, 128, torch.float16) == d128
    d64 = triton_launch.default_configs(64, 64, torch.bfloat16)
    assert (d64.dq, d64.trig_poly, d64.taylor_order, d64.taylor_tolerance, d64.fwd_row_series, d64.dq_atomic) == (
        triton_launch.KernelConfig(64, 32, 4, 2), False, 2, 1e-5, True, None)
    assert (d64.fwd_split_s, d64.fwd_fast_scalars, d64.fwd_cos_radians, d64.dkdv_cos_radians) == (*lean, True)
    assert (d64.dq_cos_radians, d128.dq_cos_radians) == (True, None)  # D=128's dQ goes by atomics
    capped = triton_launch.KernelConfig(64, 64, 4, 2, max_registers=168)
    assert (d64.fwd, d64.fwd_long, d64.dkdv) == (capped, None, triton_launch.KernelConfig(32, 64, 4, 2, max_registers=168))
    assert (d128.fwd.max_registers, d128.fwd_long.max_registers, d128.dkdv.max_registers) == (None,) * 3
    # the MUFU trig without LONG_PHASE: both kernels take the cos in radians where the config asks
    flags = dict(TRIG_POLY=False, LONG_PHASE=False)
    assert triton_launch.fwd_flags(d64, flags)["COS_RADIANS"] and triton_launch.dkdv_flags(d64, flags)["COS_RADIANS"]
    assert triton_launch.dq_flags(d64, flags)["COS_RADIANS"]
    assert (d64.bwd_fast_scalars, d64.dq_split_s, d128.bwd_fast_scalars, d128.dq_split_s) == (True, True, None, None)
    assert (triton_launch.dq_flags(d64, flags)["SPLIT_S"], triton_launch.dq_flags(d64, flags)["FAST_SCALARS"]) == (1, True)
    assert (triton_launch.dkdv_flags(d64, flags)["SPLIT_S"], triton_launch.dkdv_flags(d64, flags)["FAST_SCALARS"]) == (0, True)
    assert not triton_launch.dkdv_flags(d128, flags)["FAST_SCALARS"]
    assert triton_launch.dkdv_flags(d128, flags)["COS_RADIANS"]
    assert not triton_launch.fwd_flags(d128, dict(flags, LONG_PHASE=True))["COS_RADIANS"]
    # the forward's K/V tiles by TMA at D=128 only (run-24.md), no backward kernel's, no lazy rescale
    assert (triton_launch.fwd_flags(d128)["TMA"], triton_launch.fwd_flags(d64)["TMA"]) == (True, False)
    for configs in (d64, d128):
        assert not triton_launch.fwd_flags(configs)["LAZY_RESCALE"]
        assert not (triton_launch.dkdv_flags(configs)["TMA"] or triton_launch.dq_flags(configs)["TMA"])
    for head_dim in (64, 128):
        plain = triton_launch.default_configs(head_dim, head_dim, torch.float32)
        assert (plain.dq_atomic, plain.trig_poly, plain.trig_terms, plain.taylor_order) == (None,) * 4
        assert (plain.fwd_split_s, plain.fwd_cos_radians, plain.dkdv_cos_radians, plain.fwd_row_series,
                plain.dq_cos_radians, plain.bwd_fast_scalars, plain.dq_split_s) == (None,) * 7


def test_gpu_forward_tile_by_key_length(monkeypatch):
    """16-bit D=128: the 4-warp 64x64 forward up to FWD_SHORT_KEYS keys and 128x64/8/3 above
    (results/kernel-h200/run-5.md); 16-bit D=64 the 64x64 one under a register cap at every length
    (run-11.md); other widths and float32 one tile at every length. An explicit
    fwd (TAPA_KERNEL_VARIANT, a variant, override_configs) is the tile at every length."""
    monkeypatch.setattr(triton_launch, "_INTERPRETING", False)
    monkeypatch.delenv(triton_launch.VARIANT_ENV, raising=False)
    K, limit = triton_launch.KernelConfig, triton_launch.FWD_SHORT_KEYS
    short, long_, wide = K(64, 64, 4, 2), K(128, 64, 8, 3), K(128, 128, 8, 2)
    capped = K(64, 64, 4, 2, max_registers=168)

    def tiles(configs):
        return [triton_launch.forward_config(configs, n_k)
                for n_k in (1, 1024, limit, limit + 1, 65536)]

    assert limit == 16384
    for dtype in (torch.bfloat16, torch.float16):
        assert tiles(triton_launch.default_configs(128, 128, dtype)) == [short] * 3 + [long_] * 2
        assert tiles(triton_launch.default_configs(64, 64, dtype)) == [capped] * 5
        assert tiles(triton_launch.default_configs(256, 256, dtype)) == [K(64, 64, 4, 2)] * 5
    assert tiles(triton_launch.default_configs(64, 64, torch.float32)) == [long_] * 5
    assert triton_launch.default_configs(128, 128, torch.float32).fwd_long is None
    d128 = triton_launch.default_configs(128, 128, torch.bfloat16)
    assert triton_launch.with_variant(d128, {"fwd": wide}).fwd_long is None
    bare = triton_launch.LaunchConfigs(K(16, 16), K(16, 16), K(16, 16))
    assert triton_launch.with_variant(bare, triton_launch.describe(d128)) == d128
    monkeypatch.setenv(triton_launch.VARIANT_ENV, "fwd=128x128/8/2")
    assert tiles(triton_launch.default_configs(128, 128, torch.bfloat16)) == [wide] * 5
    monkeypatch.setenv(triton_launch.VARIANT_ENV, "fwd_long=128x128/8/2")
    assert tiles(triton_launch.default_configs(64, 64, torch.bfloat16)) == [capped] * 3 + [wide] * 2
    # an explicit fwd in TAPA_KERNEL_VARIANT replaces the short/long pair and keeps the other fields
    monkeypatch.setenv(triton_launch.VARIANT_ENV, "fwd=128x64/8/3,dq_transpose=0")
    lean = dict(trig_poly=False, fwd_split_s=True, fwd_fast_scalars=True, fwd_cos_radians=True)
    run4 = dict(fwd=long_, dkdv=K(32, 128, 8, 2), taylor_order=2, taylor_tolerance=1e-5,
                fwd_row_series=True, dq_transpose=False, **lean)
    assert triton_launch.default_configs(128, 128, torch.bfloat16) == triton_launch.LaunchConfigs(
        dq=K(128, 16, 8, 2), dq_atomic=True, dkdv_cos_radians=True, fwd_tma=True, **run4)
    assert triton_launch.default_configs(64, 64, torch.bfloat16) == triton_launch.LaunchConfigs(
        dq=K(64, 32, 4, 2), dkdv_cos_radians=True, dq_cos_radians=True, bwd_fast_scalars=True,
        dq_split_s=True, far_bands=True,
        **dict(run4, dkdv=K(32, 64, 4, 2, max_registers=168)))
    monkeypatch.delenv(triton_launch.VARIANT_ENV)
    with triton_launch.override_configs(triton_launch.LaunchConfigs(K(32, 32), K(16, 32), K(32, 16))):
        assert tiles(triton_launch.default_configs(128, 128, torch.bfloat16)) == [K(32, 32)] * 5


def _record_launches(monkeypatch, name: str, record) -> None:
    """Wrap the Triton kernel `name` of triton_kernels so that each launch calls record(kwargs)
    (its launch options and constexprs) before it runs."""
    kernel = getattr(triton_launch.kernels, name)

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                record(kwargs)
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(triton_launch.kernels, name, Recording())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_tile_by_key_length_matches_the_reference(dtype, monkeypatch):
    """Configs with another forward tile above FWD_SHORT_KEYS keys (40 here): the forward launches
    the tile of its key length, and the backward, with tiles of its own, reads the lse of either
    forward: out, lse and every gradient match float64 on both sides of the limit."""
    monkeypatch.setattr(triton_launch, "FWD_SHORT_KEYS", 40)
    K = triton_launch.KernelConfig
    configs = triton_launch.LaunchConfigs(K(16, 16), K(16, 32), K(32, 16), fwd_long=K(32, 32))
    launched = []
    _record_launches(monkeypatch, "_fwd_kernel", lambda kwargs: launched.append(
        K(*(kwargs[name] for name in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")))))
    for k_len, causal, tile in ((40, True, configs.fwd), (41, True, configs.fwd_long),
                                (77, False, configs.fwd_long)):
        q, k, v = _inputs(1, 37, k_len, 2, 1, 32, 32, dtype, seed=k_len)
        with triton_launch.override_configs(configs):
            _check(q, k, v, causal=causal, q_offset=k_len - 37)
        assert launched[-1] == tile, (k_len, launched)


def test_deterministic_mode_takes_the_dq_kernel():
    atomic = triton_launch.with_variant(triton_launch.default_configs(32, 32, torch.float16),
                                        "dq_atomic=1,dq_transpose=1")
    def ordering(configs):  # the flags this mode sets (the trig and distance ones are the configs')
        flags = triton_launch.dkdv_flags(configs)
        return {name: flags[name] for name in ("DQ_ATOMIC", "DQ_TRANSPOSE", "REVERSE_Q")}

    assert triton_launch.dq_by_atomics(atomic)
    assert ordering(atomic) == dict(DQ_ATOMIC=True, DQ_TRANSPOSE=True, REVERSE_Q=False)
    assert triton_launch.dkdv_flags(replace(atomic, dq_atomic=False))["DQ_TRANSPOSE"] is False
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not triton_launch.dq_by_atomics(atomic)
        assert ordering(atomic) == dict(DQ_ATOMIC=False, DQ_TRANSPOSE=False, REVERSE_Q=False)
    finally:
        torch.use_deterministic_algorithms(was)


def test_float32_keeps_float32_grade_trig():
    configs = triton_launch.with_variant(triton_launch.default_configs(32, 32, torch.float32),
                                         "trig_terms=3")
    assert triton_launch.trig_terms(configs, torch.float32) == 4
    assert triton_launch.trig_terms(configs, torch.float16) == 3


def _lse_error_bound(q, k, configs, *, theta=0.5, alpha=0.1, distance="power", phase="quadratic",
                     q_offset=0, k_offset=0, **_):
    """|lse error| <= max |amplitude logit| * (trig error + 2 pi * taylor tolerance * max |t|):
    lse moves by at most its largest logit's error, logit = amplitude * cos(2 pi t), t the phase
    in turns (bounded here by its largest factors, over every pair of positions); with
    fwd_dot_rowsum, plus the input dtype's unit roundoff (the row sums add rounded probabilities)."""
    from tapa.ops.tapa.reference import distance_weight, split_dims
    from tapa.ops.tapa.logits import TRIG_COEFFICIENTS

    dtype, group = q.dtype, q.shape[2] // k.shape[2]
    k = k.double().repeat_interleave(group, dim=2)
    q = q.double()
    amp_dim, phase_dim = split_dims(q.shape[-1], theta)
    amplitude = torch.einsum("bqhd,bkhd->bhqk", q[..., :amp_dim], k[..., :amp_dim]).abs().max()
    if phase == "quadratic":
        phi = torch.einsum("bqhd,bkhd->bhqk", q[..., amp_dim:], k[..., amp_dim:]).abs().max()
    else:
        phi = q[..., amp_dim:].sum(-1).abs().max() + k[..., amp_dim:].sum(-1).abs().max()
    max_distance = max(q_offset + q.shape[1] - 1 - k_offset, k_offset + k.shape[1] - 1 - q_offset)
    weight = distance_weight(torch.tensor(float(max_distance), dtype=torch.float64), alpha, distance)
    max_turns = weight * phi / phase_dim ** 0.5
    if triton_launch.trig_poly(configs):
        trig_error = TRIG_COEFFICIENTS[triton_launch.trig_terms(configs, dtype)][2]
    else:  # PTX ISA: cos.approx/sin.approx.f32, max absolute error 2**-20.5 on [-pi, pi]
        trig_error = 2.0 ** -20
    tolerance = configs.taylor_tolerance or triton_launch.TAYLOR_TOLERANCE
    bound = float(amplitude / amp_dim ** 0.5 * (trig_error + 2 * torch.pi * tolerance * max_turns))
    if configs.fwd_dot_rowsum:  # the row sums of the rounded probabilities: each within the unit
        bound += torch.finfo(dtype).eps / 2  # roundoff, so log(l) within it too
    return bound


VARIANTS = {  # spec: call arguments (FAR where the variant changes the far-tile series)
    # (far_bands=0 with taylor_order=3: the 16-bit D=64 default's bands take the column-term series
    # at orders up to 2 only, test_bands_refuse_a_column_series_past_order_2)
    "trig_terms=4": {},
    "trig_terms=3": {},
    "far_bands=0,taylor_order=3,taylor_tolerance=1e-6": FAR,
    "taylor_order=2,taylor_tolerance=1e-6,dq_atomic=1,trig_terms=3": FAR,
    "dq_atomic=1,dq_transpose=1": dict(theta=0.75),  # both column halves padded (24 + 8 of 32)
    "dkdv_reverse=1": {},  # the dK/dV kernel's unmasked query blocks from the last one down
    "dkdv_reverse=1,dq_atomic=1,dq_transpose=1": dict(causal=False),  # every block unmasked
    "fwd=16x32/4/1/ws,dkdv=32x16/4/1/ws,dq=16x32/4/3/ws": {},
    "fwd_split_s=1": {},  # the forward's distances as row offsets less a column ramp
    # ... and far tiles' u from them
    "far_bands=0,fwd_split_s=1,taylor_order=3,taylor_tolerance=1e-6": FAR,
    "far_bands=0,fwd_split_s=1,fwd_fast_scalars=1,taylor_order=3,taylor_tolerance=1e-6": FAR,
    # the far-tile series in the column term, at each order it takes
    "far_bands=0,fwd_row_series=1,taylor_order=3,taylor_tolerance=1e-6": FAR,
    "fwd_row_series=1,taylor_order=2,taylor_tolerance=1e-5": FAR,
    "fwd_ramp_series=1,taylor_order=2,taylor_tolerance=1e-5": FAR,  # ... on the column ramp
    "far_bands=0,fwd_ramp_series=1,taylor_order=3,taylor_tolerance=1e-6": FAR,
    "fwd_dot_rowsum=1": {},  # the softmax row sums on the tensor cores
    "fwd_tma=1": {},  # the forward's K/V tiles by TMA descriptors (rows past N zero-filled)
    "fwd_tma=1,fwd_ramp_series=1,taylor_order=2,taylor_tolerance=1e-5": dict(FAR, causal=False),
    # the accumulators rescaled only where a row's max passes theirs by 2 ** 8 (the large logits
    # of theta 0.75 make some tiles do it, others not)
    "fwd_lazy_rescale=1": dict(theta=0.75),
    "fwd_lazy_rescale=1,fwd_dot_rowsum=1,fwd_tma=1": {},
    # three series bands (orders 1, 2, 3 at 1e-5); at q_offset 6000 every tile is in the farthest
    # (test_far_bands_within_the_half_precision_bar takes the others)
    "far_bands=1,fwd_row_series=1,taylor_order=2,taylor_tolerance=1e-5": FAR,
    # the forward as a persistent kernel (under the interpreter one SM: each program several tiles)
    "fwd_persistent=1": {},
    "fwd_persistent=1,fwd_tma=1": dict(causal=False),
    "fwd_persistent=1,fwd_ramp_series=1,taylor_order=2,taylor_tolerance=1e-5": FAR,
    # the backward's loop tiles by TMA, with the separate dQ kernel and with dQ by atomics
    "dkdv_tma=1,dq_tma=1": {},
    "dkdv_tma=1,dq_atomic=1,dq_transpose=1": dict(causal=False),
    "far_bands=0,dkdv_tma=1,dq_tma=1,dq_split_s=1,taylor_order=3,taylor_tolerance=1e-6": FAR,
    "fwd_dot_rowsum=1,fwd_ramp_series=1,taylor_order=2,taylor_tolerance=1e-5": FAR,
    # (not at q_offset 20000: there this case's float16 dq is 1.505x its reference's for every
    # series, the exact one included; results/kernel-h200/run-14.md)
    # the backward kernels' distances as row offsets less a ramp, near and far, and the dQ
    # kernel's far-tile series in the column term (dQ by its own kernel, as the D=64 default)
    "dq_split_s=1,dkdv_split_s=1": {},
    "far_bands=0,dq_split_s=1,dkdv_split_s=1,taylor_order=3,taylor_tolerance=1e-6": FAR,
    "dq_row_series=1,taylor_order=2,taylor_tolerance=1e-5": FAR,
    "dkdv_split_s=1,dq_atomic=1,dq_transpose=1": dict(causal=False),  # every block unmasked
    # the backward's far-tile scalars (the interpreter takes the exact log2 and division; the
    # MUFU's forms: test_fast_far_tile_scalars_within_the_half_precision_bar)
    "far_bands=0,bwd_fast_scalars=1,taylor_order=3,taylor_tolerance=1e-6": FAR,
}


@pytest.mark.parametrize("spec", VARIANTS)
def test_variant_within_the_half_precision_bar(spec):
    """float16, ragged N, GQA: out and every gradient within 1.5x the float16 reference's error
    vs float64; lse (float32 for every input dtype) within the bound its approximations allow."""
    _check_variant(spec, VARIANTS[spec])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="the MUFU's cos.approx/sin.approx are PTX (no interpreter)")
def test_mufu_trig_within_the_half_precision_bar():
    _check_variant("trig_poly=0", {})
    _check_variant("trig_poly=0,dq_atomic=1", FAR)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="the MUFU's lg2.approx/rcp.approx are PTX (no interpreter)")
def test_fast_far_tile_scalars_within_the_half_precision_bar():
    _check_variant("far_bands=0,fwd_split_s=1,fwd_fast_scalars=1,taylor_order=3,"
                   "taylor_tolerance=1e-6", FAR)
    _check_variant("far_bands=0,bwd_fast_scalars=1,dq_split_s=1,dkdv_split_s=1,taylor_order=3,"
                   "taylor_tolerance=1e-6", FAR)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="the MUFU's cos.approx is PTX (no interpreter)")
@pytest.mark.parametrize("call", [{}, FAR, dict(alpha=0.5, q_offset=3000)], ids=["near", "far", "alpha0.5"])
def test_cos_in_radians_within_the_half_precision_bar(call):
    """fwd_cos_radians: the MUFU cos on the unreduced phase in radians; at alpha 0.5 and distances
    up to 3036 the phase reaches tens of turns."""
    _check_variant("trig_poly=0,fwd_cos_radians=1,fwd_split_s=1,fwd_fast_scalars=1", call)
    _check_variant("trig_poly=0,dq_atomic=1,dq_transpose=1,dkdv_cos_radians=1", call)
    _check_variant("trig_poly=0,dq_atomic=0,dkdv_cos_radians=1", call)  # dQ by its own kernel
    _check_variant("trig_poly=0,dq_atomic=0,dq_cos_radians=1,dkdv_cos_radians=1", call)  # ... in radians


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_lazy_rescale_follows_rising_maxima(causal):
    """fwd_lazy_rescale on logits that grow along the keys (k's amplitude part scaled by 1 .. 70),
    so that rows' maxima pass the accumulators' by more than 2 ** 8 at later tiles, not only the
    first (a rescale skipped there overflows p): out, lse and every gradient within 1.5x the
    float32 reference's error against float64 (these logits make the gradients ill-conditioned)."""
    q, k, v = _inputs(1, 70, 70, 2, 1, 32, 32, torch.float32, seed=33)
    k[..., :16] *= (1 + torch.arange(70, device=k.device, dtype=k.dtype))[None, :, None, None]
    configs = triton_launch.with_variant(triton_launch.default_configs(32, 32, q.dtype),
                                         "fwd_lazy_rescale=1")
    with triton_launch.override_configs(configs):
        fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, 0, causal=causal)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, causal=causal)
    same_dtype = _run(chunked_tapa_attention, q, k, v, 0, causal=causal)
    for name in GRADS:
        error, floor = rel_rmse(fused[name], exact[name]), rel_rmse(same_dtype[name], exact[name])
        assert error <= HALF_BAR * floor + 1e-7, (name, error, floor)


def test_tma_only_where_the_tensors_allow_it():
    """tma_ok: every part a power of two of 16 bytes or more, filling D, 16-byte strides and base;
    the launcher then keeps TMA, else clears it and passes no descriptors (the pointer loads)."""
    t = torch.zeros(2, 40, 3, 64, dtype=torch.float16, device=DEVICE)
    assert triton_launch.tma_ok(t, (32, 32)) and triton_launch.tma_ok(t, (64,))
    assert not triton_launch.tma_ok(t, (48, 16))  # 48 is not a power of two
    assert not triton_launch.tma_ok(t, (32, 16))  # the parts must fill D
    assert not triton_launch.tma_ok(t[..., :8], (4, 4))  # 8-byte parts
    shifted = torch.zeros(t.numel() + 1, dtype=t.dtype, device=DEVICE)[1:].view(t.shape)  # base + 2 B
    assert not triton_launch.tma_ok(shifted, (32, 32))
    odd = torch.zeros(2, 40, 3, 68, dtype=torch.float16, device=DEVICE)[..., :64]  # 136-byte rows
    assert not triton_launch.tma_ok(odd, (32, 32))
    flags = dict(TMA=True)
    assert triton_launch._loop_descriptors(flags, t, t, 16, 32)[0] is not None and flags["TMA"]
    flags = dict(TMA=True)
    assert triton_launch._loop_descriptors(flags, t, t, 16, 48) == [None] * 3 and not flags["TMA"]
    flags = dict(TMA=False)
    assert triton_launch._loop_descriptors(flags, t, t, 16, 32) == [None] * 3 and not flags["TMA"]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_persistent_forward_covers_every_tile(causal):
    """fwd_persistent where the query blocks (3) and batch-heads (6) differ in number, so that a
    tile order mixing the two up would miss or repeat tiles: out and lse at float32 accuracy."""
    q, k, v = _inputs(2, 70, 70, 3, 1, 32, 32, torch.float32, seed=34)
    configs = triton_launch.with_variant(triton_launch.default_configs(32, 32, q.dtype), "fwd_persistent=1")
    with triton_launch.override_configs(configs):
        fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, 0, causal=causal)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, causal=causal)
    for name in ("out", "lse"):
        assert rel_rmse(fused[name], exact[name]) < FLOAT32_TOLERANCE, name


def test_dot_rowsum_flag():
    """fwd_dot_rowsum reaches the forward's constexprs; off unless asked for (float32 too)."""
    base = triton_launch.default_configs(64, 64, torch.float16)
    assert triton_launch.fwd_flags(triton_launch.with_variant(base, "fwd_dot_rowsum=1"))["DOT_ROWSUM"]
    assert not triton_launch.fwd_flags(base)["DOT_ROWSUM"]
    assert not triton_launch.fwd_flags(triton_launch.default_configs(64, 64, torch.float32))["DOT_ROWSUM"]


def test_row_series_flags_and_orders():
    """fwd_row_series makes the forward's SPLIT_S 2 (it implies the split distances) and refuses
    the orders `_column_series` does not take."""
    base = triton_launch.with_variant(triton_launch.default_configs(64, 64, torch.float16),
                                      "taylor_order=3,far_bands=0")
    flags = triton_launch.fwd_flags(triton_launch.with_variant(base, "fwd_split_s=0,fwd_row_series=1"))
    assert flags["SPLIT_S"] == 2
    assert triton_launch.fwd_flags(triton_launch.with_variant(base, "fwd_split_s=1,fwd_row_series=0"))["SPLIT_S"] == 1
    ramp = triton_launch.with_variant(base, "fwd_split_s=0,fwd_row_series=0,fwd_ramp_series=1")
    assert triton_launch.fwd_flags(ramp)["SPLIT_S"] == 3  # the ramp form implies both
    with pytest.raises(ValueError, match="taylor_order 1..3"):
        triton_launch.fwd_flags(triton_launch.with_variant(ramp, "taylor_order=5"))
    with pytest.raises(ValueError, match="taylor_order 1..3"):
        triton_launch.fwd_flags(triton_launch.with_variant(base, "fwd_row_series=1,taylor_order=4"))


@triton.jit
def _column_series_kernel(A, Col, Out, scale, p0, b1, b2, b3, M: tl.constexpr, N: tl.constexpr,
                          ORDER: tl.constexpr, RAMP: tl.constexpr):
    a = tl.load(A + tl.arange(0, M))
    col = tl.load(Col + tl.arange(0, N))
    fs = triton_logits._column_series(a, col, scale, p0, b1, b2, b3, ORDER, RAMP)
    tl.store(Out + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], fs)


@pytest.mark.parametrize("ramp", [False, True], ids=["column-vector", "ramp"])
def test_row_series_matches_the_u_series(ramp):
    """The column-term series against the float64 series it rewrites, p0 (1 + sum b_k u**k) with
    u = a + b, over a far tile's band (64 x 64 at the smallest centre distance the band allows):
    float32 rounding only, which a wrong coefficient exceeds by orders of magnitude. The column
    term is the ramp times -1 / d0; `ramp`: the form that keeps the two apart (fwd_ramp_series)."""
    for order, tolerance in ((1, 1e-5), (2, 1e-5), (3, 1e-6)):
        rho, coefficients = triton_launch.taylor_constants(0.1, order, tolerance)
        d0 = 63 / rho
        a = (torch.arange(64, dtype=torch.float64) - 31.5) / d0  # u at each row's first column
        ramp_values = torch.arange(64, dtype=torch.float64)
        b = -ramp_values / d0
        p0 = 3.25
        u = a[:, None] + b[None, :]
        exact = p0 * (1 + sum(c * u ** (k + 1) for k, c in enumerate(coefficients[:order])))
        out = torch.empty(64, 64, dtype=torch.float32, device=DEVICE)
        _column_series_kernel[(1,)](a.float().to(DEVICE), ramp_values.float().to(DEVICE), out, -1 / d0, p0,
                                    *coefficients[:3], M=64, N=64, ORDER=order, RAMP=ramp)
        error = ((out.double().cpu() - exact).abs() / exact.abs()).max().item()
        assert error < 4e-7, (order, error)


def test_cos_in_radians_only_where_it_applies():
    """The host turns fwd_cos_radians on only with the MUFU trig and without LONG_PHASE, and then
    the forward's phase_scale carries 2 pi."""
    configs = triton_launch.with_variant(triton_launch.default_configs(128, 128, torch.bfloat16),
                                         "trig_poly=0,fwd_cos_radians=1")
    flags = dict(TRIG_POLY=False, LONG_PHASE=False)
    assert triton_launch.fwd_flags(configs, flags)["COS_RADIANS"]
    assert not triton_launch.fwd_flags(configs, dict(flags, LONG_PHASE=True))["COS_RADIANS"]
    assert not triton_launch.fwd_flags(configs, dict(flags, TRIG_POLY=True))["COS_RADIANS"]
    assert not triton_launch.fwd_flags(configs)["COS_RADIANS"]
    assert not triton_launch.fwd_flags(None, flags)["COS_RADIANS"]  # off by default
    both = triton_launch.with_variant(configs, "dkdv_cos_radians=1")
    assert triton_launch.dkdv_flags(both, flags)["COS_RADIANS"]
    assert not triton_launch.dkdv_flags(both, dict(flags, LONG_PHASE=True))["COS_RADIANS"]
    scalars, grads = triton_launch.with_radians([1.0, 0.5, 0.1], [0.25, -2 * math.pi])
    assert scalars == [1.0, math.pi, 0.1] and grads == [0.25, -1.0]
    dq = triton_launch.with_variant(configs, "dq_cos_radians=1")
    assert triton_launch.dq_flags(dq, flags)["COS_RADIANS"]
    assert not triton_launch.dq_flags(dq, dict(flags, TRIG_POLY=True))["COS_RADIANS"]
    assert not triton_launch.dq_flags(configs, flags)["COS_RADIANS"]  # the dQ kernel's own flag


def test_backward_distance_flags():
    """The backward kernels' SPLIT_S and FAST_SCALARS: off where the configs turn them off (the
    D=64 16-bit GPU defaults turn them on); dq_row_series implies the split distances and takes
    the column-term orders only, as fwd_row_series."""
    base = triton_launch.with_variant(triton_launch.default_configs(64, 64, torch.bfloat16),
                                      "taylor_order=2,bwd_fast_scalars=0,dq_split_s=0,dkdv_split_s=0")
    assert triton_launch.dq_flags(base) == dict(SPLIT_S=0, FAST_SCALARS=False, COS_RADIANS=False, TMA=False,
                                                BANDS=False)
    flags = triton_launch.dkdv_flags(base)
    assert (flags["SPLIT_S"], flags["FAST_SCALARS"]) == (0, False)
    both = triton_launch.with_variant(base, "dq_split_s=1,dkdv_split_s=1,bwd_fast_scalars=1")
    assert triton_launch.dq_flags(both)["SPLIT_S"] == 1 and triton_launch.dq_flags(both)["FAST_SCALARS"]
    flags = triton_launch.dkdv_flags(both)
    assert (flags["SPLIT_S"], flags["FAST_SCALARS"]) == (1, True)
    assert triton_launch.dq_flags(triton_launch.with_variant(base, "dq_row_series=1"))["SPLIT_S"] == 2
    with pytest.raises(ValueError, match="dq_row_series takes taylor_order 1..3"):
        triton_launch.dq_flags(triton_launch.with_variant(base, "dq_row_series=1,taylor_order=4"))


def _check_variant(spec, call, all_far=True):
    kwargs = {"causal": True, **call}
    q, k, v = _inputs(1, 37, 37, 2, 1, 32, 32, torch.float16, seed=31)
    configs = triton_launch.with_variant(triton_launch.default_configs(32, 32, q.dtype), spec)
    if "taylor_order" in spec and all_far:  # every kernel's tiles must take the far-tile series
        rho, _ = triton_launch.taylor_constants(0.1, configs.taylor_order, configs.taylor_tolerance)
        half_span = max((c.block_m + c.block_n - 2) / 2 for c in (configs.fwd, configs.dkdv, configs.dq))
        assert half_span <= rho * (kwargs["q_offset"] - 37), (half_span, rho)
    with triton_launch.override_configs(configs):
        fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, 0, **kwargs)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, **kwargs)
    same_dtype = _run(chunked_tapa_attention, q, k, v, 0, **kwargs)
    for name in ("out", "dq", "dk", "dv"):
        error, floor = rel_rmse(fused[name], exact[name]), rel_rmse(same_dtype[name], exact[name])
        assert error <= HALF_BAR * floor, (name, error, floor)
    _check_lse(fused, exact, same_dtype, _lse_error_bound(q, k, configs, **kwargs))


@pytest.mark.parametrize("q_offset", [0, 200, 900, 6000], ids=["near", "outer", "middle", "farthest"])
@pytest.mark.parametrize("spec", [
    "far_bands=1,fwd_row_series=1,taylor_order=2,taylor_tolerance=1e-5",
    "far_bands=1,fwd_row_series=0,fwd_split_s=1,taylor_order=2,taylor_tolerance=1e-5",
    "far_bands=1,fwd_row_series=0,taylor_order=4,taylor_tolerance=1e-6",
    "far_bands=1,fwd_ramp_series=1,taylor_order=2,taylor_tolerance=1e-5",
    # the backward kernels' bands: the dQ kernel's split distances, its column-term series and
    # the dK/dV kernel's unsplit ones; dQ by atomics from the dK/dV kernel
    "bwd_bands=1,dq_split_s=1,taylor_order=2,taylor_tolerance=1e-5",
    "bwd_bands=1,dq_row_series=1,dkdv_split_s=1,taylor_order=2,taylor_tolerance=1e-5",
    "bwd_bands=1,far_bands=1,dq_atomic=1,dq_transpose=1,taylor_order=2,taylor_tolerance=1e-5",
], ids=["column-series", "u-series", "order-4", "ramp-series", "bwd-split", "bwd-column",
        "bwd-atomic"])
def test_far_bands_within_the_half_precision_bar(spec, q_offset):
    """far_bands (the forward's) and bwd_bands (the backward kernels') at offsets that put the
    interpreter's tiles (half-spans about 23) in each band (alpha 0.1, order 2 at 1e-5): near
    the diagonal; between it and the order-2 band (rho_out 0.125 at order 3: centres from about
    184, some of q_offset 200's tiles); in the order-2 band (rho 0.056: from 411); and in the
    farthest (rho_in 0.0105 at order 1: from 2182)."""
    _check_variant(spec, dict(q_offset=q_offset), all_far=False)


@triton.jit
def _distance_weight_kernel(S, Out, s_lo, s_hi, alpha, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in,
                            rho_out, M: tl.constexpr, N: tl.constexpr, ORDER: tl.constexpr,
                            BANDS: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    s = tl.load(S + offs)
    fs = triton_logits._scaled_distance_weight(
        s, s, s, s_lo, s_hi, alpha, 1.0, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in, rho_out, True,
        ORDER, BANDS, False, False, 0, False)
    tl.store(Out + offs, fs)


@pytest.mark.parametrize("order,tolerance", [(2, 1e-5), (4, 1e-6)])
def test_far_bands_hold_their_tolerance_in_every_band(order, tolerance):
    """`_scaled_distance_weight` with BANDS on 64 x 64 tiles whose centres sweep every band (each
    band's nearest centre and the next one in): d ** alpha within the series' tolerance plus
    float32 rounding, against float64; a band given the wrong order or radius exceeds it."""
    configs = triton_launch.with_variant(triton_launch.default_configs(64, 64, torch.float32),
                                         f"far_bands=1,taylor_order={order},taylor_tolerance={tolerance}")
    scalars, flags = triton_launch.logits_args(alpha=0.1, distance="power", phase="quadratic", phase_dim=1,
                                               dtype=torch.float32, max_distance=10 ** 6, configs=configs)
    rho, coefficients, rho_in, rho_out = scalars[2], scalars[3:9], scalars[9], scalars[10]
    ramp = torch.arange(64, dtype=torch.float64)
    for radius in (rho_in, rho, rho_out):
        for centre in (63 / radius, 63 / radius + 1.5, 63 / radius - 1.5):
            s = centre + ramp[:, None] - ramp[None, :]  # s_lo = centre - 63, s_hi = centre + 63
            s = s.round()
            out = torch.empty(64, 64, dtype=torch.float32, device=DEVICE)
            _distance_weight_kernel[(1,)](s.float().to(DEVICE), out, float(s.min()), float(s.max()), 0.1,
                                          rho, *coefficients, rho_in, rho_out, M=64, N=64, ORDER=order,
                                          BANDS=True)
            error = ((out.double().cpu() - s ** 0.1) / s ** 0.1).abs().max().item()
            assert error < 1.2 * tolerance + 4e-7, (radius, centre, error)


def test_far_bands_radii_and_orders():
    """far_bands' radii are the orders -/+ 1's at the same tolerance (the inner one narrower);
    without it both are 0; its BANDS is on in the forward only, bwd_bands' (the same radii) in
    the two backward kernels only; orders outside 2..5, or a column-term series whose outer band
    would pass order 3, are refused."""
    base = triton_launch.default_configs(64, 64, torch.float32)
    args = dict(alpha=0.1, distance="power", phase="quadratic", phase_dim=32, dtype=torch.float16,
                max_distance=1000)
    configs = triton_launch.with_variant(base, "far_bands=1,taylor_order=2,taylor_tolerance=1e-5")
    scalars, flags = triton_launch.logits_args(**args, configs=configs)
    rho, rho_in, rho_out = scalars[2], scalars[-2], scalars[-1]
    assert rho_in < rho < rho_out and not flags["BANDS"]
    assert triton_launch.fwd_flags(configs)["BANDS"] and not triton_launch.fwd_flags(base)["BANDS"]
    assert not triton_launch.dq_flags(configs)["BANDS"] and not triton_launch.dkdv_flags(configs)["BANDS"]
    backward = triton_launch.with_variant(base, "bwd_bands=1,taylor_order=2,taylor_tolerance=1e-5")
    assert triton_launch.logits_args(**args, configs=backward)[0][-2:] == scalars[-2:]
    assert triton_launch.dq_flags(backward)["BANDS"] and triton_launch.dkdv_flags(backward)["BANDS"]
    assert not triton_launch.fwd_flags(backward)["BANDS"]
    assert rho_in == triton_launch.taylor_constants(0.1, 1, 1e-5)[0]
    assert rho_out == triton_launch.taylor_constants(0.1, 3, 1e-5)[0]
    scalars, _ = triton_launch.logits_args(**args, configs=base)
    assert scalars[-2:] == [0.0, 0.0]
    for order in (1, 6):
        with pytest.raises(ValueError, match="far_bands: the bands take taylor_order 2..5"):
            triton_launch.logits_args(**args, configs=triton_launch.with_variant(
                base, f"far_bands=1,taylor_order={order}"))
    with pytest.raises(ValueError, match="taylor_order 1..2 with far_bands"):
        triton_launch.fwd_flags(triton_launch.with_variant(base, "far_bands=1,taylor_order=3,fwd_row_series=1"))
    with pytest.raises(ValueError, match="bwd_bands: the bands take taylor_order 2..5"):
        triton_launch.logits_args(**args, configs=triton_launch.with_variant(base, "bwd_bands=1,taylor_order=1"))
    with pytest.raises(ValueError, match="dq_row_series takes taylor_order 1..2 with bwd_bands"):
        triton_launch.dq_flags(triton_launch.with_variant(base, "bwd_bands=1,taylor_order=3,dq_row_series=1"))


def test_bands_refuse_a_column_series_past_order_2(monkeypatch):
    """The 16-bit D=64 default takes the bands and the column-term series at order 2; asked for
    order 3 it says which flag to drop, and without the bands takes it."""
    monkeypatch.setattr(triton_launch, "_INTERPRETING", False)
    monkeypatch.delenv(triton_launch.VARIANT_ENV, raising=False)
    base = triton_launch.default_configs(64, 64, torch.bfloat16)
    assert base.far_bands and base.fwd_row_series and base.taylor_order == 2
    assert triton_launch.fwd_flags(base)["BANDS"]
    with pytest.raises(ValueError, match="add far_bands=0 for order 3"):
        triton_launch.fwd_flags(triton_launch.with_variant(base, "taylor_order=3"))
    one_band = triton_launch.fwd_flags(triton_launch.with_variant(base, "taylor_order=3,far_bands=0"))
    assert one_band["SPLIT_S"] == 2 and not one_band["BANDS"]
    assert not triton_launch.default_configs(128, 128, torch.bfloat16).far_bands


def test_combined_variant_float32():
    """The cheap variants together stay at float32 accuracy on float32 inputs."""
    spec = "dq_atomic=1,trig_terms=3,taylor_order=3,taylor_tolerance=1e-7,dq=16x32/4/2/ws"
    q, k, v = _inputs(1, 37, 37, 2, 1, 32, 32, torch.float32, seed=32)
    configs = triton_launch.with_variant(triton_launch.default_configs(32, 32, q.dtype), spec)
    with triton_launch.override_configs(configs):
        fused = _run(lambda *a, **kw: tapa_attention(*a, impl="triton", **kw), q, k, v, 0, causal=True, **FAR)
    exact = _run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, causal=True, **FAR)
    for name in GRADS:
        assert rel_rmse(fused[name], exact[name]) < FLOAT32_TOLERANCE, name


def test_register_caps_reach_every_launch_and_keep_the_results(monkeypatch):
    """Register caps on all three kernels (Triton's maxnreg; the interpreter takes and ignores
    the option, ptxas applies it on a GPU): each launch is handed its kernel's cap, and out, lse
    and every gradient still match float64, with the separate dQ kernel and with dQ by atomics."""
    K = triton_launch.KernelConfig
    caps = {}
    for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"):
        _record_launches(monkeypatch, name,
                         lambda kwargs, name=name: caps.setdefault(name, set()).add(kwargs.get("maxnreg")))
    for dq_atomic in (False, True):
        configs = triton_launch.LaunchConfigs(K(32, 16, max_registers=128), K(16, 32, max_registers=96),
                                              K(32, 16, max_registers=64), dq_atomic=dq_atomic)
        q, k, v = _inputs(1, 45, 45, 2, 1, 32, 32, torch.float32, seed=3 + dq_atomic)
        with triton_launch.override_configs(configs):
            _check(q, k, v, causal=True)
    assert caps == {"_fwd_kernel": {128}, "_bwd_dkdv_kernel": {96}, "_bwd_dq_kernel": {64}}
