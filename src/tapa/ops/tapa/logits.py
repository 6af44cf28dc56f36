"""The TAPA logits of one tile, in Triton: the one place every kernel (forward, dQ, dK/dV, decode)
computes them, and the element-wise pieces they are made of.

The function is the one `tapa.ops.tapa.reference` defines. For a tile of rows a against rows b (queries
x keys, or keys x queries in dK/dV) at signed distances s = m - n:

    qk_amp = a_A . b_A                          one dot over the amplitude columns
    t      = f(|s|) / sqrt(d_P) * phi           phi = a_P . b_P (quadratic) or sum a_P + sum b_P
    logit  = qk_amp * cos(2 pi (t - round(t)))  the caller applies 1 / sqrt(d_A) (and log2 e)

Where the time goes (docs/design.md, "Where kernel time goes"): the special-function unit (MUFU)
does 16 ops/clock/SM, so per score each exp2 / log2 / cos costs about a quarter of the matmul
work at D=128. So:
- round(t) is two float adds with the 1.5 * 2**23 trick (a conversion would go to a slow pipe);
- d ** alpha is a Taylor series in the relative distance around the tile's centre when the tile
  lies far from the diagonal (its degree TAYLOR_ORDER and the band where it applies, `taylor_rho`,
  set on the host for a tolerance), and only near the diagonal exp2(alpha * log2 d) per element;
- when f(d) grows large (alpha up to its bound, long range; the host's LONG_PHASE flag), d ** alpha
  is evaluated to a few ulp by an exact exponent split and the phase is reduced twice, so that
  the kernels stay as accurate as the float32 reference for any finite phase;
- cos/sin are odd/even polynomials after the turn reduction (FMA pipes, `TRIG_POLY`; their float32
  evaluation error is TRIG_POLY_ERROR, which tests/ops checks), or the MUFU's cos.approx/sin.approx
  (GPU only).

Flags (constexpr, the same names in every kernel): DIST_POWER (f = d ** alpha, else alpha * d),
PHASE_QUAD (phi = a_P . b_P, else the sums), TRIG_POLY, TAYLOR_ORDER, BANDS (two more series bands,
orders TAYLOR_ORDER -/+ 1, `_scaled_distance_weight`), PTX_ASM (MUFU's lg2.approx near the
diagonal; GPU only), LONG_PHASE, DOT_PRECISION ("ieee" for float32 operands, else "tf32"), SPLIT_S
(the distances as row and column parts; 2: the far series in the column term), FAST_SCALARS (a far
tile's scalars by the MUFU), COS_RADIANS (the MUFU trig on the unreduced phase in radians). The
host sets them from the kernels' config table (`tapa.ops.tapa.configs`).
"""

import triton
import triton.language as tl

TWO_PI = tl.constexpr(6.283185307179586)
# Adding and subtracting 1.5 * 2**23 rounds a float32 |t| < 2**22 to the nearest integer
# (ties to even), on the FMA pipes.
ROUND_MAGIC = tl.constexpr(12582912.0)

# Least-squares fits on Chebyshev nodes over |u| <= 1/4: sin(2 pi u) = u * S(u^2) with S0..S5 and
# cos(2 pi u) = C(u^2) with C0..C6.
S0 = tl.constexpr(6.283185306485776)
S1 = tl.constexpr(-41.34170192921982)
S2 = tl.constexpr(81.605209381538)
S3 = tl.constexpr(-76.7036660156435)
S4 = tl.constexpr(41.999960832553896)
S5 = tl.constexpr(-14.336855981223756)
C0 = tl.constexpr(0.9999999999992498)
C1 = tl.constexpr(-19.739208801001624)
C2 = tl.constexpr(64.93939372101508)
C3 = tl.constexpr(-85.4567882051106)
C4 = tl.constexpr(60.243312641375056)
C5 = tl.constexpr(-26.39496046109827)
C6 = tl.constexpr(7.536663068315142)
SIN_COEFFICIENTS = (S0, S1, S2, S3, S4, S5)
COS_COEFFICIENTS = (C0, C1, C2, C3, C4, C5, C6)
# A bound on the float32 evaluation error of either polynomial over |u| <= 1/4 (tests/ops
# recomputes it).
TRIG_POLY_ERROR = 2.5e-7


