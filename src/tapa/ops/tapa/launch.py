"""Host side of the fused TAPA kernels: constants, the kernels' flags, grids and launches.

`forward` returns (out, lse); `backward` returns (dq, dk, dv). Both launch with the config table's
row for their inputs (`tapa.ops.tapa.configs`: `configs_for`), or with the `KernelConfigs` a caller
passes as `configs` (tests, research). Autograd and the torch custom op around them live in
`tapa.ops.tapa.fused`; the kernels in `tapa.ops.tapa.kernels`.
"""

import functools
import math
from typing import NamedTuple

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from tapa.ops.tapa import kernels
from tapa.ops.tapa.configs import MAX_HEAD_DIM, KernelConfigs, Tile, lookup

# From this f(d) on, the kernels take the LONG_PHASE path: d ** alpha to a few ulp however large,
# and a second turn reduction, valid for any finite phase. Below it the one reduction (exact for
# |t| < 2**22) needs only |q_P . k_P| / sqrt(d_P) < 2**19, and exp2(alpha * log2 d) loses at most
# ln(8) ~ 2 ulp. The default alpha = 0.1 stays below it up to 2**24 tokens (f = 5.3).
LONG_PHASE_FROM = 8.0

# Fixed when the kernels are defined (TRITON_INTERPRET is read then); a module constant, so that
# torch.compile traces `interpreting()` (dynamo cannot take the type of a Triton kernel object).
_INTERPRETING = type(kernels._fwd_kernel).__name__ == "InterpretedFunction"


def interpreting() -> bool:
    """True when the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return _INTERPRETING


def arch_class() -> str:
    """The config table's architecture class of this process: "interpreter" or "cuda"."""
    return "interpreter" if interpreting() else "cuda"


def configs_for(q: torch.Tensor, v: torch.Tensor) -> KernelConfigs:
    """The config table's row for these inputs (their dtype and head dims)."""
    return lookup(arch_class(), q.dtype, q.shape[-1], v.shape[-1])


def check_supported(q: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError for inputs the kernels do not handle (the reference handles them)."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the fused TAPA kernel takes float16, bfloat16 or float32, got {q.dtype}")
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"the fused TAPA kernel takes head_dim <= {MAX_HEAD_DIM}, got "
                         f"q/k {q.shape[-1]}, v {v.shape[-1]}; use impl='reference'")


# ---------------------------------------------------------------------------------------------
# The logits' constants and flags


def _binomial(alpha: float, order: int) -> float:
    value = 1.0
    for i in range(order):
        value *= (alpha - i) / (i + 1)
    return value


def taylor_series_error(alpha: float, order: int, rho: float, points: int = 257) -> float:
    """Largest |1 + sum_{k<=order} b_k u**k - (1 + u) ** alpha| / (1 + u) ** alpha over |u| <= rho
    (a dense grid with both ends), in float64."""
    coefficients = [_binomial(alpha, k) for k in range(1, order + 1)]
    worst = 0.0
    for i in range(points):
        u = rho * (2 * i / (points - 1) - 1)
        series = 1 + sum(c * u ** (k + 1) for k, c in enumerate(coefficients))
        exact = (1 + u) ** alpha
        worst = max(worst, abs(series - exact) / exact)
    return worst


@functools.lru_cache(maxsize=64)
def taylor_constants(alpha: float, order: int, tolerance: float) -> tuple[float, list[float]]:
    """(rho, [b_1..b_6]): (1 + u) ** alpha = 1 + sum_{k<=order} b_k u**k within tolerance
    (relative) for |u| <= rho; b_k past the order are returned but not used.

    rho starts from the first omitted term (the remainder is below twice that term when the
    terms after it shrink by 1/2 or more, true for order 6, alpha <= 15, rho <= 1/2) and is then
    checked on a dense grid and narrowed until the error is within tolerance, which makes the
    bound hold for every order and alpha.
    """
    coefficients = [_binomial(alpha, k) for k in range(1, 7)]
    remainder = abs(_binomial(alpha, order + 1))
    if remainder == 0:  # alpha a small integer: the series is exact
        return 0.5, coefficients
    rho = min(0.5, (tolerance / 2 / remainder) ** (1 / (order + 1)))
    while taylor_series_error(alpha, order, rho) > tolerance:
        rho *= 0.9
    return rho, coefficients


