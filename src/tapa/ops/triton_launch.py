"""Host side of the fused TAPA kernels: block-size choice, constants, grids and launches.

`forward` returns (out, lse); `backward` returns (dq, dk, dv). Autograd and the torch custom op
around them live in `tapa.ops.triton_attention`; the kernels in `tapa.ops.triton_kernels`.
"""

import math
from dataclasses import dataclass

import torch
import triton

from tapa.ops import triton_kernels as kernels

MAX_HEAD_DIM = 256
# Error target of the Taylor series of d ** alpha around a tile's centre distance (relative).
TAYLOR_TOLERANCE = 1e-8
TAYLOR_ORDER = 6
# cos/sin as polynomials on the FMA pipes (True) or the MUFU's cos.approx/sin.approx (False).
# (Measured on the H200: the MUFU is about 5% faster, but its GPU accuracy is not yet checked.)
TRIG_POLY = True
# From this f(d) on, the kernels take the LONG_PHASE path: d ** alpha to a few ulp however large,
# and a second turn reduction, valid for any finite phase. Below it the one reduction (exact for
# |t| < 2**22) needs only |q_P . k_P| / sqrt(d_P) < 2**19, and exp2(alpha * log2 d) loses at most
# ln(8) ~ 2 ulp. The default alpha = 0.1 stays below it up to 2**24 tokens (f = 5.3).
LONG_PHASE_FROM = 8.0
# dQ by float32 atomics from the dK/dV kernel (True) or by a separate dQ kernel (False).
# (The atomic path passes the interpreter tests; it has not yet run on a GPU.)
DQ_ATOMIC = False


@dataclass(frozen=True)
class KernelConfig:
    """Block sizes and launch options of one kernel: queries x keys per tile, warps, stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class LaunchConfigs:
    fwd: KernelConfig
    dkdv: KernelConfig
    dq: KernelConfig
    trig_poly: bool | None = None  # None: the module's TRIG_POLY
    dq_atomic: bool | None = None  # None: the module's DQ_ATOMIC


def interpreting() -> bool:
    """True when the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return type(kernels._fwd_kernel).__name__ == "InterpretedFunction"


# Set by `override_configs` (benchmark sweeps) to replace the choice below.
_override: LaunchConfigs | None = None


class override_configs:
    """Context manager: launch every kernel with these configs (for benchmark sweeps)."""

    def __init__(self, configs: LaunchConfigs):
        self.configs = configs

    def __enter__(self):
        global _override
        self.previous, _override = _override, self.configs

    def __exit__(self, *exc):
        global _override
        _override = self.previous


def default_configs(head_dim: int, v_dim: int, dtype: torch.dtype) -> LaunchConfigs:
    """Block sizes by head size and dtype (Hopper choices; see results/kernel-h200/NOTES.md)."""
    if _override is not None:
        return _override
    if interpreting():  # small tiles: several per test shape, and quick on a CPU
        return LaunchConfigs(KernelConfig(32, 16), KernelConfig(16, 32), KernelConfig(32, 16))
    width = max(head_dim, v_dim)
    if dtype == torch.float32:  # float32 operands take twice the registers and shared memory
        width *= 2
    if width <= 128:  # the best measured combination at D=128 (NOTES.md); D=64 takes the same
        return LaunchConfigs(KernelConfig(128, 64, 8, 3), KernelConfig(32, 128, 8, 2),
                             KernelConfig(128, 16, 8, 2))
    if width <= 256:
        return LaunchConfigs(KernelConfig(64, 64, 4, 2), KernelConfig(16, 64, 4, 2),
                             KernelConfig(64, 16, 4, 2))
    return LaunchConfigs(KernelConfig(32, 32, 4, 1), KernelConfig(16, 32, 4, 1),
                         KernelConfig(32, 16, 4, 1))


def trig_poly(configs: LaunchConfigs | None = None) -> bool:
    """Polynomial cos/sin or the MUFU's; the interpreter has no PTX, so it always takes the polynomials."""
    chosen = TRIG_POLY if configs is None or configs.trig_poly is None else configs.trig_poly
    return chosen or interpreting()


def check_supported(q: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError for inputs the kernels do not handle (the reference handles them)."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the fused TAPA kernel takes float16, bfloat16 or float32, got {q.dtype}")
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"the fused TAPA kernel takes head_dim <= {MAX_HEAD_DIM}, got "
                         f"q/k {q.shape[-1]}, v {v.shape[-1]}; use impl='reference'")


def _binomial(alpha: float, order: int) -> float:
    value = 1.0
    for i in range(order):
        value *= (alpha - i) / (i + 1)
    return value


def taylor_constants(alpha: float) -> tuple[float, list[float]]:
    """(rho, [b_1..b_6]): (1 + u) ** alpha = 1 + sum_k b_k u**k within tolerance for |u| <= rho."""
    coefficients = [_binomial(alpha, order) for order in range(1, TAYLOR_ORDER + 1)]
    remainder = abs(_binomial(alpha, TAYLOR_ORDER + 1))
    if remainder == 0:  # alpha a small integer: the series is exact
        return 0.5, coefficients
    # for alpha <= 15 and rho <= 1/2 the terms after the last shrink by 1/2 or more each, so
    # the remainder is below twice its first term
    rho = min(0.5, (TAYLOR_TOLERANCE / 2 / remainder) ** (1 / (TAYLOR_ORDER + 1)))
    return rho, coefficients


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def long_phase(alpha: float, distance: str, max_distance: int) -> bool:
    """Whether f at the call's largest distance reaches LONG_PHASE_FROM."""
    weight = max_distance ** alpha if distance == "power" else alpha * max_distance
    return weight >= LONG_PHASE_FROM


