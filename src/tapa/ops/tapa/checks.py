"""Argument checks of the TAPA ops, in one place: `tapa_attention`, the KV-cache decode op and the
split-KV decode kernel all raise through these functions, each ValueError naming the argument.

Range limits, and why:
- Positions and distances are float32 in the kernels, exact up to 2**24, so every position
  (q_offset + Nq, k_offset + Nk, cache slots) must stay below MAX_POSITION = 2**24.
- The phase t = f(d) * phi is float32. With d <= 2**24 and f(d) <= MAX_DISTANCE_WEIGHT = 2**96,
  t stays finite for any |phi| < 2**32 (float32 overflows at 2**128). That bounds alpha:
  "power"  f(d) = d ** alpha  <= 2**96  for every d <= 2**24  iff  alpha <= 96 / 24 = 4;
  "linear" f(d) = alpha * d   <= 2**96                        iff  alpha <= 2**72.
  (alpha = 10 at d = 6186 and alpha = 50 at d = 6 overflow float32 and turn the output into NaN.)
  Within the bound every output is finite; how many fractional turns of t float32 still resolves
  is the op's conditioning (|t| * 2**-24), the same for every float32 implementation.
"""

from __future__ import annotations

import math
import numbers

import torch

from tapa.ops.tapa.reference import DISTANCES, PHASES, split_dims

IMPLS = ("auto", "triton", "reference", "naive")
MAX_POSITION = 2**24
MAX_DISTANCE_WEIGHT = 2.0**96
MAX_ALPHA = {"power": math.log2(MAX_DISTANCE_WEIGHT) / math.log2(MAX_POSITION),  # 4.0
             "linear": MAX_DISTANCE_WEIGHT / MAX_POSITION}  # 2**72


def check_variant(head_dim: int, *, theta, alpha, distance, phase) -> None:
    """Raise ValueError, naming the argument, for TAPA settings the op does not define."""
    if not isinstance(theta, numbers.Real) or isinstance(theta, bool) or not 0.0 < theta < 1.0:
        raise ValueError(f"theta must be a float in (0, 1), got {theta!r}")
    amp_dim, phase_dim = split_dims(head_dim, theta)
    if amp_dim == 0 or phase_dim == 0:
        raise ValueError(f"theta={theta} with head_dim={head_dim} leaves an empty "
                         f"{'amplitude' if amp_dim == 0 else 'phase'} part (d_A={amp_dim}, d_P={phase_dim})")
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    if not alpha <= MAX_ALPHA[distance]:  # also rejects inf and nan
        raise ValueError(f"alpha must be <= {MAX_ALPHA[distance]:g} for distance={distance!r} (beyond it the "
                         f"phase f(d) * phi overflows float32 within {MAX_POSITION} tokens), got {alpha!r}")


def _check_rank4(**tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (batch, seqlen, heads, head_dim), "
                             f"got shape {tuple(t.shape)}")


def _check_qkv(q, k, v, k_name="k", v_name="v") -> None:
    """Dtypes, devices and the shapes q (B, Nq, H, D), k (B, Nk, Hk, D), v (B, Nk, Hk, Dv) share."""
    _check_rank4(**{"q": q, k_name: k, v_name: v})
    if not q.is_floating_point():
        raise ValueError(f"q must be a floating-point tensor, got dtype {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, {k_name} and {v_name} must share a dtype, got q {q.dtype}, "
                         f"{k_name} {k.dtype}, {v_name} {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, {k_name} and {v_name} must be on one device, "
                         f"got {q.device}, {k.device}, {v.device}")
    if q.shape[0] == 0:
        raise ValueError(f"batch size must be positive, got q of shape {tuple(q.shape)}")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"batch size differs: q {q.shape[0]}, {k_name} {k.shape[0]}, {v_name} {v.shape[0]}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"{k_name} and {v_name} seqlen differ: {k.shape[1]} and {v.shape[1]}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"head_dim of q ({q.shape[3]}) and {k_name} ({k.shape[3]}) differ")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"{k_name} and {v_name} must have the same number of heads, "
                         f"got {k.shape[2]} and {v.shape[2]}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"heads must be positive, got q heads {q.shape[2]}, kv heads {k.shape[2]}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"heads: q heads ({q.shape[2]}) must be a multiple of kv heads ({k.shape[2]})")
    if v.shape[3] == 0:
        raise ValueError(f"{v_name} head_dim must be positive, got shape {tuple(v.shape)}")