@triton.jit
def _turns_fraction(t, LONG_PHASE: tl.constexpr):
    """t - round(t), in [-1/2, 1/2]: the phase in turns, reduced before any trigonometry.

    One reduction is exact for |t| < 2**22. LONG_PHASE (f(d) can grow large) reduces again: past
    2**22 the first leaves a whole number of turns (every such float32 t is a multiple of 1/2),
    and on [-1/2, 1/2] the second is the identity.
    """
    r = t - ((t + ROUND_MAGIC) - ROUND_MAGIC)
    if LONG_PHASE:
        r = r - ((r + ROUND_MAGIC) - ROUND_MAGIC)
    return r


@triton.jit
def _phase_product(x, fs, LONG_PHASE: tl.constexpr, PTX_ASM: tl.constexpr):
    """t = x * fs, rounded to float32 before the turn reduction uses it when LONG_PHASE (GPU).

    With FP fusion (Triton's default) the compiler contracts `x * fs + ROUND_MAGIC` and
    `x * fs - round` into FMAs on the exact product. Below 2**22 that only makes r more exact, but
    for a large product the first reduction then leaves r = x * fs - fl(x * fs), up to half an ulp
    of t, and the second reduction of such an r can leave an integer as large as 2**24. The
    polynomials overflow on it (NaN); the MUFU returns garbage (seen on the H200 at
    distance="linear", alpha = 2**72). An explicit `mul.rn` is opaque to LLVM and never fused by
    ptxas, so both reductions see the rounded t.
    """
    if LONG_PHASE and PTX_ASM:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [x, fs],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return x * fs


@triton.jit
def _exact_pow(d, alpha):
    """d ** alpha for d >= 1 to a few ulp at any size of the result.

    exp2(alpha * log2(d)) loses ln(d ** alpha) ulp to the rounding of its argument; here
    log2(d) = e + log2(m) with the exponent e and mantissa m of d, alpha * e is split exactly into
    a rounded and an error term (fma), and 2 ** round(alpha * e) is built from its bits.
    """
    bits = d.to(tl.int32, bitcast=True)
    e = ((bits >> 23) - 127).to(tl.float32)
    m = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    y = alpha * e
    y_err = tl.fma(alpha, e, -y)
    n = (y + ROUND_MAGIC) - ROUND_MAGIC
    two_n = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.exp2((y - n) + (y_err + alpha * tl.log2(m))) * two_n


@triton.jit
def _sin_poly(u):
    """sin(2 pi u) for |u| <= 1/4, by the odd polynomial S."""
    w = u * u
    return u * (S0 + w * (S1 + w * (S2 + w * (S3 + w * (S4 + w * S5)))))


@triton.jit
def _cos_poly(u):
    """cos(2 pi u) for |u| <= 1/4, by the even polynomial C."""
    w = u * u
    return C0 + w * (C1 + w * (C2 + w * (C3 + w * (C4 + w * (C5 + w * C6)))))


