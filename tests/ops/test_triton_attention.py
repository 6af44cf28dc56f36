"""Tests of the fused Triton TAPA kernels against the float64 reference.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1) on CPU tensors, in
float32 and float16 (the interpreter's bfloat16 dot is not trustworthy). With CUDA the same tests
run compiled on the GPU, and the cuda-marked ones add bfloat16 and a long-range check.
Every comparison is relative RMSE against `naive_tapa_attention` in float64 on the same
(rounded) inputs, for out, lse and the gradients of q, k and v. The config table's rows are
checked one by one in test_configs.py; here the kernels' paths, each from explicit configs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from helpers import rel_rmse

pytest.importorskip("triton")  # without CUDA, conftest.py has selected Triton's interpreter

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from fused_checks import (  # noqa: E402
    DEVICE, FLOAT32_TOLERANCE, GRADS, HALF_BAR, HAS_CUDA, all_far, check, inputs, kernel, run)

from tapa.ops import MAX_ALPHA, MAX_POSITION, tapa_attention  # noqa: E402
from tapa.ops.tapa import configs as table, fused, launch, logits  # noqa: E402
from tapa.ops.tapa.configs import Tile  # noqa: E402
from tapa.ops.tapa.reference import naive_tapa_attention  # noqa: E402

DTYPES = [torch.float32, torch.float16]
# the explicit configs of the tests below: the interpreter's row where they run on CPU, else the
# table's float32 row of the same tiles' kind (dtype-independent paths only)
BASE = table.INTERPRETER if not HAS_CUDA else table.lookup("cuda", torch.float32, 32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_causal_gqa_ragged(dtype):
    q, k, v = inputs(2, 45, 45, 4, 2, 32, 32, dtype, seed=1)
    check(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_noncausal_mqa_unequal_lengths(dtype):
    q, k, v = inputs(1, 23, 50, 3, 1, 32, 32, dtype, seed=2)
    check(q, k, v, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_offsets_far_tiles(dtype):
    """q_offset puts most tiles far from the diagonal, where d**alpha is a Taylor series."""
    q, k, v = inputs(1, 20, 330, 2, 1, 32, 32, dtype, seed=3)
    check(q, k, v, causal=True, q_offset=310, k_offset=0)
    check(q, k, v, causal=False, q_offset=7, k_offset=400, alpha=0.37)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uneven_theta_and_value_dim(dtype):
    """d_A = 48, d_P = 16 (padded to 64 and 16 columns in the kernel), v of another width."""
    q, k, v = inputs(1, 33, 33, 2, 2, 64, 24, dtype, seed=4)
    check(q, k, v, causal=True, theta=0.75)


@pytest.mark.parametrize("distance,phase", list(itertools.product(("power", "linear"),
                                                                   ("quadratic", "linear"))))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_distance_and_phase_variants(dtype, distance, phase):
    q, k, v = inputs(1, 40, 40, 2, 1, 16, 16, dtype, seed=5)
    check(q, k, v, causal=True, distance=distance, phase=phase, alpha=0.3, q_offset=100,
          k_offset=90)


@pytest.mark.parametrize("transpose", [False, True], ids=["dq", "dq_t"])
@pytest.mark.parametrize("phase", ["quadratic", "linear"])
def test_atomic_dq(phase, transpose):
    """dQ by float32 atomics from the dK/dV kernel (the alternative to the dQ kernel), its
    products as dS^T K or transposed (dQ^T = K^T dS)."""
    q, k, v = inputs(1, 41, 41, 4, 2, 32, 32, torch.float32, seed=11)
    configs = replace(BASE, dq_atomic=True, dq_transpose=transpose)
    check(q, k, v, configs=configs, causal=True, phase=phase, q_offset=5)


@pytest.mark.parametrize("distance", ["power", "linear"])
def test_alpha_at_its_bound(distance):
    """alpha = MAX_ALPHA: at short range, where float32 still resolves the phase (up to 20**4 turns),
    the kernel is within 2x of the float32 reference's error; at the longest range (distance
    ~2**24, phase ~2**96 turns) every output is finite and every logit stays within its amplitude
    (|cos| <= 1), so lse <= max |q_A . k_A| / sqrt(d_A) + log(Nk)."""
    alpha = MAX_ALPHA[distance]
    q, k, v = inputs(1, 21, 21, 2, 1, 32, 32, torch.float32, seed=12)
    kwargs = dict(alpha=alpha, distance=distance, causal=True)
    fused_run = run(kernel(), q, k, v, 0, **kwargs)
    exact = run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, **kwargs)
    same_dtype = run(naive_tapa_attention, q, k, v, 0, **kwargs)
    for name in GRADS:
        floor = rel_rmse(same_dtype[name], exact[name])
        assert rel_rmse(fused_run[name], exact[name]) <= 2 * floor + 1e-6, (name, floor)

    q, k, v = inputs(1, 40, 37, 2, 2, 32, 32, torch.float32, seed=13)
    far = dict(alpha=alpha, distance=distance, causal=False, q_offset=MAX_POSITION - 40)
    fused_run = run(kernel(), q, k, v, 0, **far)
    for name in GRADS:
        assert torch.isfinite(fused_run[name]).all(), name
    amplitude = torch.einsum("bqhd,bkhd->bhqk", q[..., :16], k[..., :16]).abs() / 4.0
    bound = amplitude.amax(-1) + torch.log(torch.tensor(37.0))
    assert (fused_run["lse"] <= bound + 1e-4).all()


def test_broadcast_output_gradients():
    """loss = out.sum() + lse.sum(): autograd hands the backward expanded (stride-0) gradients."""
    q, k, v = inputs(1, 37, 37, 2, 2, 32, 32, torch.float32, seed=14)

    def grads(fn, *tensors):
        tensors = [t.detach().clone().requires_grad_(True) for t in tensors]
        out, lse = fn(*tensors, return_lse=True)
        (out.sum() + lse.sum()).backward()
        return [t.grad for t in tensors]

    fused_grads = grads(kernel(), q, k, v)
    exact = grads(naive_tapa_attention, q.double(), k.double(), v.double())
    for got, want in zip(fused_grads, exact):
        assert rel_rmse(got, want) < FLOAT32_TOLERANCE


def test_every_output_element_written(monkeypatch):
    """The launchers' output buffers (out, lse, delta, dq, dk, dv) start as NaN."""
    q, k, v = inputs(1, 37, 37, 3, 1, 32, 24, torch.float32, seed=6)
    exact = run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, causal=True)
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(launch.torch, "empty",
                        lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(launch.torch, "empty_like",
                        lambda *a, **kw: empty_like(*a, **kw).fill_(float("nan")))
    fused_run = run(lambda *a, **kw: fused.tapa_attention_triton(
        *a, theta=0.5, alpha=0.1, distance="power", phase="quadratic", q_offset=0, k_offset=0,
        **kw), q, k, v, 0, causal=True)
    monkeypatch.undo()
    for name in GRADS:
        assert rel_rmse(fused_run[name], exact[name]) < FLOAT32_TOLERANCE, name


def test_taylor_distance_weight_matches_pow():
    """The host constants give (1 + u)**alpha to 1e-8 over |u| <= rho for several alphas."""
    for alpha in (0.05, 0.1, 0.5, 1.0, 1.7, 3.0):
        rho, coefficients = launch.taylor_constants(alpha, 6, 1e-8)
        u = torch.linspace(-rho, rho, 1001, dtype=torch.float64)
        series = 1 + sum(c * u ** (i + 1) for i, c in enumerate(coefficients))
        assert (series - (1 + u) ** alpha).abs().max() < 1.1e-8, alpha


def test_dispatch_and_custom_op():
    q, k, v = inputs(1, 17, 17, 2, 1, 16, 16, torch.float32, seed=8)
    assert fused.supports(q, k, v, theta=0.5)
    assert not fused.supports(q.double(), k.double(), v.double(), theta=0.5)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        tapa_attention(q.double(), k.double(), v.double(), impl="triton")
    out = torch.ops.tapa.fused_attention_fwd(q, k, v, 8, 0.1, "power", "quadratic", True, 0, 0)[0]
    exact = naive_tapa_attention(q.double(), k.double(), v.double())
    assert rel_rmse(out, exact) < FLOAT32_TOLERANCE


def test_torch_compile_has_no_graph_break():
    q, k, v = inputs(1, 19, 19, 2, 1, 16, 16, torch.float32, seed=9)
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
    q, k, v = inputs(1, 1000, 1000, 4, 2, 128, 128, torch.bfloat16, seed=10)
    check(q, k, v, causal=causal)


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
# The logits' constants


def test_trig_polynomial_error_bound():
    """The polynomial pair, evaluated in float32 as the kernels do, is within TRIG_POLY_ERROR."""
    u64 = torch.linspace(-0.25, 0.25, 100001, dtype=torch.float64)
    u = u64.float()
    w = u * u
    for coefficients, odd, exact in ((logits.SIN_COEFFICIENTS, True, torch.sin),
                                     (logits.COS_COEFFICIENTS, False, torch.cos)):
        poly = torch.full_like(u, float(coefficients[-1].value))
        for c in coefficients[-2::-1]:
            poly = poly * w + float(c.value)
        if odd:
            poly = poly * u
        error = (poly.double() - exact(2 * torch.pi * u64)).abs().max().item()
        assert error <= logits.TRIG_POLY_ERROR, (odd, error)


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5, 6])
def test_taylor_constants_hold_their_tolerance(order):
    """rho from the host keeps the series within tolerance on a grid 8x denser than its own check."""
    for alpha in (0.05, 0.1, 0.5, 1.7, 7.0):
        for tolerance in (1e-8, 1e-7, 1e-6):
            rho, _ = launch.taylor_constants(alpha, order, tolerance)
            assert launch.taylor_series_error(alpha, order, rho, points=2049) <= tolerance * 1.001