def logits_args(*, alpha: float, distance: str, phase: str, phase_dim: int, dtype: torch.dtype,
                max_distance: int, configs: LaunchConfigs | None = None) -> tuple[list, dict]:
    """The scalars (phase_scale, alpha, taylor_rho, b1..b6) and flags of
    `triton_logits.tile_logits`, the same for every kernel that calls it."""
    rho, coefficients = taylor_constants(alpha)
    scalars = [1 / math.sqrt(phase_dim), float(alpha), rho, *coefficients]
    flags = dict(DIST_POWER=distance == "power", PHASE_QUAD=phase == "quadratic",
                 TRIG_POLY=trig_poly(configs), PTX_ASM=not interpreting(),
                 LONG_PHASE=long_phase(alpha, distance, max_distance),
                 DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
    return scalars, flags


def _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset, k_offset, configs):
    head_dim, v_dim = q.shape[-1], v.shape[-1]
    phase_dim = head_dim - amp_dim
    max_distance = max(abs(q_offset + q.shape[1] - 1 - k_offset), abs(k_offset + k.shape[1] - 1 - q_offset))
    scalars, flags = logits_args(alpha=alpha, distance=distance, phase=phase, phase_dim=phase_dim,
                                 dtype=q.dtype, max_distance=max_distance, configs=configs)
    constexprs = dict(AMP_DIM=amp_dim, HEAD_DIM=head_dim, V_DIM=v_dim, BLOCK_DA=_pow2(amp_dim),
                      BLOCK_DP=_pow2(phase_dim), BLOCK_DV=_pow2(v_dim), CAUSAL=causal, **flags)
    return [math.log2(math.e) / math.sqrt(amp_dim), *scalars], constexprs


def _row_strides(t: torch.Tensor):
    return t.stride(0), t.stride(1), t.stride(2)


def _contiguous_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def forward(q, k, v, *, amp_dim, alpha, distance, phase, causal, q_offset, k_offset,
            configs: LaunchConfigs | None = None):
    """Fused forward: out (B, Nq, H, Dv) in q's dtype and lse (B, H, Nq) float32 (natural log)."""
    check_supported(q, v)
    q, k, v = (_contiguous_last(t) for t in (q, k, v))
    batch, n_q, heads, _ = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    configs = configs or default_configs(q.shape[-1], v.shape[-1], q.dtype)
    cfg = configs.fwd
    out = torch.empty((batch, n_q, heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    scalars, constexprs = _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset,
                                       k_offset, configs)
    grid = (triton.cdiv(n_q, cfg.block_m), batch * heads)
    kernels._fwd_kernel[grid](
        q, k, v, out, lse, *_row_strides(q), *_row_strides(k), *_row_strides(v),
        *_row_strides(out), n_q, n_k, q_offset, k_offset, heads, heads // kv_heads, *scalars,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **constexprs)
    return out, lse


def backward(dout, dlse, q, k, v, out, lse, *, amp_dim, alpha, distance, phase, causal, q_offset,
             k_offset, configs: LaunchConfigs | None = None):
    """Fused backward: (dq, dk, dv) for the gradients dout of out and dlse (or None) of lse."""
    q, k, v, out, dout = (_contiguous_last(t) for t in (q, k, v, out, dout))
    if dlse is not None:  # the kernel indexes it as a dense (B, H, Nq); autograd may hand an expand
        dlse = dlse.contiguous()
    batch, n_q, heads, _ = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    v_dim = v.shape[-1]
    configs = configs or default_configs(q.shape[-1], v_dim, q.dtype)
    delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    preprocess_rows = 64
    kernels._bwd_preprocess_kernel[(triton.cdiv(n_q, preprocess_rows), batch * heads)](
        out, dout, dlse if dlse is not None else delta, delta, *_row_strides(out),
        *_row_strides(dout), n_q, heads, V_DIM=v_dim, BLOCK_DV=_pow2(v_dim),
        BLOCK_M=preprocess_rows, HAS_DLSE=dlse is not None)
    scalars, constexprs = _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset,
                                       k_offset, configs)
    grad_scales = [1 / math.sqrt(amp_dim), -2 * math.pi / math.sqrt(amp_dim)]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_atomic = DQ_ATOMIC if configs.dq_atomic is None else configs.dq_atomic
    # the atomics accumulate in float32 (like FlashAttention-2's dq_accum)
    dq = (torch.zeros(q.shape, dtype=torch.float32, device=q.device) if dq_atomic
          else torch.empty_like(q))

    cfg = configs.dkdv
    kernels._bwd_dkdv_kernel[(triton.cdiv(n_k, cfg.block_n), batch * kv_heads)](
        q, k, v, dout, lse, delta, dk, dv, dq, *_row_strides(q), *_row_strides(k),
        *_row_strides(v), *_row_strides(dout), *_row_strides(dk), *_row_strides(dv),
        *_row_strides(dq), n_q, n_k, q_offset, k_offset, kv_heads, heads // kv_heads, *scalars,
        *grad_scales, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DQ_ATOMIC=dq_atomic,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **constexprs)
    if dq_atomic:
        return dq.to(q.dtype), dk, dv
    cfg = configs.dq
    kernels._bwd_dq_kernel[(triton.cdiv(n_q, cfg.block_m), batch * heads)](
        q, k, v, dout, lse, delta, dq, *_row_strides(q), *_row_strides(k), *_row_strides(v),
        *_row_strides(dout), *_row_strides(dq), n_q, n_k, q_offset, k_offset, heads,
        heads // kv_heads, *scalars, *grad_scales, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **constexprs)
    return dq, dk, dv
