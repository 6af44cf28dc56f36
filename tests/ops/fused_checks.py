"""The fused kernels' checks against the float64 reference, shared by test_triton_attention.py and
test_configs.py: inputs, a run of out, lse and the input gradients, and the bars.

Without CUDA the kernels run in Triton's CPU interpreter (conftest.py sets TRITON_INTERPRET),
in float32 and float16 (the interpreter's bfloat16 dot is not trustworthy)."""

from __future__ import annotations

import torch
from helpers import rel_rmse

from tapa.ops import tapa_attention
from tapa.ops.tapa import fused, launch
from tapa.ops.tapa.configs import KernelConfigs
from tapa.ops.tapa.logits import TRIG_POLY_ERROR
from tapa.ops.tapa.reference import chunked_tapa_attention, distance_weight, naive_tapa_attention, split_dims

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
GRADS = ("out", "lse", "dq", "dk", "dv")
# float32: the kernel's error is rounding-level (about 1e-6 measured)
FLOAT32_TOLERANCE = 2e-5
HALF_BAR = 1.5  # issue 13's bar: kernel error <= 1.5x the same-dtype reference's, vs float64


def inputs(batch, q_len, k_len, heads, kv_heads, head_dim, v_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)
                 for shape in ((batch, q_len, heads, head_dim), (batch, k_len, kv_heads, head_dim),
                               (batch, k_len, kv_heads, v_dim)))


def run(fn, q, k, v, seed, **kwargs):
    """out, lse and input gradients of a random linear loss on out and lse."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v, return_lse=True, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    out_weight = torch.randn(out.shape, generator=gen).to(out.dtype).to(out.device)
    lse_weight = torch.randn(lse.shape, generator=gen).to(lse.dtype).to(lse.device)
    ((out * out_weight).sum() + (lse * lse_weight).sum()).backward()
    return dict(zip(GRADS, (out, lse, q.grad, k.grad, v.grad)))


def kernel(configs: KernelConfigs | None = None):
    """The fused op as `run` calls it: `tapa_attention(impl="triton")`, or with an explicit row."""
    if configs is None:
        return lambda *a, **kw: tapa_attention(*a, impl="triton", **kw)

    def call(q, k, v, *, theta=0.5, alpha=0.1, distance="power", phase="quadratic", causal=True,
             q_offset=0, k_offset=0, return_lse=False):
        return fused.tapa_attention_triton(q, k, v, theta=theta, alpha=alpha, distance=distance,
                                           phase=phase, causal=causal, q_offset=q_offset,
                                           k_offset=k_offset, return_lse=return_lse, configs=configs)

    return call


def check(q, k, v, seed=0, configs: KernelConfigs | None = None, bar: float = 2.0, **kwargs):
    """Kernel vs float64 reference. float32: every output within FLOAT32_TOLERANCE; 16-bit: out and
    the gradients within `bar` x the same-dtype reference's own error, and lse (float32 for every
    input dtype) within the bound the configs' approximations allow (`lse_error_bound`)."""
    fused_run = run(kernel(configs), q, k, v, seed, **kwargs)
    exact = run(naive_tapa_attention, q.double(), k.double(), v.double(), seed, **kwargs)
    errors = {name: rel_rmse(fused_run[name], exact[name]) for name in GRADS}
    if q.dtype == torch.float32:
        assert max(errors.values()) < FLOAT32_TOLERANCE, errors
        return errors
    same_dtype = run(chunked_tapa_attention, q, k, v, seed, **kwargs)
    for name in ("out", "dq", "dk", "dv"):
        floor = rel_rmse(same_dtype[name], exact[name])
        assert errors[name] <= bar * floor + 1e-6, (name, errors[name], floor)
    bound = lse_error_bound(q, k, configs or launch.configs_for(q, v), **kwargs)
    check_lse(fused_run, exact, same_dtype, bound)
    return errors


def check_lse(fused_run, exact, same_dtype, bound):
    lse_error = (fused_run["lse"].double() - exact["lse"]).abs().max().item()
    floor = (same_dtype["lse"].double() - exact["lse"]).abs().max().item()
    assert lse_error <= bound + 2 * floor + 1e-6, (lse_error, bound, floor)


def lse_error_bound(q, k, configs: KernelConfigs, *, theta=0.5, alpha=0.1, distance="power",
                    phase="quadratic", q_offset=0, k_offset=0, **_):
    """|lse error| <= max |amplitude logit| * (trig error + 2 pi * taylor tolerance * max |t|):
    lse moves by at most its largest logit's error, logit = amplitude * cos(2 pi t), t the phase
    in turns (bounded here by its largest factors, over every pair of positions)."""
    group = q.shape[2] // k.shape[2]
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
    if configs.trig_poly or launch.interpreting():
        trig_error = TRIG_POLY_ERROR
    else:  # PTX ISA: cos.approx/sin.approx.f32, max absolute error 2**-20.5 on [-pi, pi]
        trig_error = 2.0 ** -20
    return float(amplitude / amp_dim ** 0.5
                 * (trig_error + 2 * torch.pi * configs.taylor_tolerance * max_turns))


def all_far(configs: KernelConfigs, q_len: int, q_offset: int) -> bool:
    """Whether every tile of every kernel sits in the far series' band at this q_offset (queries
    after keys 0 .. q_len - 1)."""
    rho, _ = launch.taylor_constants(0.1, configs.taylor_order, configs.taylor_tolerance)
    tiles = (configs.fwd, configs.fwd_long, configs.dkdv, configs.dq)
    half_span = max((t.block_m + t.block_n - 2) / 2 for t in tiles)
    return half_span <= rho * (q_offset - q_len)