def band_radii(alpha: float, order: int, tolerance: float) -> list[float]:
    """[rho_in, rho_out]: the radii of the series of orders order - 1 and order + 1 at the same
    tolerance, the forward's bands (`KernelConfigs.far_bands`) around the band of `order`."""
    return [taylor_constants(float(alpha), order - 1, tolerance)[0],
            taylor_constants(float(alpha), order + 1, tolerance)[0]]


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def long_phase(alpha: float, distance: str, max_distance: int) -> bool:
    """Whether f at the call's largest distance reaches LONG_PHASE_FROM."""
    weight = max_distance ** alpha if distance == "power" else alpha * max_distance
    return weight >= LONG_PHASE_FROM


def logits_args(*, alpha: float, distance: str, phase: str, phase_dim: int, dtype: torch.dtype,
                max_distance: int, trig_poly: bool, taylor_order: int,
                taylor_tolerance: float) -> tuple[list, dict]:
    """The scalars (phase_scale, alpha, taylor_rho, b1..b6) and flags of
    `tapa.ops.tapa.logits.tile_logits`, the same for every kernel that calls it. The interpreter
    has no PTX, so it always takes the polynomial trig."""
    rho, coefficients = taylor_constants(float(alpha), taylor_order, taylor_tolerance)
    scalars = [1 / math.sqrt(phase_dim), float(alpha), rho, *coefficients]
    flags = dict(DIST_POWER=distance == "power", PHASE_QUAD=phase == "quadratic",
                 TRIG_POLY=trig_poly or interpreting(), TAYLOR_ORDER=taylor_order,
                 PTX_ASM=not interpreting(), LONG_PHASE=long_phase(alpha, distance, max_distance),
                 DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
    return scalars, flags


def _cos_radians(asked: bool, logit_flags: dict) -> bool:
    """A kernel's COS_RADIANS: asked for, and the call's logits take the MUFU trig without
    LONG_PHASE (the MUFU's own reduction is not exact for the long phases)."""
    return asked and not logit_flags["TRIG_POLY"] and not logit_flags["LONG_PHASE"]


def fwd_flags(configs: KernelConfigs, logit_flags: dict) -> dict:
    """The forward kernel's own constexprs (beyond `logits_args`' flags): SPLIT_S, FAST_SCALARS,
    COS_RADIANS (with the call's logit flags), TMA (asked for: `forward` keeps it only where
    `tma_ok`) and BANDS (whose radii `band_radii` gives)."""
    return dict(SPLIT_S=configs.fwd_split_s, FAST_SCALARS=configs.fwd_fast_scalars,
                COS_RADIANS=_cos_radians(configs.fwd_cos_radians, logit_flags),
                TMA=configs.fwd_tma, BANDS=configs.far_bands)


def dq_by_atomics(configs: KernelConfigs) -> bool:
    """dQ by float32 atomics from the dK/dV kernel, whose summation order changes from run to run,
    unless torch's deterministic mode is on (`torch.use_deterministic_algorithms`): then the
    separate dQ kernel, bitwise reproducible."""
    return configs.dq_atomic and not torch.are_deterministic_algorithms_enabled()


def dkdv_flags(configs: KernelConfigs, logit_flags: dict) -> dict:
    """The dK/dV kernel's own constexprs: dQ by atomics (`dq_by_atomics`) and, with them, the
    transposed dQ products; COS_RADIANS (as `fwd_flags`) and FAST_SCALARS."""
    dq_atomic = dq_by_atomics(configs)
    return dict(DQ_ATOMIC=dq_atomic, DQ_TRANSPOSE=dq_atomic and configs.dq_transpose,
                COS_RADIANS=_cos_radians(configs.dkdv_cos_radians, logit_flags),
                FAST_SCALARS=configs.bwd_fast_scalars)


def dq_flags(configs: KernelConfigs, logit_flags: dict) -> dict:
    """The dQ kernel's own constexprs: SPLIT_S (0 or 1), FAST_SCALARS and COS_RADIANS (as
    `fwd_flags`)."""
    return dict(SPLIT_S=int(configs.dq_split_s), FAST_SCALARS=configs.bwd_fast_scalars,
                COS_RADIANS=_cos_radians(configs.dq_cos_radians, logit_flags))


def with_radians(scalars: list, grad_scales: list | None = None) -> tuple[list, list | None]:
    """A COS_RADIANS kernel's scalars: phase_scale (scalars[1], after the logit scale) carries 2 pi,
    and the phase gradient's scale (grad_scales[1]) gives it back."""
    scalars = [scalars[0], scalars[1] * 2 * math.pi, *scalars[2:]]
    return scalars, None if grad_scales is None else [grad_scales[0], grad_scales[1] / (2 * math.pi)]


def _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset, k_offset,
                 configs: KernelConfigs, varlen=None):
    """[logit_scale, phase_scale, alpha, taylor_rho, b1..b6] and the constexprs every fused
    kernel takes (VARLEN among them)."""
    head_dim, v_dim = q.shape[-1], v.shape[-1]
    phase_dim = head_dim - amp_dim
    if varlen is None:
        max_distance = max(abs(q_offset + q.shape[1] - 1 - k_offset),
                           abs(k_offset + k.shape[1] - 1 - q_offset))
    else:  # bottom-right alignment: no distance passes the longer side of a sequence
        max_distance = max(varlen.max_seqlen_q, varlen.max_seqlen_k, 1) - 1
    scalars, flags = logits_args(alpha=alpha, distance=distance, phase=phase, phase_dim=phase_dim,
                                 dtype=q.dtype, max_distance=max_distance,
                                 trig_poly=configs.trig_poly, taylor_order=configs.taylor_order,
                                 taylor_tolerance=configs.taylor_tolerance)
    constexprs = dict(AMP_DIM=amp_dim, HEAD_DIM=head_dim, V_DIM=v_dim, BLOCK_DA=_pow2(amp_dim),
                      BLOCK_DP=_pow2(phase_dim), BLOCK_DV=_pow2(v_dim), CAUSAL=causal,
                      VARLEN=varlen is not None, **flags)
    return [math.log2(math.e) / math.sqrt(amp_dim), *scalars], constexprs


