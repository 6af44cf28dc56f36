"""Split-KV TAPA decoding: one or a few new query tokens against a long KV cache (Triton).

Computes the function of `tapa.ops.tapa.reference` (see its docstring) for the decode setting:

    row b: valid keys are the slots start_b <= n < seqlen_b of the cache (start_b = 0 unless
           cache_starts is given, e.g. left padding); query t (0 <= t < Nq) sits at slot
           seqlen_b - Nq + t and sees keys n <= its slot; TAPA distances are slot differences.

Work split (flash-decoding): program (b, kv head, split) handles one contiguous range of cache
slots for all query rows of that kv head: the G = H / Hk query heads of the group times the Nq
tokens are packed into one tile, so the group shares every k/v load (GQA packed). Each split
keeps an online softmax and writes its normalized partial output and log-sum-exp; a second
kernel merges the splits, out = sum_s exp(lse_s - lse) * out_s with lse = logsumexp_s(lse_s).
With a single split the first kernel writes the final output directly.

Each tile's logits come from `tapa.ops.tapa.logits.tile_logits`, the helper (and flags) the
fused kernels use. Half-precision inputs: the logits and the softmax are float32, q.k and p.v
run on the input dtype's tensor cores with float32 accumulation (p is cast to the value dtype,
as in FlashAttention); float32 inputs use IEEE float32 dots.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from tapa.ops.tapa.checks import check_cache_lengths, check_kvcache_args, check_triton_device
from tapa.ops.tapa.reference import split_dims
from tapa.ops.tapa import launch
from tapa.ops.tapa.configs import DECODE
from tapa.ops.tapa.launch import interpreting, logits_args
from tapa.ops.tapa.logits import tile_logits

MAX_QUERY_ROWS = 64  # G * Nq rows per program; more queries are prefill work for the fused kernel
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# split_bucket and program_bucket are only the autotuner's key. Specialized like the other
# integers, a bucket of 16 (a split of 32k-64k keys) made Triton compile every tile again (5.5 s
# at batch 32, cache 65536 on an H100), for the same code.
@triton.jit(do_not_specialize=["split_bucket", "program_bucket"])
def _split_kernel(
    Q, K, V, SEQLENS, STARTS, OUT, LSE,
    stride_qb, stride_qn, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_o1, stride_o2, stride_o3, stride_od,
    stride_lb, stride_l1, stride_l2, stride_l3,
    kv_heads, q_len, group, head_dim, v_dim, amp_dim, keys_per_split, split_bucket, program_bucket,
    amp_scale, phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5, b6,
    HAS_STARTS: tl.constexpr, FINAL: tl.constexpr, DIST_POWER: tl.constexpr, PHASE_QUAD: tl.constexpr,
    TRIG_POLY: tl.constexpr, TAYLOR_ORDER: tl.constexpr, PTX_ASM: tl.constexpr,
    LONG_PHASE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """One (batch, kv head, split). FINAL: OUT is (B, Nq, H, Dv), LSE (B, H, Nq); otherwise
    OUT is the float32 partial buffer (B, Hk, splits, rows, Dv) and LSE (B, Hk, splits, rows)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    batch = (pid // kv_heads).to(tl.int64)  # batch * stride passes 2**31 on long caches
    kv_head = pid % kv_heads

    seqlen = tl.load(SEQLENS + batch)
    if HAS_STARTS:
        first_key = tl.load(STARTS + batch)
    else:
        first_key = 0
    lo = tl.maximum(split * keys_per_split, first_key)
    hi = tl.minimum((split + 1) * keys_per_split, seqlen)

    # packed query rows: row = g * q_len + t -> query head kv_head * group + g, token t
    rows = tl.arange(0, BLOCK_M)
    row_valid = rows < group * q_len
    token = rows % q_len
    head = kv_head * group + rows // q_len
    query_slot = seqlen - q_len + token
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)

    q_ptrs = (Q + batch * stride_qb + token[:, None] * stride_qn + head[:, None] * stride_qh
              + dims[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_valid[:, None] & (dims[None, :] < head_dim), other=0.0)
    is_amp = dims[None, :] < amp_dim
    q_amp = tl.where(is_amp, q, tl.zeros_like(q))
    q_phase = tl.where(is_amp, tl.zeros_like(q), q)
    q_phase_sum = tl.sum(q_phase.to(tl.float32), axis=1)
    first_slot = seqlen - q_len  # of the query rows; the last is seqlen - 1

    row_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    row_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_valid = keys < hi
        k = tl.load(k_base + keys[:, None] * stride_kn + dims[None, :] * stride_kd,
                    mask=key_valid[:, None] & (dims[None, :] < head_dim), other=0.0)
        k_phase_sum = tl.sum(tl.where(is_amp, 0.0, k.to(tl.float32)), axis=1)
        # the full-width tiles serve as both parts: q_amp and q_phase have the other part zeroed
        logits = tile_logits(
            q_amp, k, q_phase, k, q_phase_sum, k_phase_sum,
            (query_slot[:, None] - keys[None, :]).to(tl.float32), 0.0, 0.0,
            (first_slot - (start + BLOCK_N - 1)).to(tl.float32), (seqlen - 1 - start).to(tl.float32),
            alpha, phase_scale, taylor_rho, b1, b2, b3, b4, b5, b6, 0.0, 0.0, DIST_POWER,
            PHASE_QUAD, TRIG_POLY, TAYLOR_ORDER, False, PTX_ASM, LONG_PHASE, DOT_PRECISION, False,
            False, False) * amp_scale
        visible = key_valid[None, :] & (keys[None, :] <= query_slot[:, None]) & row_valid[:, None]
        logits = tl.where(visible, logits, float("-inf"))

        new_max = tl.maximum(row_max, tl.max(logits, axis=1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp(logits - safe_max[:, None])
        rescale = tl.exp(row_max - safe_max)
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        v = tl.load(v_base + keys[:, None] * stride_vn + vdims[None, :] * stride_vd,
                    mask=key_valid[:, None] & (vdims[None, :] < v_dim), other=0.0)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        row_max = new_max

    # rows that saw no key in this split: out 0, lse -inf (they get weight 0 in the merge)
    out = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
    lse = tl.where(row_sum > 0, row_max + tl.log(tl.where(row_sum > 0, row_sum, 1.0)), float("-inf"))
    store_mask = row_valid[:, None] & (vdims[None, :] < v_dim)
    if FINAL:
        o_ptrs = (OUT + batch * stride_ob + token[:, None] * stride_o1 + head[:, None] * stride_o2
                  + vdims[None, :] * stride_od)
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=store_mask)
        tl.store(LSE + batch * stride_lb + head * stride_l1 + token * stride_l2, lse, mask=row_valid)
    else:
        o_ptrs = (OUT + batch * stride_ob + kv_head * stride_o1 + split * stride_o2
                  + rows[:, None] * stride_o3 + vdims[None, :] * stride_od)
        tl.store(o_ptrs, out, mask=store_mask)
        tl.store(LSE + batch * stride_lb + kv_head * stride_l1 + split * stride_l2 + rows * stride_l3,
                 lse, mask=row_valid)


@triton.jit
def _merge_kernel(
    PART, PART_LSE, OUT, LSE,
    stride_pb, stride_ph, stride_ps, stride_pm, stride_pd,
    stride_plb, stride_plh, stride_pls, stride_plm,
    stride_ob, stride_on, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ln,
    kv_heads, num_splits, q_len, group, v_dim,
    BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """Merge all splits of one query row of one (batch, kv head) in a single tile: exact
    log-sum-exp weighting, out = sum_s exp(lse_s - lse) * out_s."""
    pid = tl.program_id(0)
    row = tl.program_id(1)
    batch = (pid // kv_heads).to(tl.int64)  # batch * stride passes 2**31 on long caches
    kv_head = pid % kv_heads
    splits = tl.arange(0, BLOCK_S)
    split_valid = splits < num_splits
    vdims = tl.arange(0, BLOCK_DV)
    lse_parts = tl.load(PART_LSE + batch * stride_plb + kv_head * stride_plh + splits * stride_pls
                        + row * stride_plm, mask=split_valid, other=float("-inf"))
    lse_max = tl.max(lse_parts, axis=0)
    safe_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = tl.exp(lse_parts - safe_max)
    total = tl.sum(weights, axis=0)
    parts = tl.load(PART + batch * stride_pb + kv_head * stride_ph + splits[:, None] * stride_ps
                    + row * stride_pm + vdims[None, :] * stride_pd,
                    mask=split_valid[:, None] & (vdims[None, :] < v_dim), other=0.0)
    out = tl.sum(weights[:, None] * parts, axis=0) / tl.where(total > 0, total, 1.0)
    lse = tl.where(total > 0, safe_max + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))

    token = row % q_len
    head = kv_head * group + row // q_len
    tl.store(OUT + batch * stride_ob + token * stride_on + head * stride_oh + vdims * stride_od,
             out.to(OUT.dtype.element_ty), mask=vdims < v_dim)
    tl.store(LSE + batch * stride_lb + head * stride_lh + token * stride_ln, lse)


# On a GPU the tile size along the cache and the launch shape are tuned once per query shape,
# split-length bucket and program-count bucket (not per cache length, which changes at every
# decoding step). The program count (batch x kv heads x splits) sets how many programs share an SM,
# so a tile tuned at batch 1 is not reused at batch 8 (a tile tuned at batch 1 ran batch 8's long
# caches about 1.2x slower than one tuned at batch 8).
_TUNED_CONFIGS = [
    triton.Config({"BLOCK_N": block_n}, num_warps=warps, num_stages=DECODE.num_stages)
    for block_n, warps in DECODE.tiles
]
_tuned_split_kernel = triton.autotune(
    configs=_TUNED_CONFIGS, key=["q_len", "group", "head_dim", "v_dim", "split_bucket", "program_bucket"],
)(_split_kernel)
SPLIT_ALIGN = DECODE.split_align  # split lengths are multiples of every BLOCK_N above

# Every autotuning of the split kernel in this process, oldest first (`tile_trials`). It grows as
# Triton's own cache of tuned keys does: once per key, and keys are buckets, so a few dozen at most.
_TRIALS: list[dict] = []


def tile_trials() -> list[dict]:
    """The decode kernel's autotunings so far in this process, oldest first. Each is a dict:
    "key" (the autotuner's key: q_len, group, head dim, v dim, split and program buckets, then
    the tensors' dtypes), "tiles_ms" ({"BLOCK_Nxwarps": median ms of one split-kernel launch,
    inf where the tile failed}) and "best" (the tile picked). Empty under the Triton interpreter,
    which runs one fixed tile. Where Triton answered from its disk cache
    (TRITON_CACHE_AUTOTUNING=1), the times are the ones stored there."""
    return [dict(trial, tiles_ms=dict(trial["tiles_ms"])) for trial in _TRIALS]


def _tile_name(config) -> str:
    return f"{config.kwargs['BLOCK_N']}x{config.num_warps}"


def _record_trial(tuner, timings_before) -> None:
    """Append the autotuning `tuner` just did (its newest key) to the trials `tile_trials` reads;
    timings_before: its `configs_timings` before the call (the same object: no tile was timed)."""
    key = next(reversed(tuner.cache))  # dicts keep insertion order: the key tuned last
    timings = getattr(tuner, "configs_timings", None)
    if timings is None or timings is timings_before:
        timings = {}
    # do_bench returned (median, p20, p80) per tile; a failed tile, inf
    tiles = {_tile_name(config): float(t[0] if isinstance(t, (list, tuple)) else t)
             for config, t in timings.items()}
    _TRIALS.append({"key": key, "tiles_ms": tiles, "best": _tile_name(tuner.cache[key])})


def _pow2(n: int, minimum: int = 16) -> int:
    return max(minimum, triton.next_power_of_2(n))


def default_num_splits(batch: int, kv_heads: int, capacity: int, device: torch.device,
                       min_keys: int) -> int:
    """Enough programs for about two waves over the SMs; where that is only a few splits, about
    four programs per SM. Each split is at least min_keys long.

    With few splits a whole split more or less moves the last wave a lot: at batch 8 x 8 kv heads
    on the H200's 132 SMs two waves ask for 5 splits (320 programs, 2.4 waves), and 8 splits (512)
    were 7-12% faster at 8k-32k keys, 4 (256) slower at 8k-16k. From 8 splits on the two-wave
    count stands as timed (batch 1: 33 splits), and at batch 32 both rules give 2."""
    sms = launch.num_sms(device.index or 0) if device.type == "cuda" else 4
    programs = batch * kv_heads
    wanted = triton.cdiv(2 * sms, programs)
    if wanted < 8:
        wanted = max(wanted, (4 * sms) // programs)
    return max(1, min(wanted, triton.cdiv(capacity, min_keys), 128))


def split_layout(batch: int, kv_heads: int, capacity: int, device: torch.device,
                 num_splits: int | None = None) -> tuple[int, int]:
    """(splits, keys per split) the kernel runs for num_splits asked (None: `default_num_splits`):
    each split a whole number of aligned key blocks, so the count can come out lower."""
    # the interpreter (tests) aligns splits finely, so small caches still get many ragged splits
    align = SPLIT_ALIGN if device.type == "cuda" else 16
    if num_splits is None:
        num_splits = default_num_splits(batch, kv_heads, capacity, device, align)
    keys_per_split = triton.cdiv(triton.cdiv(capacity, num_splits), align) * align
    return triton.cdiv(capacity, keys_per_split), keys_per_split


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when the decode kernel can run these shapes (few query rows per kv head)."""
    if q.dtype not in DTYPES or q.dim() != 4 or k.dim() != 4:
        return False
    rows = q.shape[1] * (q.shape[2] // max(k.shape[2], 1))
    return rows <= MAX_QUERY_ROWS and q.shape[-1] <= 256 and v.shape[-1] <= 256


def _check(q, k_cache, v_cache, cache_seqlens, cache_starts, theta, alpha, distance, phase, num_splits):
    check_kvcache_args(q, k_cache, v_cache, cache_seqlens, cache_starts, theta=theta, alpha=alpha,
                       distance=distance, phase=phase)
    check_triton_device(q.device, interpreting())
    if q.dtype not in DTYPES:
        raise ValueError(f"the decode kernel takes q, k_cache, v_cache of one dtype of {DTYPES}, "
                         f"got {q.dtype}")
    if not supports(q, k_cache, v_cache):
        raise ValueError(f"q_len * heads / kv_heads must be <= {MAX_QUERY_ROWS} and head dims <= 256 "
                         f"for the decode kernel, got q {tuple(q.shape)}, kv heads {k_cache.shape[2]}")
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")


def _meta(t) -> tuple | None:
    """What every check and launch argument reads of a tensor: not its values."""
    if not isinstance(t, torch.Tensor):
        return None if t is None else (type(t),)
    return tuple(t.shape), t.stride(), t.dtype, t.device


@dataclasses.dataclass
class _Plan:
    """A decode call's checked launch, everything but the tensors: built once per call signature
    (shapes, strides, dtypes, device, TAPA settings, splits), so a decoding loop pays for the
    argument checks and the launch arithmetic once, not at every step. After its first launch it
    also holds the split kernel's tuned configuration, so later steps launch the kernel without
    the autotuner's per-call key lookup (a fifth of a step's host time), and after its second the
    kernels Triton compiled, which later steps launch without Triton's JIT (`_direct_launch`: half
    the host time of a batch-1 step)."""

    out_shape: tuple
    lse_shape: tuple
    part_shape: tuple | None  # None: one split, the split kernel writes out and lse itself
    split_tail: tuple  # the split kernel's arguments after its 7 tensors (strides, sizes, scalars)
    split_flags: dict
    split_grid: tuple
    merge_tail: tuple
    merge_flags: dict
    merge_grid: tuple
    split_config: dict | None = None  # BLOCK_N, num_warps, num_stages ... once tuned
    # After a launch through Triton's JIT with the tuned config: the compiled kernels, launched
    # directly while the caller's tensors keep the pointer alignment they were compiled for
    split_launch: object = None
    merge_launch: object = None
    alignment: tuple = ()


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 256


def _alignment(*tensors) -> tuple:
    """Which pointers are 16-byte aligned: Triton specializes a kernel on it (the other
    specialized values, integers and dtypes, are fixed by the plan's key)."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


def _direct_launch(compiled, kernel, grid: tuple, constexprs: dict):
    """launch(*args) for the kernel's runtime arguments: compiled[grid] with the constexprs
    appended in the kernel's order, skipping Triton's per-call binding and specialization
    (JITFunction.run: about two thirds of a batch-1 decode step's host time)."""
    names = kernel.arg_names
    first = min(names.index(name) for name in constexprs if name in names)
    tail = tuple(constexprs[name] for name in names[first:])
    runner = compiled[(*grid, 1, 1)[:3]]  # the compiled kernel's launcher reads three grid sizes

    def launch(*args):
        runner(*args, *tail)

    return launch


def _contiguous_strides(shape) -> tuple:
    """The strides torch.empty(shape) gets (a meta tensor: no memory)."""
    return torch.empty(shape, device="meta").stride()


def _settings() -> tuple:
    """What a plan's launch arguments read besides the call (the decode configs, the split
    alignment): a plan made under other settings is not reused."""
    return DECODE, launch.LONG_PHASE_FROM, SPLIT_ALIGN, interpreting()


def _plan(q, k_cache, v_cache, cache_seqlens, cache_starts, theta, alpha, distance, phase,
          num_splits) -> _Plan:
    key = (_meta(q), _meta(k_cache), _meta(v_cache), _meta(cache_seqlens), _meta(cache_starts),
           type(theta), theta, type(alpha), alpha, distance, phase, type(num_splits), num_splits,
           _settings())
    try:
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable setting: the checks below name it
        plan, key = None, None
    if plan is not None:
        return plan
    _check(q, k_cache, v_cache, cache_seqlens, cache_starts, theta, alpha, distance, phase, num_splits)
    batch, q_len, heads, head_dim = q.shape
    capacity, kv_heads, v_dim = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    group = heads // kv_heads
    rows = group * q_len
    amp_dim, phase_dim = split_dims(head_dim, theta)
    block_dv = _pow2(v_dim)
    num_splits, keys_per_split = split_layout(batch, kv_heads, capacity, q.device, num_splits)

    out_shape, lse_shape = (batch, q_len, heads, v_dim), (batch, heads, q_len)
    out_strides, lse_strides = _contiguous_strides(out_shape), _contiguous_strides(lse_shape)
    if num_splits == 1:
        part_shape = None
        part_strides = (*out_strides[:3], 0, out_strides[3])
        part_lse_strides = (*lse_strides, 0)
    else:
        part_shape = (batch, kv_heads, num_splits, rows, v_dim)
        part_strides = _contiguous_strides(part_shape)
        part_lse_strides = _contiguous_strides(part_shape[:4])
    # every slot may hold a query, so the largest distance is the capacity's
    logit_scalars, logit_flags = logits_args(
        alpha=alpha, distance=distance, phase=phase, phase_dim=phase_dim, dtype=q.dtype,
        max_distance=capacity - 1, trig_poly=DECODE.trig_poly, taylor_order=DECODE.taylor_order,
        taylor_tolerance=DECODE.taylor_tolerance)
    split_tail = (*q.stride(), *k_cache.stride(), *v_cache.stride(), *part_strides, *part_lse_strides,
                  kv_heads, q_len, group, head_dim, v_dim, amp_dim, keys_per_split,
                  keys_per_split.bit_length(), (batch * kv_heads * num_splits).bit_length(),
                  1.0 / math.sqrt(amp_dim), *logit_scalars)
    split_flags = dict(HAS_STARTS=cache_starts is not None, FINAL=part_shape is None, **logit_flags,
                       BLOCK_M=_pow2(rows), BLOCK_D=_pow2(head_dim), BLOCK_DV=block_dv)
    merge_tail = () if part_shape is None else (
        *part_strides, *part_lse_strides, *out_strides, *lse_strides, kv_heads, num_splits, q_len, group, v_dim)
    merge_flags = dict(BLOCK_S=_pow2(num_splits, minimum=2), BLOCK_DV=block_dv,
                       num_warps=4 if num_splits * block_dv <= 4096 else 8)
    plan = _Plan(out_shape, lse_shape, part_shape, split_tail, split_flags, (batch * kv_heads, num_splits),
                 merge_tail, merge_flags, (batch * kv_heads, rows))
    if key is not None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def tapa_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    theta: float = 0.5,
    alpha: float = 0.1,
    distance: str = "power",
    phase: str = "quadratic",
    cache_starts: torch.Tensor | None = None,
    num_splits: int | None = None,
    return_lse: bool = False,
    check_lengths: bool = True,
):
    """TAPA attention of Nq new tokens against a KV cache (see the module docstring).

    q (B, Nq, H, D); k_cache (B, S, Hk, D) and v_cache (B, S, Hk, Dv), any strides (e.g. a
    transposed (B, Hk, S, D) cache); cache_seqlens (B,) int32: valid slots per sequence,
    the Nq new tokens included (they are its last Nq slots); cache_starts (B,) int32: first valid
    slot per sequence (left padding), default 0. Returns out (B, Nq, H, Dv) in q's dtype, and
    with return_lse also lse (B, H, Nq) float32. check_lengths=False skips the value checks of
    the lengths, which cost a device sync.
    """
    plan = _plan(q, k_cache, v_cache, cache_seqlens, cache_starts, theta, alpha, distance, phase,
                 num_splits)
    if check_lengths:
        check_cache_lengths(q.shape[1], k_cache.shape[1], cache_seqlens, cache_starts)
    out = torch.empty(plan.out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
    if plan.part_shape is None:
        part, part_lse = out, lse
    else:
        part = torch.empty(plan.part_shape, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(plan.part_shape[:4], dtype=torch.float32, device=q.device)
    starts = cache_starts if cache_starts is not None else cache_seqlens  # unused when HAS_STARTS=False
    args = (q, k_cache, v_cache, cache_seqlens, starts, part, part_lse, *plan.split_tail)
    merge_args = (part, part_lse, out, lse, *plan.merge_tail)
    if plan.split_launch is not None and plan.alignment == _alignment(*args[:5]):
        plan.split_launch(*args)
        if plan.merge_launch is not None:
            plan.merge_launch(*merge_args)
        return (out, lse) if return_lse else out
    if plan.split_config is not None:
        split = _split_kernel[plan.split_grid](*args, **plan.split_flags, **plan.split_config)
    elif q.is_cuda:  # tuned once per query shape, split and program bucket (the autotuner's key)
        tuned = len(_tuned_split_kernel.cache)
        timings = getattr(_tuned_split_kernel, "configs_timings", None)
        _tuned_split_kernel[plan.split_grid](*args, **plan.split_flags)
        plan.split_config = _tuned_split_kernel.best_config.all_kwargs()
        if len(_tuned_split_kernel.cache) > tuned:
            _record_trial(_tuned_split_kernel, timings)
        split = None
    else:  # the Triton interpreter: one fixed configuration
        plan.split_config = {"BLOCK_N": 64}
        split = _split_kernel[plan.split_grid](*args, **plan.split_flags, **plan.split_config)
    merge = None
    if plan.part_shape is not None:
        merge = _merge_kernel[plan.merge_grid](*merge_args, **plan.merge_flags)
    # later steps of this signature launch what Triton compiled here, directly
    if split is not None and q.is_cuda:
        plan.split_launch = _direct_launch(split, _split_kernel, plan.split_grid,
                                           {**plan.split_flags, **plan.split_config})
        plan.merge_launch = None if merge is None else _direct_launch(
            merge, _merge_kernel, plan.merge_grid, plan.merge_flags)
        plan.alignment = _alignment(*args[:5])
    return (out, lse) if return_lse else out
