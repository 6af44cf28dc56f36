"""Triton kernels of the fused TAPA attention: forward, backward preprocess, dK/dV and dQ.

The function computed is the one `tapa.ops.tapa.reference` defines; this file only says how. Every
tile's logits come from `tapa.ops.tapa.logits` (`tile_logits` in the forward,
`tile_logits_and_derivatives` in the backward), shared with the decode kernel; here the kernels
run an online softmax in base 2 (FlashAttention style) over them, never holding an N x N buffer.
Causal tiles that are entirely visible skip the mask; tiles entirely in the future are never
visited. GQA: a dK/dV program loops over the query heads of its group, so its dK/dV need no
atomics.

VARLEN (packed sequences, FlashAttention's varlen form): the tensors are (1, total, H, D) views
of the packed rows and the grid's batch index is a sequence's. Each program reads its sequence's
rows from CuQ and CuK (int32 offsets), shifts its base pointers there (the host passes batch
strides of 0), and aligns the sequence's queries bottom-right (q_offset = Lk - Lq, k_offset = 0;
the dK/dV kernel, whose inner loops run over queries, counts positions from the first query
instead: q_offset = 0, k_offset = Lq - Lk). The forward's lse is (H, total_q), n_q carrying
total_q. The backward reads lse and delta padded (`_bwd_varlen_preprocess_kernel`, as
FlashAttention-2 pads its softmax_d): sequence b's rows start at row `_padded_first_row` of an
(H, n_padded) buffer, a multiple of SEQUENCE_ALIGN, and run on to the next multiple with lse +inf
and delta 0, so that the query loops load them whole and aligned, without a row mask; n_q then
carries n_padded. Programs past their sequence's end return at once. Without VARLEN the host
passes CuQ = CuK = None, which Triton folds away, so the dense kernels compile as before.

The constexprs each kernel takes beyond the shapes are the ones the config table sets
(`tapa.ops.tapa.configs`), turned into flags by `tapa.ops.tapa.launch`.
"""

import triton
import triton.language as tl

from tapa.ops.tapa.logits import tile_logits, tile_logits_and_derivatives

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
# The backward's padded lse and delta rows (VARLEN): each sequence's start and end rounded to this
# multiple, a multiple of every query tile (BLOCK_M) the backward launches.
SEQUENCE_ALIGN = tl.constexpr(128)