# ---------------------------------------------------------------------------------------------
# Compiled kernels, for the lab's census (lab/kernels)

# The last compiled kernel launched per (kernel, tile, flags): their register and spill counts
# (`compiled_kernels`) are the compiler's side of a timing.
_compiled: dict[tuple, object] = {}
# every name `_remember` records a training kernel under
TRAINING_KERNELS = frozenset({"fwd", "dkdv", "dkdv_atomic_dq", "dkdv_atomic_dq_t", "dq"})


def _remember(name: str, tile: Tile, constexprs: dict, compiled) -> None:
    if compiled is not None and not interpreting():
        _compiled[(name, tile, tuple(sorted((k, str(v)) for k, v in constexprs.items())))] = compiled


def compiled_kernels() -> list[tuple[dict, object]]:
    """(description, Triton CompiledKernel) of every kernel launched so far in this process: the
    description has the kernel's name, tile, constexpr flags, and n_regs, n_spills (local
    memory bytes / 4, as Triton reports it) and shared memory bytes when the compiler gave them."""
    rows = []
    for (name, tile, flags), compiled in _compiled.items():
        metadata = getattr(compiled, "metadata", None)
        rows.append((dict(kernel=name, config=str(tile), **dict(flags),
                          n_regs=getattr(compiled, "n_regs", None),
                          n_spills=getattr(compiled, "n_spills", None),
                          shared=getattr(metadata, "shared", None)), compiled))
    return rows