def check_flag(name: str, value) -> None:
    """A bool argument must be a bool: a string such as "false" would be truthy."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_args(q, k, v, *, theta, alpha, distance, phase, causal, q_offset, k_offset,
               return_lse=False) -> None:
    """Raise ValueError, naming the argument, for anything `tapa_attention` cannot compute correctly."""
    _check_qkv(q, k, v)
    check_flag("causal", causal)
    check_flag("return_lse", return_lse)
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"seqlen must be positive, got q {q.shape[1]} and k {k.shape[1]}")
    check_variant(q.shape[3], theta=theta, alpha=alpha, distance=distance, phase=phase)
    for name, offset, length in (("q_offset", q_offset, q.shape[1]), ("k_offset", k_offset, k.shape[1])):
        if not isinstance(offset, numbers.Integral) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"{name} must be a non-negative int, got {offset!r}")
        if offset + length > MAX_POSITION:
            raise ValueError(f"{name} + seqlen must be <= {MAX_POSITION} (positions are float32 in the "
                             f"kernels), got {name}={offset} with seqlen {length}")
    if causal:
        if q_offset < k_offset:
            raise ValueError(f"causal: the first query (position q_offset={q_offset}) would see no "
                             f"key (first key at k_offset={k_offset})")
        if q.shape[1] > k.shape[1]:  # with q_offset >= k_offset, queries would pass the last key
            raise ValueError(f"causal with more queries ({q.shape[1]}) than keys ({k.shape[1]}): "
                             f"the last queries would sit past the last key")


def check_impl(impl) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def check_triton_device(device: torch.device, interpreting: bool) -> None:
    """Triton kernels run on CUDA tensors, or on CPU tensors only under its interpreter."""
    if device.type != "cuda" and not interpreting:
        raise ValueError(f"impl='triton' needs CUDA tensors, got {device.type} tensors (on CPU, Triton "
                         f"runs only with TRITON_INTERPRET=1 set before triton is imported); "
                         f"use impl='auto' or 'reference'")


def check_kvcache_args(q, k_cache, v_cache, cache_seqlens, cache_starts, *, theta, alpha, distance,
                       phase, return_lse=False, check_lengths=True) -> None:
    """Raise ValueError, naming the argument, for a decode call `tapa_attention_with_kvcache` (and
    the split-KV kernel) cannot compute: shapes, dtypes, lengths tensors, the TAPA variant."""
    _check_qkv(q, k_cache, v_cache, "k_cache", "v_cache")
    check_flag("return_lse", return_lse)
    check_flag("check_lengths", check_lengths)
    batch, q_len = q.shape[:2]
    if q_len == 0 or k_cache.shape[1] == 0:
        raise ValueError(f"seqlen must be positive, got q {q_len} and cache capacity {k_cache.shape[1]}")
    if k_cache.shape[1] > MAX_POSITION:
        raise ValueError(f"cache capacity must be <= {MAX_POSITION} (positions are float32 in the kernels), "
                         f"got {k_cache.shape[1]}")
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_leftpad", cache_starts)):
        if t is None and name == "cache_leftpad":
            continue
        if not isinstance(t, torch.Tensor) or t.shape != (batch,) or t.dtype != torch.int32:
            raise ValueError(f"{name} must be an int32 tensor of shape ({batch},), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
                             f"{' ' + str(t.dtype) if isinstance(t, torch.Tensor) else ''}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    check_variant(q.shape[3], theta=theta, alpha=alpha, distance=distance, phase=phase)


def check_cache_lengths(q_len: int, capacity: int, cache_seqlens, cache_starts) -> None:
    """Value checks of the cache lengths (a device sync, which a caller that built them may skip):
    every sequence holds its q_len new tokens, and every query is a real (not padded) token."""
    if bool((cache_seqlens < q_len).any()) or bool((cache_seqlens > capacity).any()):
        raise ValueError(f"cache_seqlens must lie in [q_len={q_len}, cache capacity={capacity}], "
                         f"got {cache_seqlens.tolist()}")
    if cache_starts is not None and bool(((cache_starts < 0) | (cache_starts > cache_seqlens - q_len)).any()):
        raise ValueError(f"cache_leftpad must lie in [0, cache_seqlens - q_len] so every query sees a key, "
                         f"got {cache_starts.tolist()}")
