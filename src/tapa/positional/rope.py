"""RoPE-family positional encodings: the baselines TAPA is compared against.

All methods rotate pairs (x_i, x_{i + D/2}) of a head vector (the non-interleaved "rotate_half"
layout of LLaMA) by the angle pos * inv_freq_i, i = 0 .. D/2 - 1. They differ only in inv_freq and
in an attention factor that multiplies cos and sin (so the logits scale by its square):

    rope:        inv_freq_i = base ** (-2i / D)
    pi:          inv_freq_i = base ** (-2i / D) / s                       (linear position interpolation)
    ntk:         base' = base * s ** (D / (D - 2)); inv_freq_i = base' ** (-2i / D)      (static NTK-aware)
    dynamic-ntk: as ntk with base' = base * (s * L / L0 - (s - 1)) ** (D / (D - 2)) when the current
                 length L exceeds the original length L0; plain rope otherwise
    yarn:        inv_freq_i = (1 - e_i) * inv_freq_i / s + e_i * inv_freq_i, where e_i ramps linearly
                 from 1 (dims that rotate more than beta_fast times over L0: kept) to 0 (fewer than
                 beta_slow rotations: interpolated), and attention factor 0.1 * ln(s) + 1
    none:        NoPE, no rotation at all (the caller skips apply_rope)

s is the scaling factor (typically new length / original length L0).
"""

from __future__ import annotations

import math

import torch

METHODS = ("rope", "pi", "ntk", "dynamic-ntk", "yarn", "none")


def rope_inv_freq(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """inv_freq_i = base ** (-2i / head_dim), float32, shape (head_dim // 2,)."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / base**exponents).float()


def _yarn_correction_dim(num_rotations: float, head_dim: int, base: float, original_seq_len: int):
    """The (fractional) pair index whose frequency completes num_rotations turns over original_seq_len."""
    return head_dim * math.log(original_seq_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(head_dim, base, factor, original_seq_len, beta_fast=32.0, beta_slow=1.0):
    """YaRN frequencies and attention factor (see the module docstring)."""
    inv_freq = rope_inv_freq(head_dim, base)
    half = head_dim // 2
    low = max(math.floor(_yarn_correction_dim(beta_fast, head_dim, base, original_seq_len)), 0)
    high = min(math.ceil(_yarn_correction_dim(beta_slow, head_dim, base, original_seq_len)), half - 1)
    if high == low:
        high += 0.001  # keep the ramp's slope finite
    ramp = ((torch.arange(half, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate (divide by factor)
    inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, attention_factor


def rope_frequencies(method: str, head_dim: int, *, base: float = 10000.0, factor: float = 1.0,
                     original_seq_len: int = 2048, seq_len: int | None = None,
                     beta_fast: float = 32.0, beta_slow: float = 1.0):
    """(inv_freq (head_dim // 2,) float32, attention_factor) for one RoPE-family method."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if factor <= 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    if method in ("rope", "none"):
        return rope_inv_freq(head_dim, base), 1.0
    if method == "pi":
        return rope_inv_freq(head_dim, base) / factor, 1.0
    if method in ("ntk", "dynamic-ntk") and head_dim <= 2:
        raise ValueError(f"method {method!r} rescales the base by s ** (D / (D - 2)), which needs "
                         f"head_dim > 2, got {head_dim}")
    exponent = head_dim / (head_dim - 2)
    if method == "ntk":
        return rope_inv_freq(head_dim, base * factor**exponent), 1.0
    if method == "dynamic-ntk":
        if seq_len is None or seq_len <= original_seq_len:
            return rope_inv_freq(head_dim, base), 1.0
        scaled_base = base * (factor * seq_len / original_seq_len - (factor - 1)) ** exponent
        return rope_inv_freq(head_dim, scaled_base), 1.0
    return yarn_inv_freq(head_dim, base, factor, original_seq_len, beta_fast, beta_slow)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, attention_factor: float = 1.0):
    """cos and sin of positions x inv_freq, each (N, head_dim) in float32, both halves equal."""
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, N, H, D) by cos/sin (N, D): x * cos + rotate_half(x) * sin, in x's dtype
    (computed in float32)."""
    half = x.shape[-1] // 2
    x32 = x.float()  # one cast, before rotate_half (negation and concatenation are exact)
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


__all__ = ["METHODS", "rope_inv_freq", "yarn_inv_freq", "rope_frequencies", "rope_cos_sin", "apply_rope"]