def dkdv_kernel_name(flags: dict) -> str:
    """The dK/dV kernel's name in `compiled_kernels`, by its `dkdv_flags`."""
    if not flags["DQ_ATOMIC"]:
        return "dkdv"
    return "dkdv_atomic_dq_t" if flags["DQ_TRANSPOSE"] else "dkdv_atomic_dq"


# ---------------------------------------------------------------------------------------------
# Devices and TMA


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """The CUDA device's number of SMs."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _has_tma(device_index: int) -> bool:
    """Whether the CUDA device has Hopper's TMA (sm_90 or later); asked once per device, not at
    every launch."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def tma_ok(t: torch.Tensor, widths: tuple[int, ...]) -> bool:
    """Whether a (B, N, H, D) tensor's tiles of these column widths (its parts, in order, which
    must fill D) can come by TMA descriptors: under the interpreter, or on sm_90+, with a 16-byte
    aligned base, 16-byte multiples for every stride but the last (1), every width a power of two
    of at least 16 bytes and at most 256 elements."""
    if sum(widths) != t.shape[-1] or t.stride(-1) != 1:
        return False
    if not (interpreting() or (t.is_cuda and _has_tma(t.get_device()))):
        return False
    size = t.element_size()
    return (t.data_ptr() % 16 == 0 and all(stride * size % 16 == 0 for stride in t.stride()[:-1])
            and all(w & (w - 1) == 0 and w * size >= 16 and w <= 256 for w in widths))


def tma_descriptors(t: torch.Tensor, block_rows: int, widths: tuple[int, ...]) -> list:
    """One TMA descriptor per column width for `_desc_tile` (blocks (1, block_rows, 1, width)),
    the same object for equal widths."""
    made: dict[int, TensorDescriptor] = {}
    for width in widths:
        if width not in made:
            made[width] = TensorDescriptor(t, list(t.shape), list(t.stride()),
                                           [1, block_rows, 1, width])
    return [made[width] for width in widths]


def _loop_descriptors(flags: dict, qk: torch.Tensor, vo: torch.Tensor, block_rows: int,
                      amp_dim: int) -> list:
    """The forward's three loop-tile descriptors (qk's amplitude and phase parts, then vo whole),
    or three Nones; clears flags["TMA"] where the tensors do not allow TMA (`tma_ok`)."""
    widths = (amp_dim, qk.shape[-1] - amp_dim)
    flags["TMA"] = flags["TMA"] and tma_ok(qk, widths) and tma_ok(vo, (vo.shape[-1],))
    if not flags["TMA"]:
        return [None, None, None]
    return [*tma_descriptors(qk, block_rows, widths),
            *tma_descriptors(vo, block_rows, (vo.shape[-1],))]


# ---------------------------------------------------------------------------------------------
# Launches


class Varlen(NamedTuple):
    """Packed sequences (`tapa.ops.tapa.varlen`): int32 offsets (B + 1,) of the queries' and the
    keys' rows, and the longest of each."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def sequences(self) -> int:
        return self.cu_seqlens_q.numel() - 1


def _row_strides(t: torch.Tensor, varlen=None):
    """(batch, row, head) strides; packed sequences index their rows from their own offsets, so
    their batch stride is 0."""
    return (0 if varlen is not None else t.stride(0)), t.stride(1), t.stride(2)


def _sequence_args(varlen) -> tuple:
    """The kernels' CuQ and CuK: the offsets, or None (folded away) for dense calls."""
    return (None, None) if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k)