# ---------------------------------------------------------------------------------------------
# Launches


def _record_launches(monkeypatch, name: str, record) -> None:
    """Wrap the Triton kernel `name` of tapa.ops.tapa.kernels so that each launch calls
    record(kwargs) (its launch options and constexprs) before it runs."""
    kernel_fn = getattr(launch.kernels, name)

    class Recording:
        def __getitem__(self, grid):
            def go(*args, **kwargs):
                record(kwargs)
                return kernel_fn[grid](*args, **kwargs)
            return go

    monkeypatch.setattr(launch.kernels, name, Recording())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_tile_by_key_length_matches_the_reference(dtype, monkeypatch):
    """Configs with another forward tile above fwd_long_from keys (40 here): the forward launches
    the tile of its key length, and the backward, with tiles of its own, reads the lse of either
    forward: out, lse and every gradient match float64 on both sides of the limit."""
    configs = replace(BASE, fwd=Tile(16, 16, 4, 2), dkdv=Tile(16, 32, 4, 2), dq=Tile(32, 16, 4, 2),
                      fwd_long=Tile(32, 32, 4, 2), fwd_long_from=40)
    launched = []
    _record_launches(monkeypatch, "_fwd_kernel", lambda kwargs: launched.append(
        Tile(*(kwargs[name] for name in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")))))
    for k_len, causal, tile in ((40, True, configs.fwd), (41, True, configs.fwd_long),
                                (77, False, configs.fwd_long)):
        q, k, v = inputs(1, 37, k_len, 2, 1, 32, 32, dtype, seed=k_len)
        check(q, k, v, configs=configs, causal=causal, q_offset=k_len - 37)
        assert launched[-1] == tile, (k_len, launched)


def test_deterministic_mode_takes_the_dq_kernel(monkeypatch):
    """dq_atomic configs add dQ by atomics from the dK/dV kernel, except in torch's deterministic
    mode, where the separate dQ kernel runs (and the dK/dV kernel neither adds dQ nor transposes)."""
    atomic = replace(BASE, dq_atomic=True, dq_transpose=True)
    logit_flags = dict(TRIG_POLY=True, LONG_PHASE=False)

    def ordering():
        flags = launch.dkdv_flags(atomic, logit_flags)
        return launch.dq_by_atomics(atomic), flags["DQ_ATOMIC"], flags["DQ_TRANSPOSE"]

    assert ordering() == (True, True, True)
    assert not launch.dq_by_atomics(BASE)
    launched = []
    _record_launches(monkeypatch, "_bwd_dq_kernel", lambda kwargs: launched.append(kwargs))
    q, k, v = inputs(1, 33, 33, 2, 1, 32, 32, torch.float32, seed=15)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert ordering() == (False, False, False)
        check(q, k, v, configs=atomic, causal=True)
    finally:
        torch.use_deterministic_algorithms(was)
    assert launched, "the deterministic mode's dQ comes from the dQ kernel"


def test_register_caps_reach_every_launch_and_keep_the_results(monkeypatch):
    """Register caps on all three kernels (Triton's maxnreg; the interpreter takes and ignores
    the option, ptxas applies it on a GPU): each launch is handed its kernel's cap, and out, lse
    and every gradient still match float64, with the separate dQ kernel and with dQ by atomics."""
    caps = {}
    for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"):
        _record_launches(monkeypatch, name,
                         lambda kwargs, name=name: caps.setdefault(name, set()).add(kwargs.get("maxnreg")))
    for dq_atomic in (False, True):
        capped = Tile(32, 16, 4, 2, max_registers=128)
        configs = replace(BASE, fwd=capped, fwd_long=capped, dkdv=Tile(16, 32, 4, 2, max_registers=96),
                          dq=Tile(32, 16, 4, 2, max_registers=64), dq_atomic=dq_atomic)
        q, k, v = inputs(1, 45, 45, 2, 1, 32, 32, torch.float32, seed=3 + dq_atomic)
        check(q, k, v, configs=configs, causal=True)
    assert caps == {"_fwd_kernel": {128}, "_bwd_dkdv_kernel": {96}, "_bwd_dq_kernel": {64}}


def test_tma_only_where_the_tensors_allow_it():
    """tma_ok: every part a power of two of 16 bytes or more, filling D, 16-byte strides and base;
    the launcher then keeps TMA, else clears it and passes no descriptors (the pointer loads)."""
    t = torch.zeros(2, 40, 3, 64, dtype=torch.float16, device=DEVICE)
    assert launch.tma_ok(t, (32, 32)) and launch.tma_ok(t, (64,))
    assert not launch.tma_ok(t, (48, 16))  # 48 is not a power of two
    assert not launch.tma_ok(t, (32, 16))  # the parts must fill D
    assert not launch.tma_ok(t[..., :8], (4, 4))  # 8-byte parts
    shifted = torch.zeros(t.numel() + 1, dtype=t.dtype, device=DEVICE)[1:].view(t.shape)  # base + 2 B
    assert not launch.tma_ok(shifted, (32, 32))
    odd = torch.zeros(2, 40, 3, 68, dtype=torch.float16, device=DEVICE)[..., :64]  # 136-byte rows
    assert not launch.tma_ok(odd, (32, 32))
    flags = dict(TMA=True)
    assert launch._loop_descriptors(flags, t, t, 16, 32)[0] is not None and flags["TMA"]
    flags = dict(TMA=True)
    assert launch._loop_descriptors(flags, t, t, 16, 48) == [None] * 3 and not flags["TMA"]
    flags = dict(TMA=False)
    assert launch._loop_descriptors(flags, t, t, 16, 32) == [None] * 3 and not flags["TMA"]


def test_cos_in_radians_only_where_it_applies():
    """Each kernel's cos in radians is on only where its configs ask for it and the call's logits
    take the MUFU trig without LONG_PHASE; then its phase_scale carries 2 pi and its phase
    gradient's scale gives it back."""
    mufu = replace(BASE, trig_poly=False, fwd_cos_radians=True, dkdv_cos_radians=True,
                   dq_cos_radians=True)
    flags = dict(TRIG_POLY=False, LONG_PHASE=False)
    for own in (launch.fwd_flags, launch.dkdv_flags, launch.dq_flags):
        assert own(mufu, flags)["COS_RADIANS"]
        assert not own(mufu, dict(flags, LONG_PHASE=True))["COS_RADIANS"]
        assert not own(mufu, dict(flags, TRIG_POLY=True))["COS_RADIANS"]  # e.g. the interpreter
        assert not own(replace(BASE, trig_poly=False), flags)["COS_RADIANS"]
    scalars, grads = launch.with_radians([1.0, 0.5, 0.1], [0.25, -2 * math.pi])
    assert scalars == [1.0, math.pi, 0.1] and grads == [0.25, -1.0]


def test_kernel_flags_follow_the_configs():
    """Each kernel's own constexprs come from its fields of the configs."""
    logit_flags = dict(TRIG_POLY=True, LONG_PHASE=False)
    configs = replace(BASE, taylor_order=2, taylor_tolerance=1e-5, far_bands=True, fwd_split_s=2,
                      fwd_fast_scalars=True, fwd_tma=True, bwd_fast_scalars=True, dq_split_s=True)
    assert launch.fwd_flags(configs, logit_flags) == dict(SPLIT_S=2, FAST_SCALARS=True,
                                                          COS_RADIANS=False, TMA=True, BANDS=True)
    assert launch.dq_flags(configs, logit_flags) == dict(SPLIT_S=1, FAST_SCALARS=True, COS_RADIANS=False)
    assert launch.dkdv_flags(configs, logit_flags) == dict(DQ_ATOMIC=False, DQ_TRANSPOSE=False,
                                                           COS_RADIANS=False, FAST_SCALARS=True)
    assert launch.fwd_flags(BASE, logit_flags) == dict(SPLIT_S=0, FAST_SCALARS=False,
                                                       COS_RADIANS=False, TMA=False, BANDS=False)


# ---------------------------------------------------------------------------------------------
# The kernels' paths, each from explicit configs, within the half-precision bar

FAR = dict(q_offset=6000)  # every tile of these tests sits far from the diagonal (asserted)
ORDER3 = dict(taylor_order=3, taylor_tolerance=1e-6)
ORDER2 = dict(taylor_order=2, taylor_tolerance=1e-5)

PATHS = {  # label: (configs changes, call arguments)
    "order-3-series": (ORDER3, FAR),
    "order-2-series-atomic-dq": (dict(taylor_order=2, taylor_tolerance=1e-6, dq_atomic=True), FAR),
    "atomic-dq-transposed-padded": (dict(dq_atomic=True, dq_transpose=True), dict(theta=0.75)),
    "small-tiles": (dict(fwd=Tile(16, 32, 4, 1), fwd_long=Tile(16, 32, 4, 1), dkdv=Tile(32, 16, 4, 1),
                         dq=Tile(16, 32, 4, 3)), {}),
    # the forward's distances as row offsets less a column ramp, near and far, and far tiles' u
    # from them; the interpreter takes the exact log2 and division for the MUFU's scalars
    "fwd-split": (dict(fwd_split_s=1), {}),
    "fwd-split-far": (dict(fwd_split_s=1, **ORDER3), FAR),
    "fwd-split-fast-scalars": (dict(fwd_split_s=1, fwd_fast_scalars=True, **ORDER3), FAR),
    # the far-tile series in the column term, at each order it takes
    "fwd-column-series-3": (dict(fwd_split_s=2, **ORDER3), FAR),
    "fwd-column-series-2": (dict(fwd_split_s=2, **ORDER2), FAR),
    # the forward's K/V tiles by TMA descriptors (rows past N zero-filled)
    "fwd-tma": (dict(fwd_tma=True), {}),
    "fwd-tma-column-series": (dict(fwd_tma=True, fwd_split_s=2, **ORDER2), dict(FAR, causal=False)),
    # three series bands (orders 1, 2, 3 at 1e-5); at q_offset 6000 every tile is in the farthest
    # (test_far_bands_within_the_half_precision_bar takes the others)
    "far-bands": (dict(far_bands=True, fwd_split_s=2, **ORDER2), FAR),
    # the dQ kernel's distances as row offsets less a ramp, near and far
    "dq-split": (dict(dq_split_s=True), {}),
    "dq-split-far": (dict(dq_split_s=True, **ORDER3), FAR),
    "bwd-fast-scalars": (dict(bwd_fast_scalars=True, **ORDER3), FAR),
}


def _check_path(configs, call, far=True):
    kwargs = {"causal": True, **call}
    q, k, v = inputs(1, 37, 37, 2, 1, 32, 32, torch.float16, seed=31)
    if far and "q_offset" in kwargs:  # every kernel's tiles must take the far-tile series
        assert all_far(configs, 37, kwargs["q_offset"])
    check(q, k, v, configs=configs, bar=HALF_BAR, **kwargs)


@pytest.mark.parametrize("label", PATHS)
def test_path_within_the_half_precision_bar(label):
    """float16, ragged N, GQA: out and every gradient within 1.5x the float16 reference's error
    vs float64; lse (float32 for every input dtype) within the bound its approximations allow."""
    changes, call = PATHS[label]
    _check_path(replace(BASE, **changes), call)


@pytest.mark.parametrize("q_offset", [0, 200, 900, 6000], ids=["near", "outer", "middle", "farthest"])
@pytest.mark.parametrize("changes", [
    dict(fwd_split_s=2, **ORDER2), dict(fwd_split_s=1, **ORDER2),
    dict(fwd_split_s=0, taylor_order=4, taylor_tolerance=1e-6),
    dict(fwd_split_s=2, dq_atomic=True, dq_transpose=True, **ORDER2),
], ids=["column-series", "u-series", "order-4", "atomic-dq"])
def test_far_bands_within_the_half_precision_bar(changes, q_offset):
    """far_bands at offsets that put the interpreter's tiles (half-spans about 23) in each band
    (alpha 0.1, order 2 at 1e-5): near the diagonal; between it and the order-2 band (rho_out 0.125
    at order 3: centres from about 184, some of q_offset 200's tiles); in the order-2 band (rho
    0.056: from 411); and in the farthest (rho_in 0.0105 at order 1: from 2182)."""
    _check_path(replace(BASE, far_bands=True, **changes), dict(q_offset=q_offset), far=False)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="the MUFU's cos.approx/sin.approx are PTX (no interpreter)")
def test_mufu_trig_within_the_half_precision_bar():
    _check_path(replace(BASE, trig_poly=False), {})
    _check_path(replace(BASE, trig_poly=False, dq_atomic=True), FAR)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="the MUFU's lg2.approx/rcp.approx are PTX (no interpreter)")
def test_fast_far_tile_scalars_within_the_half_precision_bar():
    _check_path(replace(BASE, fwd_split_s=1, fwd_fast_scalars=True, **ORDER3), FAR)
    _check_path(replace(BASE, bwd_fast_scalars=True, dq_split_s=True, **ORDER3), FAR)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="the MUFU's cos.approx is PTX (no interpreter)")
@pytest.mark.parametrize("call", [{}, FAR, dict(alpha=0.5, q_offset=3000)], ids=["near", "far", "alpha0.5"])
def test_cos_in_radians_within_the_half_precision_bar(call):
    """The MUFU cos on the unreduced phase in radians, in each kernel; at alpha 0.5 and distances
    up to 3036 the phase reaches tens of turns."""
    mufu = replace(BASE, trig_poly=False)
    _check_path(replace(mufu, fwd_cos_radians=True, fwd_split_s=1, fwd_fast_scalars=True), call, far=False)
    _check_path(replace(mufu, dq_atomic=True, dq_transpose=True, dkdv_cos_radians=True), call, far=False)
    _check_path(replace(mufu, dkdv_cos_radians=True), call, far=False)  # dQ by its own kernel
    _check_path(replace(mufu, dq_cos_radians=True, dkdv_cos_radians=True), call, far=False)


def test_combined_paths_float32():
    """Atomic dQ, a shorter series and another dQ tile together stay at float32 accuracy on float32
    inputs."""
    configs = replace(BASE, dq_atomic=True, taylor_order=3, taylor_tolerance=1e-7,
                      dq=Tile(16, 32, 4, 2))
    q, k, v = inputs(1, 37, 37, 2, 1, 32, 32, torch.float32, seed=32)
    fused_run = run(kernel(configs), q, k, v, 0, causal=True, **FAR)
    exact = run(naive_tapa_attention, q.double(), k.double(), v.double(), 0, causal=True, **FAR)
    for name in GRADS:
        assert rel_rmse(fused_run[name], exact[name]) < FLOAT32_TOLERANCE, name


# ---------------------------------------------------------------------------------------------
# The far series' pieces, on their own


@triton.jit
def _column_series_kernel(A, Col, Out, scale, p0, b1, b2, b3, M: tl.constexpr, N: tl.constexpr,
                          ORDER: tl.constexpr):
    a = tl.load(A + tl.arange(0, M))
    col = tl.load(Col + tl.arange(0, N))
    fs = logits._column_series(a, col, scale, p0, b1, b2, b3, ORDER)
    tl.store(Out + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], fs)