@triton.jit
def _load_tile(ptrs, row_ok, col_ok, ROW_MASK: tl.constexpr, COL_MASK: tl.constexpr):
    if ROW_MASK and COL_MASK:
        return tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    elif ROW_MASK:
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    elif COL_MASK:
        return tl.load(ptrs, mask=col_ok[None, :], other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _desc_tile(desc, batch, row, head, col, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Rows row .. row + BLOCK_R - 1 and columns col .. col + BLOCK_C - 1 of head `head` in batch
    `batch` of a (B, N, H, D) tensor, by its TMA descriptor (block (1, BLOCK_R, 1, BLOCK_C)); rows
    past N come as zeros."""
    return desc.load([batch, row, head, col]).reshape(BLOCK_R, BLOCK_C)


@triton.jit
def _row_parts(base, rows, stride_n, row_ok, ROW_MASK: tl.constexpr, AMP_DIM: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_DA: tl.constexpr, BLOCK_DP: tl.constexpr):
    """A loop tile's amplitude and phase parts by pointers from base (the rows' mask where
    ROW_MASK). The phase part loads first."""
    offs_da = tl.arange(0, BLOCK_DA)
    offs_dp = AMP_DIM + tl.arange(0, BLOCK_DP)
    part_p = _load_tile(base + rows * stride_n + offs_dp[None, :], row_ok, offs_dp < HEAD_DIM,
                        ROW_MASK, BLOCK_DP != HEAD_DIM - AMP_DIM)
    part_a = _load_tile(base + rows * stride_n + offs_da[None, :], row_ok, offs_da < AMP_DIM,
                        ROW_MASK, BLOCK_DA != AMP_DIM)
    return part_a, part_p


@triton.jit
def _finite_or_zero(m):
    """A softmax shift: a row that has seen no visible key yet keeps max -inf and is shifted by 0
    (no inf - inf)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def _sequence(CuQ, CuK, seq):
    """(first query row, queries, first key row, keys) of packed sequence `seq`."""
    q_start = tl.load(CuQ + seq)
    k_start = tl.load(CuK + seq)
    return q_start, tl.load(CuQ + seq + 1) - q_start, k_start, tl.load(CuK + seq + 1) - k_start


@triton.jit
def _padded_first_row(q_start, seq):
    """Packed sequence seq's first row in the backward's padded lse and delta (its first packed
    row is q_start): SEQUENCE_ALIGN x (q_start // SEQUENCE_ALIGN + seq), which leaves each
    sequence room for its rows rounded up to a multiple of SEQUENCE_ALIGN."""
    return (q_start // SEQUENCE_ALIGN + seq) * SEQUENCE_ALIGN


@triton.jit
def _tile_distances(row_offset, ramp, exact, SPLIT_S: tl.constexpr, MASKED: tl.constexpr):
    """A tile's distances s. With SPLIT_S the logits take them as row_offset less the ramp (the
    same integers), so s is built whole only where the mask reads it (MASKED), else unused;
    without, `exact` (the caller's positions subtracted, unused and so not emitted with SPLIT_S)."""
    if SPLIT_S:
        if MASKED:
            s = row_offset[:, None] - ramp[None, :]
        else:
            s = 0.0
    else:
        s = exact
    return s


@triton.jit
def _row_block(Q, block, bh, n_q, heads, group, stride_qb, stride_qn, stride_qh,
               AMP_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_DA: tl.constexpr,
               BLOCK_DP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row block `block` of batch-head bh of a (B, N, H, D) tensor (queries in the forward and dQ
    kernels; keys in the dK/dV kernel, with H the kv heads and group 1): its first row, batch,
    head, kv head, rows and their mask, and the tile's two parts and phase-row sums. The one place
    a program finds its rows: every kernel starts here."""
    start_m = block * BLOCK_M
    batch = bh // heads
    head = bh % heads
    kv_head = head // group
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_da = tl.arange(0, BLOCK_DA)
    offs_dp = AMP_DIM + tl.arange(0, BLOCK_DP)
    row_ok = offs_m < n_q
    rows = offs_m.to(tl.int64)[:, None]
    q_base = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
    q_a = _load_tile(q_base + rows * stride_qn + offs_da[None, :], row_ok, offs_da < AMP_DIM,
                     True, BLOCK_DA != AMP_DIM)
    q_p = _load_tile(q_base + rows * stride_qn + offs_dp[None, :], row_ok, offs_dp < HEAD_DIM,
                     True, BLOCK_DP != HEAD_DIM - AMP_DIM)
    q_sum = tl.sum(q_p.to(tl.float32), axis=1)
    return start_m, batch, head, kv_head, offs_m, row_ok, rows, q_a, q_p, q_sum


@triton.jit
def _key_range(start_m, n_q, n_k, q_offset, k_offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr):
    """(full, hi) for the query block at start_m: keys [0, full) need no mask (causal: the key
    blocks wholly at or before the block's first query), [full, hi) are the masked ones."""
    if CAUSAL:
        last_row = tl.minimum(start_m + BLOCK_M, n_q) - 1
        hi = tl.minimum(n_k, q_offset + last_row - k_offset + 1)
        full = tl.minimum((q_offset + start_m - k_offset + 1) // BLOCK_N, n_k // BLOCK_N) * BLOCK_N
    else:
        hi = n_k
        full = (n_k // BLOCK_N) * BLOCK_N
    return full, hi


# ----------------------------------------------------------------------------------------------
# Forward


@triton.jit
def _fwd_inner(acc, m_i, l_i, q_a, q_p, q_sum, pos_m, q_first,
               k_base, v_base, stride_kn, stride_vn, n_k, k_offset, lo, hi, k_desc_a, k_desc_p,
               v_desc, batch, desc_row0, kv_head, logit_scale, phase_scale, alpha, taylor_rho, b1, b2, b3, b4,
               b5, b6, rho_in, rho_out, AMP_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
               V_DIM: tl.constexpr, BLOCK_DA: tl.constexpr, BLOCK_DP: tl.constexpr,
               BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, DIST_POWER: tl.constexpr,
               PHASE_QUAD: tl.constexpr, TRIG_POLY: tl.constexpr, TAYLOR_ORDER: tl.constexpr,
               BANDS: tl.constexpr, PTX_ASM: tl.constexpr, LONG_PHASE: tl.constexpr,
               DOT_PRECISION: tl.constexpr, SPLIT_S: tl.constexpr, FAST_SCALARS: tl.constexpr,
               COS_RADIANS: tl.constexpr, TMA: tl.constexpr):
    """The forward's online softmax over key blocks [lo, hi) of one query block.

    SPLIT_S: the distances as each row's offset less a float column ramp made once (the same
    integers), and with 2 the far tiles' series in the column term. FAST_SCALARS: a far tile's
    log2(d0) and 1 / d0 from the MUFU. COS_RADIANS: the MUFU cos on the unreduced phase in radians
    (the host folds 2 pi into phase_scale). TMA: the K and V tiles by their TMA descriptors (one
    thread issues each tile's copy; their rows start at desc_row0 of batch `batch`), else by
    pointers. BANDS: the far series in three bands of
    orders (`tapa.ops.tapa.logits._scaled_distance_weight`)."""
    offs_dv = tl.arange(0, BLOCK_DV)
    column_ramp = tl.arange(0, BLOCK_N).to(tl.float32)  # read only with SPLIT_S
    for start_n in tl.range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n_k
        rows = offs_n.to(tl.int64)[:, None]
        key_first = (k_offset + start_n).to(tl.float32)
        row_offset = pos_m - key_first
        s = _tile_distances(row_offset, column_ramp,
                            pos_m[:, None] - (k_offset + offs_n).to(tl.float32)[None, :], SPLIT_S,
                            MASKED)
        if TMA:
            k_p = _desc_tile(k_desc_p, batch, desc_row0 + start_n, kv_head, AMP_DIM, BLOCK_N,
                             BLOCK_DP)
            k_a = _desc_tile(k_desc_a, batch, desc_row0 + start_n, kv_head, 0, BLOCK_N, BLOCK_DA)
        else:
            k_a, k_p = _row_parts(k_base, rows, stride_kn, key_ok, MASKED, AMP_DIM, HEAD_DIM,
                                  BLOCK_DA, BLOCK_DP)
        logit = tile_logits(q_a, k_a, q_p, k_p, q_sum, tl.sum(k_p.to(tl.float32), axis=1), s,
                            row_offset, column_ramp, q_first - (key_first + (BLOCK_N - 1)),
                            q_first + (BLOCK_M - 1) - key_first, alpha, phase_scale, taylor_rho, b1,
                            b2, b3, b4, b5, b6, rho_in, rho_out, DIST_POWER, PHASE_QUAD, TRIG_POLY,
                            TAYLOR_ORDER, BANDS, PTX_ASM, LONG_PHASE, DOT_PRECISION, SPLIT_S,
                            FAST_SCALARS, COS_RADIANS)  # x sqrt(d_A)
        if MASKED:
            visible = key_ok[None, :]
            if CAUSAL:
                visible = visible & (s >= 0)
            logit = tl.where(visible, logit, float("-inf"))
        m_tile = tl.max(logit, 1) * logit_scale
        m_new = tl.maximum(m_i, m_tile)
        rescale = tl.exp2(m_i - _finite_or_zero(m_new))
        p = tl.exp2(logit * logit_scale - _finite_or_zero(m_new)[:, None])
        if TMA:
            v = _desc_tile(v_desc, batch, desc_row0 + start_n, kv_head, 0, BLOCK_N, BLOCK_DV)
        else:
            v = _load_tile(v_base + rows * stride_vn + offs_dv[None, :], key_ok, offs_dv < V_DIM,
                           MASKED, BLOCK_DV != V_DIM)
        p_v = p.to(v.dtype)
        l_i = l_i * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p_v, v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(Q, K, V, Out, Lse, CuQ, CuK, KDescA, KDescP, VDesc,
                stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb,
                stride_vn, stride_vh, stride_ob, stride_on, stride_oh, n_q, n_k, q_offset, k_offset,
                heads, group, n_bh, logit_scale, phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5, b6,
                rho_in, rho_out, AMP_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
                V_DIM: tl.constexpr, BLOCK_DA: tl.constexpr, BLOCK_DP: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, DIST_POWER: tl.constexpr, PHASE_QUAD: tl.constexpr,
                TRIG_POLY: tl.constexpr, TAYLOR_ORDER: tl.constexpr, BANDS: tl.constexpr,
                PTX_ASM: tl.constexpr, LONG_PHASE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                SPLIT_S: tl.constexpr, FAST_SCALARS: tl.constexpr, COS_RADIANS: tl.constexpr,
                TMA: tl.constexpr, VARLEN: tl.constexpr):
    """One (query block, batch x head) tile a program, the grid (query blocks, batch x heads);
    causal: the longest rows first, so that the last wave is short. KDescA, KDescP, VDesc: TMA
    descriptors of K's two parts and of V (with TMA; else None). n_bh: batch x heads, the grid's
    second axis; the code does not read it, but the compiled forward keeps its parameter layout
    with it (without it ptxas allocates the registers otherwise: 8-16 B more stack at D=64)."""
    n_blocks = tl.num_programs(0)
    block = tl.program_id(0)
    bh = tl.program_id(1)
    if CAUSAL:
        block = n_blocks - 1 - block
    if VARLEN:
        n_total = n_q
        q_start, n_q, k_start, n_k = _sequence(CuQ, CuK, bh // heads)
        if block * BLOCK_M >= n_q:
            return
        Q += q_start.to(tl.int64) * stride_qn
        Out += q_start.to(tl.int64) * stride_on
        K += k_start.to(tl.int64) * stride_kn
        V += k_start.to(tl.int64) * stride_vn
        q_offset = n_k - n_q
        k_offset = 0
    start_m, batch, head, kv_head, offs_m, row_ok, rows, q_a, q_p, q_sum = _row_block(
        Q, block, bh, n_q, heads, group, stride_qb, stride_qn, stride_qh, AMP_DIM, HEAD_DIM,
        BLOCK_DA, BLOCK_DP, BLOCK_M)
    if VARLEN:  # the TMA descriptors see the whole (1, total, H, D) tensor
        desc_batch = 0
        desc_row0 = k_start
    else:
        desc_batch = batch
        desc_row0 = 0
    offs_dv = tl.arange(0, BLOCK_DV)
    pos_m = (q_offset + offs_m).to(tl.float32)
    q_first = (q_offset + start_m).to(tl.float32)
    k_base = K + batch.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = V + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh

    full, hi = _key_range(start_m, n_q, n_k, q_offset, k_offset, BLOCK_M, BLOCK_N, CAUSAL)
    if VARLEN:  # with more queries than keys the first ones sit before every key
        full = tl.maximum(full, 0)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = _fwd_inner(
        acc, m_i, l_i, q_a, q_p, q_sum, pos_m, q_first, k_base, v_base, stride_kn, stride_vn,
        n_k, k_offset, 0, full, KDescA, KDescP, VDesc, desc_batch, desc_row0, kv_head, logit_scale,
        phase_scale,
        alpha, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in, rho_out, AMP_DIM, HEAD_DIM, V_DIM,
        BLOCK_DA, BLOCK_DP, BLOCK_DV, BLOCK_M, BLOCK_N, False, CAUSAL, DIST_POWER, PHASE_QUAD,
        TRIG_POLY, TAYLOR_ORDER, BANDS, PTX_ASM, LONG_PHASE, DOT_PRECISION, SPLIT_S, FAST_SCALARS,
        COS_RADIANS, TMA)
    acc, m_i, l_i = _fwd_inner(
        acc, m_i, l_i, q_a, q_p, q_sum, pos_m, q_first, k_base, v_base, stride_kn, stride_vn,
        n_k, k_offset, full, hi, KDescA, KDescP, VDesc, desc_batch, desc_row0, kv_head,
        logit_scale, phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5, b6, rho_in, rho_out, AMP_DIM,
        HEAD_DIM, V_DIM, BLOCK_DA, BLOCK_DP, BLOCK_DV, BLOCK_M, BLOCK_N, True, CAUSAL,
        DIST_POWER, PHASE_QUAD, TRIG_POLY, TAYLOR_ORDER, BANDS, PTX_ASM, LONG_PHASE,
        DOT_PRECISION, SPLIT_S, FAST_SCALARS, COS_RADIANS, TMA)
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # only padding rows have no visible key
    out = acc / l_safe[:, None]
    o_base = Out + batch.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh
    tl.store(o_base + rows * stride_on + offs_dv[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv < V_DIM)[None, :])
    lse = (m_i + tl.log2(l_safe)) * LN2
    if VARLEN:  # the lse is (H, total_q)
        tl.store(Lse + head.to(tl.int64) * n_total + q_start + offs_m, lse, mask=row_ok)
    else:
        tl.store(Lse + bh.to(tl.int64) * n_q + offs_m, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# Backward


@triton.jit
def _out_dout_rowsum(Out, DOut, rows, stride_on, stride_dn, offs_dv, mask):
    """rowsum(out * dout) in float32 over the (rows, offs_dv) tile (Out, DOut at the tile's batch
    and head): the softmax-gradient row term."""
    out = tl.load(Out + rows * stride_on + offs_dv[None, :], mask=mask, other=0.0).to(tl.float32)
    dout = tl.load(DOut + rows * stride_dn + offs_dv[None, :], mask=mask, other=0.0).to(tl.float32)
    return tl.sum(out * dout, axis=1)


@triton.jit
def _bwd_preprocess_kernel(Out, DOut, DLse, Delta, stride_ob, stride_on, stride_oh,
                           stride_db, stride_dn, stride_dh, n_q, heads,
                           V_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                           HAS_DLSE: tl.constexpr):
    """delta = rowsum(out * dout) - dlse: the softmax-gradient row term (with lse's gradient)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    batch = tl.program_id(1) // heads
    head = tl.program_id(1) % heads
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = (offs_m < n_q)[:, None] & (offs_dv < V_DIM)[None, :]
    delta = _out_dout_rowsum(Out + batch.to(tl.int64) * stride_ob + head * stride_oh,
                             DOut + batch.to(tl.int64) * stride_db + head * stride_dh,
                             offs_m.to(tl.int64)[:, None], stride_on, stride_dn, offs_dv, mask)
    row_index = tl.program_id(1).to(tl.int64) * n_q + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLse + row_index, mask=offs_m < n_q, other=0.0)
    tl.store(Delta + row_index, delta, mask=offs_m < n_q)


@triton.jit
def _bwd_varlen_preprocess_kernel(Out, DOut, DLse, Lse, Delta, LsePadded, CuQ, stride_on,
                                  stride_oh, stride_dn, stride_dh, n_total, n_padded, heads,
                                  V_DIM: tl.constexpr, BLOCK_DV: tl.constexpr,
                                  BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr):
    """The packed sequences' delta (as `_bwd_preprocess_kernel`'s) and a copy of lse, both in the
    backward's padded (H, n_padded) layout (module docstring): BLOCK_M rows of one sequence and
    head a program, the grid (padded row blocks, sequences x heads). Rows past the sequence's end,
    to the next multiple of SEQUENCE_ALIGN, get lse = +inf and delta = 0, so that p = 0 there.
    Out, DOut: (1, total_q, H, Dv); Lse and DLse: (H, total_q)."""
    seq = tl.program_id(1) // heads
    head = tl.program_id(1) % heads
    q_start = tl.load(CuQ + seq)
    n_q = tl.load(CuQ + seq + 1) - q_start
    if tl.program_id(0) * BLOCK_M >= tl.cdiv(n_q, SEQUENCE_ALIGN) * SEQUENCE_ALIGN:
        return
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_q
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = row_ok[:, None] & (offs_dv < V_DIM)[None, :]
    delta = _out_dout_rowsum(Out + head.to(tl.int64) * stride_oh,
                             DOut + head.to(tl.int64) * stride_dh,
                             (q_start + offs_m).to(tl.int64)[:, None], stride_on, stride_dn,
                             offs_dv, mask)
    packed = head.to(tl.int64) * n_total + q_start + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLse + packed, mask=row_ok, other=0.0)
    padded = head.to(tl.int64) * n_padded + _padded_first_row(q_start, seq) + offs_m
    tl.store(Delta + padded, delta)
    tl.store(LsePadded + padded, tl.load(Lse + packed, mask=row_ok, other=float("inf")))


@triton.jit
def _dkdv_inner(dk_a, dk_p, dk_psum, dv, k_a, k_p, k_sum, v, pos_n, key_first,
                q_base, do_base, dq_base, lse_ptr, delta_ptr, stride_qn, stride_dn, stride_dqn, n_q,
                q_offset, lo, hi, logit_scale, phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5,
                b6, amp_grad_scale, phase_grad_scale, AMP_DIM: tl.constexpr,
                HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_DA: tl.constexpr,
                BLOCK_DP: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DIST_POWER: tl.constexpr,
                PHASE_QUAD: tl.constexpr, TRIG_POLY: tl.constexpr, TAYLOR_ORDER: tl.constexpr,
                PTX_ASM: tl.constexpr, LONG_PHASE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                DQ_ATOMIC: tl.constexpr, DQ_TRANSPOSE: tl.constexpr, COS_RADIANS: tl.constexpr,
                FAST_SCALARS: tl.constexpr, PADDED_ROWS: tl.constexpr):
    """dK/dV of one key block against query blocks [lo, hi); tiles are (keys, queries).

    With DQ_ATOMIC the tile's share of dQ is also added (float32 atomics) into dq_base, so that
    the scores are recomputed once instead of again in a separate dQ kernel. DQ_TRANSPOSE computes
    that share as dQ^T = K^T dS: its M is then the head columns instead of the query tile, so its
    dots get Hopper's wgmma (M >= 64) at the 32-query tile that fits the registers, while the
    atomics per score stay those of the 128-key tile.

    COS_RADIANS: the forward's `COS_RADIANS` (the host scales phase_scale and phase_grad_scale to
    match). FAST_SCALARS: the forward's (a far tile's log2(d0) and 1 / d0 from the MUFU).
    PADDED_ROWS: lse and delta come padded past n_q (VARLEN's layout, lse +inf and delta 0 there)
    and aligned, and load without the row mask: whole vectors rather than a predicated element
    each, since a loaded n_q has no known divisibility.
    """
    offs_da = tl.arange(0, BLOCK_DA)
    offs_dp = AMP_DIM + tl.arange(0, BLOCK_DP)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_m in tl.range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n_q
        rows = offs_m.to(tl.int64)[:, None]
        q_first = (q_offset + start_m).to(tl.float32)
        s = (q_offset + offs_m).to(tl.float32)[None, :] - pos_n[:, None]
        q_a, q_p = _row_parts(q_base, rows, stride_qn, row_ok, True, AMP_DIM, HEAD_DIM, BLOCK_DA,
                              BLOCK_DP)
        qk_amp, cos, phase_factor = tile_logits_and_derivatives(
            k_a, q_a, k_p, q_p, k_sum, tl.sum(q_p.to(tl.float32), axis=1), s, 0.0, 0.0,
            q_first - (key_first + (BLOCK_N - 1)), q_first + (BLOCK_M - 1) - key_first, alpha,
            phase_scale, taylor_rho, b1, b2, b3, b4, b5, b6, 0.0, 0.0, DIST_POWER, PHASE_QUAD,
            TRIG_POLY, TAYLOR_ORDER, False, PTX_ASM, LONG_PHASE, DOT_PRECISION, 0, FAST_SCALARS,
            COS_RADIANS)
        # padding query rows load lse = +inf, so p = 0 there
        if PADDED_ROWS:
            lse2 = tl.load(lse_ptr + offs_m) * LOG2E
        else:
            lse2 = tl.load(lse_ptr + offs_m, mask=row_ok, other=float("inf")) * LOG2E
        p = tl.exp2(qk_amp * cos * logit_scale - lse2[None, :])
        if MASKED:
            p = tl.where(s >= 0, p, 0.0)
        do = _load_tile(do_base + rows * stride_dn + offs_dv[None, :], row_ok, offs_dv < V_DIM,
                        True, BLOCK_DV != V_DIM)
        dv += tl.dot(p.to(do.dtype), do, input_precision=DOT_PRECISION)
        dp = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if PADDED_ROWS:
            delta = tl.load(delta_ptr + offs_m)
        else:
            delta = tl.load(delta_ptr + offs_m, mask=row_ok, other=0.0)
        ds = p * (dp - delta[None, :])
        grad_amp = (ds * cos).to(q_a.dtype)
        dk_a += tl.dot(grad_amp, q_a, input_precision=DOT_PRECISION)
        grad_phase = ds * phase_factor
        if PHASE_QUAD:
            dk_p += tl.dot(grad_phase.to(q_p.dtype), q_p, input_precision=DOT_PRECISION)
        else:
            dk_psum += tl.sum(grad_phase, axis=1)
        if DQ_ATOMIC and DQ_TRANSPOSE:  # (columns, queries) tiles; the atomics' layout follows
            dq_cols = dq_base + offs_m.to(tl.int64)[None, :] * stride_dqn
            dq_a = tl.dot(tl.trans(k_a), grad_amp, input_precision=DOT_PRECISION)
            tl.atomic_add(dq_cols + offs_da[:, None], dq_a * amp_grad_scale,
                          mask=row_ok[None, :] & (offs_da < AMP_DIM)[:, None], sem="relaxed")
            if PHASE_QUAD:
                dq_p = tl.dot(tl.trans(k_p), grad_phase.to(k_p.dtype), input_precision=DOT_PRECISION)
            else:
                dq_p = (tl.zeros([BLOCK_DP, BLOCK_M], dtype=tl.float32)
                        + tl.sum(grad_phase, axis=0)[None, :])
            tl.atomic_add(dq_cols + offs_dp[:, None], dq_p * phase_grad_scale,
                          mask=row_ok[None, :] & (offs_dp < HEAD_DIM)[:, None], sem="relaxed")
        elif DQ_ATOMIC:
            dq_rows = dq_base + rows * stride_dqn
            dq_a = tl.dot(tl.trans(grad_amp), k_a, input_precision=DOT_PRECISION)
            tl.atomic_add(dq_rows + offs_da[None, :], dq_a * amp_grad_scale,
                          mask=row_ok[:, None] & (offs_da < AMP_DIM)[None, :], sem="relaxed")
            if PHASE_QUAD:
                dq_p = tl.dot(tl.trans(grad_phase.to(k_p.dtype)), k_p,
                              input_precision=DOT_PRECISION)
            else:
                dq_p = (tl.zeros([BLOCK_M, BLOCK_DP], dtype=tl.float32)
                        + tl.sum(grad_phase, axis=0)[:, None])
            tl.atomic_add(dq_rows + offs_dp[None, :], dq_p * phase_grad_scale,
                          mask=row_ok[:, None] & (offs_dp < HEAD_DIM)[None, :], sem="relaxed")
    return dk_a, dk_p, dk_psum, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DOut, Lse, Delta, DK, DV, DQ, CuQ, CuK,
                     stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb,
                     stride_vn, stride_vh, stride_db, stride_dn, stride_dh, stride_dkb, stride_dkn,
                     stride_dkh, stride_dvb, stride_dvn, stride_dvh, stride_dqb, stride_dqn,
                     stride_dqh, n_q, n_k, q_offset, k_offset, kv_heads, group, logit_scale,
                     phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5, b6, amp_grad_scale,
                     phase_grad_scale, AMP_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
                     V_DIM: tl.constexpr, BLOCK_DA: tl.constexpr, BLOCK_DP: tl.constexpr,
                     BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, DIST_POWER: tl.constexpr, PHASE_QUAD: tl.constexpr,
                     TRIG_POLY: tl.constexpr, TAYLOR_ORDER: tl.constexpr, PTX_ASM: tl.constexpr,
                     LONG_PHASE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     DQ_ATOMIC: tl.constexpr, DQ_TRANSPOSE: tl.constexpr,
                     COS_RADIANS: tl.constexpr, FAST_SCALARS: tl.constexpr, VARLEN: tl.constexpr):
    """One (key block, batch x kv head) a program; DQ: float32 with DQ_ATOMIC (the kernel adds
    its dQ shares there), else unused."""
    if VARLEN:
        n_total = n_q
        seq = tl.program_id(1) // kv_heads
        q_start, n_q, k_start, n_k = _sequence(CuQ, CuK, seq)
        if tl.program_id(0) * BLOCK_N >= n_k:
            return
        Q += q_start.to(tl.int64) * stride_qn
        DOut += q_start.to(tl.int64) * stride_dn
        DQ += q_start.to(tl.int64) * stride_dqn
        K += k_start.to(tl.int64) * stride_kn
        V += k_start.to(tl.int64) * stride_vn
        DK += k_start.to(tl.int64) * stride_dkn
        DV += k_start.to(tl.int64) * stride_dvn
        # Positions from the first query (bottom-right all the same): the query loops then read
        # q_offset as the constant 0, where Lk - Lq would hold a register through them (the
        # dense kernel reads it from its arguments).
        q_offset = 0
        k_offset = n_q - n_k
    start_n, batch, kv_head, _, offs_n, key_ok, rows, k_a, k_p, k_sum = _row_block(
        K, tl.program_id(0), tl.program_id(1), n_k, kv_heads, 1, stride_kb, stride_kn, stride_kh,
        AMP_DIM, HEAD_DIM, BLOCK_DA, BLOCK_DP, BLOCK_N)
    offs_da = tl.arange(0, BLOCK_DA)
    offs_dp = AMP_DIM + tl.arange(0, BLOCK_DP)
    offs_dv = tl.arange(0, BLOCK_DV)
    v = _load_tile(V + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
                   + rows * stride_vn + offs_dv[None, :], key_ok, offs_dv < V_DIM, True,
                   BLOCK_DV != V_DIM)
    pos_n = (k_offset + offs_n).to(tl.float32)
    key_first = (k_offset + start_n).to(tl.float32)

    if CAUSAL:
        key_last = k_offset + tl.minimum(start_n + BLOCK_N, n_k) - 1
        # the first query block that sees any key of this block, and the first that sees them all
        lo = (tl.maximum(k_offset + start_n - q_offset, 0) // BLOCK_M) * BLOCK_M
        mid = tl.minimum((tl.maximum(key_last - q_offset, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M,
                         n_q)
        mid = tl.maximum(mid, lo)
    else:
        lo = 0
        mid = 0
    dk_a = tl.zeros([BLOCK_N, BLOCK_DA], dtype=tl.float32)
    dk_p = tl.zeros([BLOCK_N, BLOCK_DP], dtype=tl.float32)
    dk_psum = tl.zeros([BLOCK_N], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    unmasked_lo = mid
    if VARLEN:  # the same rows; a multiple of BLOCK_M as the compiler sees it, so that the
        # unmasked loop's lse and delta tiles load aligned
        unmasked_lo = tl.cdiv(mid, BLOCK_M) * BLOCK_M
    heads = kv_heads * group
    for member in range(0, group):  # the query heads that share this kv head
        head = kv_head * group + member
        bh = batch.to(tl.int64) * heads + head
        q_base = Q + batch.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh
        do_base = DOut + batch.to(tl.int64) * stride_db + head.to(tl.int64) * stride_dh
        dq_base = DQ + batch.to(tl.int64) * stride_dqb + head.to(tl.int64) * stride_dqh
        if VARLEN:  # lse and delta in the padded layout
            row0 = head.to(tl.int64) * n_total + _padded_first_row(q_start, seq)
        else:
            row0 = bh * n_q
        dk_a, dk_p, dk_psum, dv = _dkdv_inner(
            dk_a, dk_p, dk_psum, dv, k_a, k_p, k_sum, v, pos_n, key_first, q_base, do_base, dq_base,
            Lse + row0, Delta + row0, stride_qn, stride_dn, stride_dqn, n_q, q_offset, lo,
            mid, logit_scale, phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5, b6,
            amp_grad_scale, phase_grad_scale, AMP_DIM, HEAD_DIM, V_DIM, BLOCK_DA, BLOCK_DP,
            BLOCK_DV, BLOCK_M, BLOCK_N, CAUSAL, DIST_POWER, PHASE_QUAD, TRIG_POLY, TAYLOR_ORDER,
            PTX_ASM, LONG_PHASE, DOT_PRECISION, DQ_ATOMIC, DQ_TRANSPOSE, COS_RADIANS, FAST_SCALARS,
            VARLEN)
        dk_a, dk_p, dk_psum, dv = _dkdv_inner(
            dk_a, dk_p, dk_psum, dv, k_a, k_p, k_sum, v, pos_n, key_first, q_base, do_base, dq_base,
            Lse + row0, Delta + row0, stride_qn, stride_dn, stride_dqn, n_q, q_offset, unmasked_lo,
            n_q, logit_scale, phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5, b6,
            amp_grad_scale, phase_grad_scale, AMP_DIM, HEAD_DIM, V_DIM, BLOCK_DA, BLOCK_DP,
            BLOCK_DV, BLOCK_M, BLOCK_N, False, DIST_POWER, PHASE_QUAD, TRIG_POLY, TAYLOR_ORDER,
            PTX_ASM, LONG_PHASE, DOT_PRECISION, DQ_ATOMIC, DQ_TRANSPOSE, COS_RADIANS, FAST_SCALARS,
            VARLEN)

    dk_base = DK + batch.to(tl.int64) * stride_dkb + kv_head.to(tl.int64) * stride_dkh
    tl.store(dk_base + rows * stride_dkn + offs_da[None, :],
             (dk_a * amp_grad_scale).to(DK.dtype.element_ty),
             mask=key_ok[:, None] & (offs_da < AMP_DIM)[None, :])
    if PHASE_QUAD:
        dk_phase = dk_p * phase_grad_scale
    else:  # d phi / d k_P is the same for every phase column
        dk_phase = (tl.zeros([BLOCK_N, BLOCK_DP], dtype=tl.float32)
                    + (dk_psum * phase_grad_scale)[:, None])
    tl.store(dk_base + rows * stride_dkn + offs_dp[None, :], dk_phase.to(DK.dtype.element_ty),
             mask=key_ok[:, None] & (offs_dp < HEAD_DIM)[None, :])
    tl.store(DV + batch.to(tl.int64) * stride_dvb + kv_head.to(tl.int64) * stride_dvh
             + rows * stride_dvn + offs_dv[None, :], dv.to(DV.dtype.element_ty),
             mask=key_ok[:, None] & (offs_dv < V_DIM)[None, :])


@triton.jit
def _dq_inner(dq_a, dq_p, dq_psum, q_a, q_p, q_sum, do, lse2, delta, pos_m, q_first,
              k_base, v_base, stride_kn, stride_vn, n_k, k_offset, lo, hi, logit_scale,
              phase_scale, alpha, taylor_rho, b1, b2, b3, b4, b5, b6, AMP_DIM: tl.constexpr,
              HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_DA: tl.constexpr,
              BLOCK_DP: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              DIST_POWER: tl.constexpr, PHASE_QUAD: tl.constexpr, TRIG_POLY: tl.constexpr,
              TAYLOR_ORDER: tl.constexpr, PTX_ASM: tl.constexpr, LONG_PHASE: tl.constexpr,
              DOT_PRECISION: tl.constexpr, SPLIT_S: tl.constexpr, FAST_SCALARS: tl.constexpr,
              COS_RADIANS: tl.constexpr):
    """dQ of one query block against key blocks [lo, hi); tiles are (queries, keys). SPLIT_S
    (the distances as row offsets less the column ramp), FAST_SCALARS and COS_RADIANS: as in the
    forward's `_fwd_inner`."""
    offs_dv = tl.arange(0, BLOCK_DV)
    column_ramp = tl.arange(0, BLOCK_N).to(tl.float32)  # read only with SPLIT_S
    for start_n in tl.range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n_k
        rows = offs_n.to(tl.int64)[:, None]
        key_first = (k_offset + start_n).to(tl.float32)
        row_offset = pos_m - key_first
        s = _tile_distances(row_offset, column_ramp,
                            pos_m[:, None] - (k_offset + offs_n).to(tl.float32)[None, :], SPLIT_S,
                            MASKED)
        k_a, k_p = _row_parts(k_base, rows, stride_kn, key_ok, MASKED, AMP_DIM, HEAD_DIM,
                              BLOCK_DA, BLOCK_DP)
        qk_amp, cos, phase_factor = tile_logits_and_derivatives(
            q_a, k_a, q_p, k_p, q_sum, tl.sum(k_p.to(tl.float32), axis=1), s, row_offset,
            column_ramp, q_first - (key_first + (BLOCK_N - 1)), q_first + (BLOCK_M - 1) - key_first,
            alpha, phase_scale, taylor_rho, b1, b2, b3, b4, b5, b6, 0.0, 0.0, DIST_POWER,
            PHASE_QUAD, TRIG_POLY, TAYLOR_ORDER, False, PTX_ASM, LONG_PHASE, DOT_PRECISION, SPLIT_S,
            FAST_SCALARS, COS_RADIANS)
        p = tl.exp2(qk_amp * cos * logit_scale - lse2[:, None])
        if MASKED:
            visible = key_ok[None, :]
            if CAUSAL:
                visible = visible & (s >= 0)
            p = tl.where(visible, p, 0.0)
        v = _load_tile(v_base + rows * stride_vn + offs_dv[None, :], key_ok, offs_dv < V_DIM,
                       MASKED, BLOCK_DV != V_DIM)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq_a += tl.dot((ds * cos).to(k_a.dtype), k_a, input_precision=DOT_PRECISION)
        grad_phase = ds * phase_factor
        if PHASE_QUAD:
            dq_p += tl.dot(grad_phase.to(k_p.dtype), k_p, input_precision=DOT_PRECISION)
        else:
            dq_psum += tl.sum(grad_phase, axis=1)
    return dq_a, dq_p, dq_psum


@triton.jit
def _bwd_dq_kernel(Q, K, V, DOut, Lse, Delta, DQ, CuQ, CuK,
                   stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb,
                   stride_vn, stride_vh, stride_db, stride_dn, stride_dh, stride_dqb, stride_dqn,
                   stride_dqh, n_q, n_k, q_offset, k_offset, heads, group, logit_scale, phase_scale,
                   alpha, taylor_rho, b1, b2, b3, b4, b5, b6, amp_grad_scale, phase_grad_scale,
                   AMP_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr,
                   BLOCK_DA: tl.constexpr, BLOCK_DP: tl.constexpr, BLOCK_DV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                   DIST_POWER: tl.constexpr, PHASE_QUAD: tl.constexpr, TRIG_POLY: tl.constexpr,
                   TAYLOR_ORDER: tl.constexpr, PTX_ASM: tl.constexpr, LONG_PHASE: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, SPLIT_S: tl.constexpr, FAST_SCALARS: tl.constexpr,
                   COS_RADIANS: tl.constexpr, VARLEN: tl.constexpr):
    """One (query block, batch x head) a program, the longest rows first where causal: dQ in
    the order of its key blocks, the same every run (the deterministic path)."""
    block = tl.program_id(0)
    if CAUSAL:
        block = tl.num_programs(0) - 1 - block
    if VARLEN:
        n_total = n_q
        seq = tl.program_id(1) // heads
        q_start, n_q, k_start, n_k = _sequence(CuQ, CuK, seq)
        if block * BLOCK_M >= n_q:
            return
        Q += q_start.to(tl.int64) * stride_qn
        DOut += q_start.to(tl.int64) * stride_dn
        DQ += q_start.to(tl.int64) * stride_dqn
        K += k_start.to(tl.int64) * stride_kn
        V += k_start.to(tl.int64) * stride_vn
        q_offset = n_k - n_q
        k_offset = 0
    start_m, batch, head, kv_head, offs_m, row_ok, rows, q_a, q_p, q_sum = _row_block(
        Q, block, tl.program_id(1), n_q, heads, group, stride_qb, stride_qn, stride_qh, AMP_DIM,
        HEAD_DIM, BLOCK_DA, BLOCK_DP, BLOCK_M)
    offs_da = tl.arange(0, BLOCK_DA)
    offs_dp = AMP_DIM + tl.arange(0, BLOCK_DP)
    offs_dv = tl.arange(0, BLOCK_DV)
    do = _load_tile(DOut + batch.to(tl.int64) * stride_db + head.to(tl.int64) * stride_dh
                    + rows * stride_dn + offs_dv[None, :], row_ok, offs_dv < V_DIM, True,
                    BLOCK_DV != V_DIM)
    if VARLEN:  # lse and delta in the backward's padded layout
        row_index = head.to(tl.int64) * n_total + _padded_first_row(q_start, seq) + offs_m
    else:
        row_index = tl.program_id(1).to(tl.int64) * n_q + offs_m
    lse2 = tl.load(Lse + row_index, mask=row_ok, other=0.0) * LOG2E
    delta = tl.load(Delta + row_index, mask=row_ok, other=0.0)
    pos_m = (q_offset + offs_m).to(tl.float32)
    q_first = (q_offset + start_m).to(tl.float32)
    k_base = K + batch.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = V + batch.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh

    full, hi = _key_range(start_m, n_q, n_k, q_offset, k_offset, BLOCK_M, BLOCK_N, CAUSAL)
    if VARLEN:
        full = tl.maximum(full, 0)
    dq_a = tl.zeros([BLOCK_M, BLOCK_DA], dtype=tl.float32)
    dq_p = tl.zeros([BLOCK_M, BLOCK_DP], dtype=tl.float32)
    dq_psum = tl.zeros([BLOCK_M], dtype=tl.float32)
    dq_a, dq_p, dq_psum = _dq_inner(
        dq_a, dq_p, dq_psum, q_a, q_p, q_sum, do, lse2, delta, pos_m, q_first, k_base, v_base,
        stride_kn, stride_vn, n_k, k_offset, 0, full, logit_scale, phase_scale, alpha, taylor_rho,
        b1, b2, b3, b4, b5, b6, AMP_DIM, HEAD_DIM, V_DIM, BLOCK_DA, BLOCK_DP, BLOCK_DV, BLOCK_M,
        BLOCK_N, False, CAUSAL, DIST_POWER, PHASE_QUAD, TRIG_POLY, TAYLOR_ORDER, PTX_ASM,
        LONG_PHASE, DOT_PRECISION, SPLIT_S, FAST_SCALARS, COS_RADIANS)
    dq_a, dq_p, dq_psum = _dq_inner(
        dq_a, dq_p, dq_psum, q_a, q_p, q_sum, do, lse2, delta, pos_m, q_first, k_base, v_base,
        stride_kn, stride_vn, n_k, k_offset, full, hi, logit_scale, phase_scale, alpha, taylor_rho,
        b1, b2, b3, b4, b5, b6, AMP_DIM, HEAD_DIM, V_DIM, BLOCK_DA, BLOCK_DP, BLOCK_DV, BLOCK_M,
        BLOCK_N, True, CAUSAL, DIST_POWER, PHASE_QUAD, TRIG_POLY, TAYLOR_ORDER, PTX_ASM,
        LONG_PHASE, DOT_PRECISION, SPLIT_S, FAST_SCALARS, COS_RADIANS)

    dq_base = DQ + batch.to(tl.int64) * stride_dqb + head.to(tl.int64) * stride_dqh
    tl.store(dq_base + rows * stride_dqn + offs_da[None, :],
             (dq_a * amp_grad_scale).to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_da < AMP_DIM)[None, :])
    if PHASE_QUAD:
        dq_phase = dq_p * phase_grad_scale
    else:
        dq_phase = (tl.zeros([BLOCK_M, BLOCK_DP], dtype=tl.float32)
                    + (dq_psum * phase_grad_scale)[:, None])
    tl.store(dq_base + rows * stride_dqn + offs_dp[None, :], dq_phase.to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dp < HEAD_DIM)[None, :])