def _contiguous_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def forward(q, k, v, *, amp_dim, alpha, distance, phase, causal, q_offset, k_offset,
            configs: KernelConfigs | None = None, varlen: Varlen | None = None):
    """Fused forward: out (B, Nq, H, Dv) in q's dtype and lse (B, H, Nq) float32 (natural log).
    configs: the row to launch with (default: the table's for these inputs). varlen: packed
    sequences, q (total_q, H, D) and k, v (total_k, Hk, D): out (total_q, H, Dv), lse
    (H, total_q); the offsets are ignored (each sequence is aligned bottom-right)."""
    check_supported(q, v)
    q, k, v = (_contiguous_last(t) for t in (q, k, v))
    if varlen is not None:
        q, k, v = (t.unsqueeze(0) for t in (q, k, v))
    batch, n_q, heads, _ = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    configs = configs or configs_for(q, v)
    tile = configs.forward_tile(n_k if varlen is None else varlen.max_seqlen_k)
    out = torch.empty((batch, n_q, heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    scalars, constexprs = _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset,
                                       k_offset, configs, varlen)
    constexprs.update(fwd_flags(configs, constexprs))
    if constexprs["COS_RADIANS"]:
        scalars, _ = with_radians(scalars)
    radii = (band_radii(alpha, configs.taylor_order, configs.taylor_tolerance)
             if configs.far_bands else [0.0, 0.0])
    descriptors = _loop_descriptors(constexprs, k, v, tile.block_n, amp_dim)
    if varlen is None:
        grid = (triton.cdiv(n_q, tile.block_m), batch * heads)
    else:
        grid = (triton.cdiv(max(varlen.max_seqlen_q, 1), tile.block_m), varlen.sequences * heads)
    compiled = kernels._fwd_kernel[grid](
        q, k, v, out, lse, *_sequence_args(varlen), *descriptors, *_row_strides(q, varlen),
        *_row_strides(k, varlen), *_row_strides(v, varlen), *_row_strides(out, varlen), n_q, n_k,
        q_offset, k_offset, heads, heads // kv_heads, grid[1], *scalars, *radii,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, **tile.launch_options(), **constexprs)
    _remember("fwd", tile, constexprs, compiled)
    if varlen is not None:
        return out[0], lse[0]
    return out, lse


def backward(dout, dlse, q, k, v, out, lse, *, amp_dim, alpha, distance, phase, causal, q_offset,
             k_offset, configs: KernelConfigs | None = None, varlen: Varlen | None = None):
    """Fused backward: (dq, dk, dv) for the gradients dout of out and dlse (or None) of lse.
    configs, varlen: as `forward`'s (with varlen every tensor in its packed layout)."""
    q, k, v, out, dout = (_contiguous_last(t) for t in (q, k, v, out, dout))
    if dlse is not None:  # the kernel indexes it as a dense (B, H, Nq); autograd may hand an expand
        dlse = dlse.contiguous()
    if varlen is not None:
        q, k, v, out, dout, lse = (t.unsqueeze(0) for t in (q, k, v, out, dout, lse))
        dlse = None if dlse is None else dlse.unsqueeze(0)
    batch, n_q, heads, _ = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    v_dim = v.shape[-1]
    configs = configs or configs_for(q, v)
    if varlen is None:
        delta = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
        preprocess_rows = 64
        kernels._bwd_preprocess_kernel[(triton.cdiv(n_q, preprocess_rows), batch * heads)](
            out, dout, dlse if dlse is not None else delta, delta, *_row_strides(out),
            *_row_strides(dout), n_q, heads, V_DIM=v_dim, BLOCK_DV=_pow2(v_dim),
            BLOCK_M=preprocess_rows, HAS_DLSE=dlse is not None)
    else:  # the kernels' n_q then carries the padded rows' stride
        lse, delta, n_q = _padded_row_terms(out, dout, dlse, lse, varlen, configs)
    scalars, constexprs = _common_args(q, k, v, amp_dim, alpha, distance, phase, causal, q_offset,
                                       k_offset, configs, varlen)
    grad_scales = [1 / math.sqrt(amp_dim), -2 * math.pi / math.sqrt(amp_dim)]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dkdv = dkdv_flags(configs, constexprs)
    dkdv_scalars, dkdv_grad_scales = with_radians(scalars, grad_scales) if dkdv["COS_RADIANS"] else (
        scalars, grad_scales)
    dq_atomic = dkdv["DQ_ATOMIC"]
    # the atomics accumulate in float32 (like FlashAttention-2's dq_accum)
    dq = (torch.zeros(q.shape, dtype=torch.float32, device=q.device) if dq_atomic
          else torch.empty_like(q))

    tile = configs.dkdv
    if varlen is None:
        grid = (triton.cdiv(n_k, tile.block_n), batch * kv_heads)
    else:
        grid = (triton.cdiv(max(varlen.max_seqlen_k, 1), tile.block_n), varlen.sequences * kv_heads)
    compiled = kernels._bwd_dkdv_kernel[grid](
        q, k, v, dout, lse, delta, dk, dv, dq, *_sequence_args(varlen), *_row_strides(q, varlen),
        *_row_strides(k, varlen), *_row_strides(v, varlen), *_row_strides(dout, varlen),
        *_row_strides(dk, varlen), *_row_strides(dv, varlen), *_row_strides(dq, varlen), n_q, n_k,
        q_offset, k_offset, kv_heads, heads // kv_heads, *dkdv_scalars,
        *dkdv_grad_scales, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, **tile.launch_options(),
        **constexprs, **dkdv)
    _remember(dkdv_kernel_name(dkdv), tile, {**constexprs, **dkdv}, compiled)
    if dq_atomic:
        return _unpacked(varlen, dq.to(q.dtype), dk, dv)
    tile = configs.dq
    dq_own = dq_flags(configs, constexprs)
    if dq_own["COS_RADIANS"]:
        scalars, grad_scales = with_radians(scalars, grad_scales)
    if varlen is None:
        grid = (triton.cdiv(n_q, tile.block_m), batch * heads)
    else:
        grid = (triton.cdiv(max(varlen.max_seqlen_q, 1), tile.block_m), varlen.sequences * heads)
    compiled = kernels._bwd_dq_kernel[grid](
        q, k, v, dout, lse, delta, dq, *_sequence_args(varlen), *_row_strides(q, varlen),
        *_row_strides(k, varlen), *_row_strides(v, varlen), *_row_strides(dout, varlen),
        *_row_strides(dq, varlen), n_q, n_k, q_offset, k_offset, heads,
        heads // kv_heads, *scalars, *grad_scales, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        **tile.launch_options(), **constexprs, **dq_own)
    _remember("dq", tile, {**constexprs, **dq_own}, compiled)
    return _unpacked(varlen, dq, dk, dv)


def _padded_row_terms(out, dout, dlse, lse, varlen: Varlen, configs: KernelConfigs):
    """The varlen backward's lse and delta in the padded layout of `tapa.ops.tapa.kernels` (each
    sequence's rows from a multiple of SEQUENCE_ALIGN): (lse, delta, n_padded), both (H, n_padded)
    float32. out, dout: (1, total_q, H, Dv); lse and dlse (or None): (1, H, total_q)."""
    align = kernels.SEQUENCE_ALIGN.value
    block_m = max(configs.dkdv.block_m, configs.dq.block_m)
    if block_m > align:
        raise ValueError(f"varlen: the backward's query tiles (block_m) must be at most {align}, "
                         f"the padding of its lse rows; got {block_m}")
    _, total_q, heads, v_dim = out.shape
    n_padded = (total_q // align + varlen.sequences) * align
    lse_padded = torch.empty((heads, n_padded), dtype=torch.float32, device=out.device)
    delta = torch.empty_like(lse_padded)
    rows = 64
    grid = (triton.cdiv(max(varlen.max_seqlen_q, 1), align) * (align // rows),
            varlen.sequences * heads)
    kernels._bwd_varlen_preprocess_kernel[grid](
        out, dout, dlse, lse, delta, lse_padded, varlen.cu_seqlens_q, out.stride(1),
        out.stride(2), dout.stride(1), dout.stride(2), total_q, n_padded, heads, V_DIM=v_dim,
        BLOCK_DV=_pow2(v_dim), BLOCK_M=rows, HAS_DLSE=dlse is not None)
    return lse_padded, delta, n_padded


def _unpacked(varlen, *tensors):
    """Gradients in the caller's layout: packed (total, H, D) for varlen calls."""
    return tensors if varlen is None else tuple(t[0] for t in tensors)