def test_row_series_matches_the_u_series():
    """The column-term series against the float64 series it rewrites, p0 (1 + sum b_k u**k) with
    u = a + b, over a far tile's band (64 x 64 at the smallest centre distance the band allows):
    float32 rounding only, which a wrong coefficient exceeds by orders of magnitude. The column
    term is the ramp times -1 / d0."""
    for order, tolerance in ((1, 1e-5), (2, 1e-5), (3, 1e-6)):
        rho, coefficients = launch.taylor_constants(0.1, order, tolerance)
        d0 = 63 / rho
        a = (torch.arange(64, dtype=torch.float64) - 31.5) / d0  # u at each row's first column
        ramp_values = torch.arange(64, dtype=torch.float64)
        b = -ramp_values / d0
        p0 = 3.25
        u = a[:, None] + b[None, :]
        exact = p0 * (1 + sum(c * u ** (k + 1) for k, c in enumerate(coefficients[:order])))
        out = torch.empty(64, 64, dtype=torch.float32, device=DEVICE)
        _column_series_kernel[(1,)](a.float().to(DEVICE), ramp_values.float().to(DEVICE), out, -1 / d0, p0,
                                    *coefficients[:3], M=64, N=64, ORDER=order)
        error = ((out.double().cpu() - exact).abs() / exact.abs()).max().item()
        assert error < 4e-7, (order, error)