@triton.jit
def _mufu_cos(x):
    """cos(x), x in radians, by the MUFU's cos.approx (GPU only)."""
    return tl.inline_asm_elementwise("cos.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _mufu_sin(x):
    """sin(x), x in radians, by the MUFU's sin.approx (GPU only)."""
    return tl.inline_asm_elementwise("sin.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _cos_turns(r, TRIG_POLY: tl.constexpr):
    """cos(2 pi r) for r in [-1/2, 1/2]."""
    if TRIG_POLY:
        return _sin_poly(0.25 - tl.abs(r))  # cos(2 pi r) = sin(2 pi (1/4 - |r|))
    else:
        return _mufu_cos(r * TWO_PI)


@triton.jit
def _sincos_turns(r, TRIG_POLY: tl.constexpr):
    """(cos(2 pi r), sin(2 pi r)) for r in [-1/2, 1/2]."""
    if TRIG_POLY:
        u = 0.25 - tl.abs(r)
        sin_abs = _cos_poly(u)  # sin(2 pi |r|) = cos(2 pi (|r| - 1/4))
        return _sin_poly(u), tl.where(r < 0, -sin_abs, sin_abs)
    else:
        x = r * TWO_PI
        return _mufu_cos(x), _mufu_sin(x)


@triton.jit
def _log2(x, PTX_ASM: tl.constexpr):
    """log2; with PTX_ASM (GPU) the MUFU's lg2.approx instead of libdevice's accurate log2f."""
    if not PTX_ASM:
        return tl.log2(x)
    else:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _distances(s, s_rows, s_cols, SPLIT_S: tl.constexpr):
    """The tile's signed distances: s, or with SPLIT_S s_rows[:, None] - s_cols[None, :]."""
    if SPLIT_S:
        return s_rows[:, None] - s_cols[None, :]
    else:
        return s


@triton.jit
def _rcp(x, PTX_ASM: tl.constexpr):
    """1 / x; with PTX_ASM (GPU) the MUFU's rcp.approx (about 1 ulp) instead of an IEEE division."""
    if not PTX_ASM:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _column_series(a, col, scale, p0, b1, b2, b3, TAYLOR_ORDER: tl.constexpr):
    """p0 * (1 + sum_k b_k u**k) for u = a[:, None] + scale * col[None, :] (a per row, col per
    column), as a polynomial in b = scale * col whose coefficients are per-row vectors:
    A_j(a) = sum_{k>=j} C(k, j) c_k a**(k-j) with c_0 = p0, c_k = p0 * b_k. Per element that is
    one add and TAYLOR_ORDER - 1 multiply-adds, against the u form's add and TAYLOR_ORDER
    multiply-adds. |u| stays within the tile's band, so nothing cancels. Orders 1..3."""
    tl.static_assert((TAYLOR_ORDER >= 1) & (TAYLOR_ORDER <= 3),
                     "the column-term series (SPLIT_S 2) takes TAYLOR_ORDER 1..3")
    b = col * scale
    c1 = p0 * b1
    if TAYLOR_ORDER == 1:
        a0 = c1 * a + p0
        fs = a0[:, None] + (c1 * b)[None, :]
    elif TAYLOR_ORDER == 2:
        c2 = p0 * b2
        a1 = (2.0 * c2) * a + c1
        a0 = (c2 * a + c1) * a + p0
        fs = (a1[:, None] + (c2 * b)[None, :]) * b[None, :] + a0[:, None]
    else:
        c2 = p0 * b2
        c3 = p0 * b3
        a2 = (3.0 * c3) * a + c2
        a1 = ((3.0 * c3) * a + 2.0 * c2) * a + c1
        a0 = ((c3 * a + c2) * a + c1) * a + p0
        fs = ((a2[:, None] + (c3 * b)[None, :]) * b[None, :] + a1[:, None]) * b[None, :] + a0[:, None]
    return fs


@triton.jit
def _far_series(s, s_rows, s_cols, centre, d0, alpha, phase_scale, b1, b2, b3, b4, b5, b6,
                TAYLOR_ORDER: tl.constexpr, PTX_ASM: tl.constexpr, LONG_PHASE: tl.constexpr,
                SPLIT_S: tl.constexpr, FAST_SCALARS: tl.constexpr):
    """A far tile's f(|s|) * phase_scale: d0 ** alpha times the degree-TAYLOR_ORDER series in
    u = |s| / d0 - 1 around the tile's centre (`_scaled_distance_weight`)."""
    if FAST_SCALARS:
        log2_d0 = _log2(d0, PTX_ASM)
        to_u = tl.where(centre > 0, 1.0, -1.0) * _rcp(d0, PTX_ASM)
    else:
        log2_d0 = tl.log2(d0)
        to_u = tl.where(centre > 0, 1.0, -1.0) / d0
    if LONG_PHASE:
        p0 = _exact_pow(d0, alpha) * phase_scale
    else:
        p0 = tl.exp2(alpha * log2_d0) * phase_scale
    if SPLIT_S >= 2:  # the series in the column term: `_column_series`
        fs = _column_series(s_rows * to_u - 1.0, s_cols, -to_u, p0, b1, b2, b3, TAYLOR_ORDER)
    else:
        if SPLIT_S:  # u = s * to_u - 1 = (s_rows * to_u - 1) - s_cols * to_u
            u = (s_rows * to_u - 1.0)[:, None] + s_cols[None, :] * (-to_u)
        else:
            u = s * to_u - 1.0
        # Horner from the leading (scalar) coefficient down: TAYLOR_ORDER FMAs per element
        tl.static_assert((TAYLOR_ORDER >= 1) & (TAYLOR_ORDER <= 6), "TAYLOR_ORDER must be 1..6")
        if TAYLOR_ORDER == 6:
            h = p0 * b6
        elif TAYLOR_ORDER == 5:
            h = p0 * b5
        elif TAYLOR_ORDER == 4:
            h = p0 * b4
        elif TAYLOR_ORDER == 3:
            h = p0 * b3
        elif TAYLOR_ORDER == 2:
            h = p0 * b2
        else:
            h = p0 * b1
        if TAYLOR_ORDER > 5:
            h = h * u + p0 * b5
        if TAYLOR_ORDER > 4:
            h = h * u + p0 * b4
        if TAYLOR_ORDER > 3:
            h = h * u + p0 * b3
        if TAYLOR_ORDER > 2:
            h = h * u + p0 * b2
        if TAYLOR_ORDER > 1:
            h = h * u + p0 * b1
        fs = h * u + p0
    return fs


@triton.jit
def _near_weight(s, s_rows, s_cols, alpha, phase_scale, PTX_ASM: tl.constexpr,
                 LONG_PHASE: tl.constexpr, SPLIT_S: tl.constexpr):
    """f(|s|) * phase_scale element by element, for tiles the series does not cover."""
    d = tl.abs(_distances(s, s_rows, s_cols, SPLIT_S))
    if LONG_PHASE:
        fs = tl.where(d > 0, _exact_pow(tl.maximum(d, 1.0), alpha), 0.0) * phase_scale
    else:
        # log2(0) = -inf, so f(0) = 0
        fs = tl.exp2(alpha * _log2(d, PTX_ASM)) * phase_scale
    return fs


@triton.jit
def _scaled_distance_weight(s, s_rows, s_cols, s_lo, s_hi, alpha, phase_scale, taylor_rho,
                            b1, b2, b3, b4, b5, b6, rho_in, rho_out, DIST_POWER: tl.constexpr,
                            TAYLOR_ORDER: tl.constexpr, BANDS: tl.constexpr, PTX_ASM: tl.constexpr,
                            LONG_PHASE: tl.constexpr, SPLIT_S: tl.constexpr,
                            FAST_SCALARS: tl.constexpr):
    """f(|s|) * phase_scale for a tile of signed distances s = m - n, s_lo <= s <= s_hi.

    Far from the diagonal (the tile on one side of it and its half-span <= taylor_rho * centre),
    d ** alpha = d0 ** alpha * (1 + u) ** alpha with u = d / d0 - 1, as a Taylor series of degree
    TAYLOR_ORDER (<= 6) whose binomial coefficients b_k come from the host (b_k past the order are
    not read). LONG_PHASE (f(d) reaches LONG_PHASE_FROM): d ** alpha by `_exact_pow`, whose error
    does not grow with the result.

    SPLIT_S: s is given as s_rows[:, None] - s_cols[None, :] (s itself is not read), so that u is
    one multiply-add per element; SPLIT_S == 2: the far tile's series is evaluated in the column
    term with per-row coefficients (`_column_series`), one multiply-add per element less. FAST_SCALARS:
    the far tile's log2(d0) and 1 / d0 by the MUFU's approximations (GPU only), not libdevice's
    log2f and an IEEE division.

    BANDS: two more bands of tiles, each with its own series: where the half-span is within
    rho_in * centre (the farthest tiles), order TAYLOR_ORDER - 1; where it is within rho_out *
    centre but not taylor_rho * centre (between the series' band and the diagonal), order
    TAYLOR_ORDER + 1. The host sets rho_in and rho_out for the same tolerance (`logits_args`).
    """
    if DIST_POWER:
        centre = (s_lo + s_hi) * 0.5
        d0 = tl.abs(centre)
        side = (s_lo > 0) | (s_hi < 0)
        half_span = (s_hi - s_lo) * 0.5
        if side & (half_span <= taylor_rho * d0):
            if BANDS:  # the farthest tiles: one order less holds within rho_in
                if half_span <= rho_in * d0:
                    fs = _far_series(s, s_rows, s_cols, centre, d0, alpha, phase_scale, b1, b2, b3,
                                     b4, b5, b6, TAYLOR_ORDER - 1, PTX_ASM, LONG_PHASE, SPLIT_S,
                                     FAST_SCALARS)
                else:
                    fs = _far_series(s, s_rows, s_cols, centre, d0, alpha, phase_scale, b1, b2, b3,
                                     b4, b5, b6, TAYLOR_ORDER, PTX_ASM, LONG_PHASE, SPLIT_S,
                                     FAST_SCALARS)
            else:
                fs = _far_series(s, s_rows, s_cols, centre, d0, alpha, phase_scale, b1, b2, b3, b4,
                                 b5, b6, TAYLOR_ORDER, PTX_ASM, LONG_PHASE, SPLIT_S, FAST_SCALARS)
        else:
            if BANDS:  # tiles between the series' band and the diagonal: one order more, rho_out
                if side & (half_span <= rho_out * d0):
                    fs = _far_series(s, s_rows, s_cols, centre, d0, alpha, phase_scale, b1, b2, b3,
                                     b4, b5, b6, TAYLOR_ORDER + 1, PTX_ASM, LONG_PHASE, SPLIT_S,
                                     FAST_SCALARS)
                else:
                    fs = _near_weight(s, s_rows, s_cols, alpha, phase_scale, PTX_ASM, LONG_PHASE,
                                      SPLIT_S)
            else:
                fs = _near_weight(s, s_rows, s_cols, alpha, phase_scale, PTX_ASM, LONG_PHASE,
                                  SPLIT_S)
    else:
        fs = tl.abs(_distances(s, s_rows, s_cols, SPLIT_S)) * (alpha * phase_scale)
    return fs


# ----------------------------------------------------------------------------------------------
# The tile


@triton.jit
def _tile_amplitude_and_phase(a_amp, b_amp, a_phase, b_phase, a_phase_sum, b_phase_sum, s, s_rows,
                              s_cols, s_lo, s_hi, alpha, phase_scale, taylor_rho, b1, b2, b3, b4,
                              b5, b6, rho_in, rho_out, DIST_POWER: tl.constexpr,
                              PHASE_QUAD: tl.constexpr, TAYLOR_ORDER: tl.constexpr,
                              BANDS: tl.constexpr, PTX_ASM: tl.constexpr, LONG_PHASE: tl.constexpr,
                              DOT_PRECISION: tl.constexpr, SPLIT_S: tl.constexpr,
                              FAST_SCALARS: tl.constexpr, REDUCE: tl.constexpr):
    """(qk_amp, r, fs): the amplitude dot, the reduced phase r = t - round(t) and fs = f / sqrt(d_P)
    (without REDUCE, r is t itself)."""
    fs = _scaled_distance_weight(s, s_rows, s_cols, s_lo, s_hi, alpha, phase_scale, taylor_rho,
                                 b1, b2, b3, b4, b5, b6, rho_in, rho_out, DIST_POWER, TAYLOR_ORDER,
                                 BANDS, PTX_ASM, LONG_PHASE, SPLIT_S, FAST_SCALARS)
    if PHASE_QUAD:
        phi = tl.dot(a_phase, tl.trans(b_phase), input_precision=DOT_PRECISION)
    else:
        phi = a_phase_sum[:, None] + b_phase_sum[None, :]
    t = _phase_product(phi, fs, LONG_PHASE, PTX_ASM)
    qk_amp = tl.dot(a_amp, tl.trans(b_amp), input_precision=DOT_PRECISION)
    if REDUCE:
        t = _turns_fraction(t, LONG_PHASE)
    return qk_amp, t, fs


@triton.jit
def tile_logits(a_amp, b_amp, a_phase, b_phase, a_phase_sum, b_phase_sum, s, s_rows, s_cols, s_lo, s_hi,
                alpha, phase_scale, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in, rho_out,
                DIST_POWER: tl.constexpr, PHASE_QUAD: tl.constexpr, TRIG_POLY: tl.constexpr,
                TAYLOR_ORDER: tl.constexpr, BANDS: tl.constexpr, PTX_ASM: tl.constexpr,
                LONG_PHASE: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT_S: tl.constexpr, FAST_SCALARS: tl.constexpr, COS_RADIANS: tl.constexpr):
    """TAPA logits of the tile times sqrt(d_A): rows a_* (M, .) against rows b_* (N, .) -> (M, N).

    a_amp/b_amp and a_phase/b_phase are the amplitude and phase column tiles (they may be the
    same full-width tile with the other part zeroed); a_phase_sum/b_phase_sum (float32 row sums
    of the phase tiles) are read only without PHASE_QUAD. s (M, N) are the signed distances and
    s_lo <= s <= s_hi their bounds over the tile (for the Taylor series of d ** alpha); with
    SPLIT_S they come as s_rows (M,) and s_cols (N,), s = s_rows[:, None] - s_cols[None, :], and s
    is not read. FAST_SCALARS: `_scaled_distance_weight`. COS_RADIANS (MUFU cos only, GPU; the
    host sets it only without TRIG_POLY and LONG_PHASE, and folds 2 pi into phase_scale): the phase
    goes to cos.approx in radians, unreduced (the MUFU reduces its argument itself: ptxas scales it
    by 1 / 2 pi in front of MUFU.COS), instead of reduced in turns here and scaled back by 2 pi.
    """
    qk_amp, r, fs = _tile_amplitude_and_phase(
        a_amp, b_amp, a_phase, b_phase, a_phase_sum, b_phase_sum, s, s_rows, s_cols, s_lo, s_hi,
        alpha, phase_scale, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in, rho_out, DIST_POWER,
        PHASE_QUAD, TAYLOR_ORDER, BANDS, PTX_ASM, LONG_PHASE, DOT_PRECISION, SPLIT_S, FAST_SCALARS,
        not COS_RADIANS)
    if COS_RADIANS:
        cos = _mufu_cos(r)
    else:
        cos = _cos_turns(r, TRIG_POLY)
    return qk_amp * cos


@triton.jit
def tile_logits_and_derivatives(a_amp, b_amp, a_phase, b_phase, a_phase_sum, b_phase_sum, s, s_rows,
                                s_cols, s_lo, s_hi, alpha, phase_scale, taylor_rho, b1, b2, b3, b4,
                                b5, b6, rho_in, rho_out, DIST_POWER: tl.constexpr,
                                PHASE_QUAD: tl.constexpr, TRIG_POLY: tl.constexpr,
                                TAYLOR_ORDER: tl.constexpr, BANDS: tl.constexpr, PTX_ASM: tl.constexpr,
                                LONG_PHASE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                SPLIT_S: tl.constexpr, FAST_SCALARS: tl.constexpr,
                                COS_RADIANS: tl.constexpr):
    """(qk_amp, cos, phase_factor) of the tile (arguments as `tile_logits`): the logit times
    sqrt(d_A) is qk_amp * cos; its derivative by qk_amp is cos, and by the phase dot phi is
    -2 pi * phase_factor with phase_factor = qk_amp * sin * f / sqrt(d_P). With COS_RADIANS (as
    in `tile_logits`: phase_scale carries 2 pi) the MUFU's cos and sin take the unreduced phase,
    and phase_factor carries the 2 pi too (the caller's gradient scale drops it). SPLIT_S and
    FAST_SCALARS: `_scaled_distance_weight` (without SPLIT_S, s_rows and s_cols are not read)."""
    qk_amp, r, fs = _tile_amplitude_and_phase(
        a_amp, b_amp, a_phase, b_phase, a_phase_sum, b_phase_sum, s, s_rows, s_cols, s_lo, s_hi,
        alpha, phase_scale, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in, rho_out, DIST_POWER,
        PHASE_QUAD, TAYLOR_ORDER, BANDS, PTX_ASM, LONG_PHASE, DOT_PRECISION, SPLIT_S, FAST_SCALARS,
        not COS_RADIANS)
    if COS_RADIANS:
        cos, sin = _mufu_cos(r), _mufu_sin(r)
    else:
        cos, sin = _sincos_turns(r, TRIG_POLY)
    return qk_amp, cos, qk_amp * sin * fs