@triton.jit
def _distance_weight_kernel(S, Out, s_lo, s_hi, alpha, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in,
                            rho_out, M: tl.constexpr, N: tl.constexpr, ORDER: tl.constexpr,
                            BANDS: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    s = tl.load(S + offs)
    fs = logits._scaled_distance_weight(
        s, s, s, s_lo, s_hi, alpha, 1.0, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in, rho_out, True,
        ORDER, BANDS, False, False, 0, False)
    tl.store(Out + offs, fs)


@pytest.mark.parametrize("order,tolerance", [(2, 1e-5), (4, 1e-6)])
def test_far_bands_hold_their_tolerance_in_every_band(order, tolerance):
    """`_scaled_distance_weight` with BANDS on 64 x 64 tiles whose centres sweep every band (each
    band's nearest centre and the next one in): d ** alpha within the series' tolerance plus
    float32 rounding, against float64; a band given the wrong order or radius exceeds it."""
    rho, coefficients = launch.taylor_constants(0.1, order, tolerance)
    rho_in, rho_out = launch.band_radii(0.1, order, tolerance)
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


def test_band_radii():
    """far_bands' radii are the orders -/+ 1's at the same tolerance (the inner one narrower)."""
    rho, _ = launch.taylor_constants(0.1, 2, 1e-5)
    rho_in, rho_out = launch.band_radii(0.1, 2, 1e-5)
    assert rho_in < rho < rho_out
    assert rho_in == launch.taylor_constants(0.1, 1, 1e-5)[0]
    assert rho_out == launch.taylor_constants(0.1, 3, 1e-5)[0]
