"""Families `bwd` and `bwd-atomic`: the backward as stages of one plan (FlashAttention-2's split).

    preprocess   delta = rowsum(dO * O), per query row (fp32)
    dkdv         program per BLOCK_N keys and key/value head: K and V stay on chip while it
                 steps BLOCK_M query rows at a time over the query heads of its group and
                 the query blocks that see its keys, accumulating dK and dV. It works
                 key-major (S^T = K Q^T), so P^T and dS^T feed the dV and dK dots as they
                 are, without a transpose. In `bwd-atomic` it also adds each dQ contribution
                 into an fp32 workspace with atomics (fast, not bit-reproducible).
    dq           (`bwd`) program per BLOCK_M queries and head (the plan passes the config's
                 block_n here: each kernel owns the long side) stepping BLOCK_N keys; no
                 atomics, so gradients are the same on every run (deterministic)
    convert      (`bwd-atomic`) the fp32 dQ workspace to dQ's dtype and strides

P is recomputed from the forward's LSE in base 2: P = exp2(qk * scale * log2(e) - lse *
log2(e)), one FMA a score. dS = P * (dP - delta), times the soft-cap's derivative 1 - tanh^2
where there is one; dS before that factor is the bias gradient (written out when the bias
requires grad). Each loop runs in three parts: the query (or key) blocks on the band's
edges, masked, and the blocks in between, with no mask at all.
"""

import triton
import triton.language as tl

from .scores import LOG2E, block_scores, dropout_keep, key_range, load_tile, query_range, store_tile, visible_pairs


@triton.jit
def _sequence(CU_Q, CU_K, b, seqlen_q, seqlen_kv, VARLEN: tl.constexpr):
    if VARLEN:
        q_start = tl.load(CU_Q + b)
        len_q = tl.load(CU_Q + b + 1) - q_start
        k_start = tl.load(CU_K + b)
        len_kv = tl.load(CU_K + b + 1) - k_start
        return q_start.to(tl.int64), len_q, k_start.to(tl.int64), len_kv
    else:
        return (b * 0).to(tl.int64), seqlen_q + b * 0, (b * 0).to(tl.int64), seqlen_kv + b * 0


@triton.jit
def attention_bwd_preprocess(O, DO, DELTA, stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos,
                             stride_lb, stride_lh, CU_Q, CU_K, seqlen_q, seqlen_kv,
                             BLOCK_M: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_V: tl.constexpr,
                             VARLEN: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2)
    q_start, len_q, _, _ = _sequence(CU_Q, CU_K, b, seqlen_q, seqlen_kv, VARLEN)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_V)
    inside = (rows[:, None] < len_q) & (offs_d[None, :] < HEAD_V)
    b64 = b.to(tl.int64)
    o = tl.load(O + b64 * stride_ob + h * stride_oh + (q_start + rows[:, None]) * stride_os + offs_d[None, :],
                mask=inside, other=0.0)
    do = tl.load(DO + b64 * stride_dob + h * stride_doh + (q_start + rows[:, None]) * stride_dos + offs_d[None, :],
                 mask=inside, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + b64 * stride_lb + h * stride_lh + q_start + rows, delta, mask=rows < len_q)


@triton.jit
def _row_stats(LSE, DELTA, l_base, rows, len_q, CHECK_ROWS: tl.constexpr):
    """The forward's LSE in base 2 and delta for these query rows; a row that saw no key (or
    is past the sequence) gets LSE +inf, so its P is 0."""
    if CHECK_ROWS:
        lse = tl.load(LSE + l_base + rows, mask=rows < len_q, other=float("inf"))
        delta = tl.load(DELTA + l_base + rows, mask=rows < len_q, other=0.0)
    else:
        lse = tl.load(LSE + l_base + rows)
        delta = tl.load(DELTA + l_base + rows)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    return lse * LOG2E, delta


@triton.jit
def _dkdv_steps(dk, dv, k, v, q_base, do_base, LSE, DELTA, l_base, DQ_ACC, dq_base, DBIAS, dbias_base, stride_dbm,
                bias_base, stride_bm, stride_bn, mask_base, stride_mm, stride_mn, slope, bh,
                start, end, cols, offs_m, offs_dqk, offs_dv, stride_qs, stride_dos, stride_dqs, len_q, len_kv,
                band_offset, alibi_offset, window_left, window_right, sm_scale, qk_scale, softcap,
                seqlen_q, seqlen_kv, dropout_p, inv_keep, seed, rng_offset,
                BLOCK_M: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_QK: tl.constexpr,
                BLOCK_V: tl.constexpr, MASKED: tl.constexpr, PLAIN: tl.constexpr, HAS_BAND: tl.constexpr,
                USER_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                HAS_DBIAS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK and dV of one key block over query rows [start, end), key-major: (BLOCK_N, BLOCK_M) tiles."""
    c = cols[:, None]
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + offs_m
        r = rows[None, :]
        q = load_tile(q_base, rows, stride_qs, offs_dqk, len_q, HEAD_QK, BLOCK_QK, MASKED)
        do = load_tile(do_base, rows, stride_dos, offs_dv, len_q, HEAD_V, BLOCK_V, MASKED)
        lse2, delta = _row_stats(LSE, DELTA, l_base, rows, len_q, MASKED)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        if PLAIN:
            p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
            t_t = p_t  # no soft-cap: unused
            if MASKED:
                p_t = tl.where(visible_pairs(r, c, len_kv, band_offset, window_left, window_right, HAS_BAND), p_t, 0.0)
        else:
            x, t_t = block_scores(qk_t, r, c, len_q, len_kv, band_offset, alibi_offset, window_left, window_right,
                                  sm_scale, softcap, slope, bias_base, stride_bm, stride_bn, mask_base, stride_mm,
                                  stride_mn, MASKED, HAS_BAND, USER_MASK, HAS_BIAS, HAS_ALIBI, HAS_SOFTCAP)
            p_t = tl.math.exp2(x * LOG2E - lse2[None, :])
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, rng_offset, bh, r, c, seqlen_q, seqlen_kv, dropout_p)
            p_kept = tl.where(keep, p_t * inv_keep, 0.0)
            dp_t = tl.where(keep, dp_t * inv_keep, 0.0)
        else:
            p_kept = p_t
        dv = tl.dot(p_kept.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if HAS_DBIAS:
            tl.store(dbias_base + r * stride_dbm + c, ds_t, mask=(r < len_q) & (c < len_kv))
        if HAS_SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        ds_t = ds_t.to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION) * sm_scale
            dq_ptr = dq_base + rows[:, None] * stride_dqs + offs_dqk[None, :]
            if BLOCK_QK == HEAD_QK:
                tl.atomic_add(dq_ptr, dq, mask=rows[:, None] < len_q, sem="relaxed")
            else:
                tl.atomic_add(dq_ptr, dq, mask=(rows[:, None] < len_q) & (offs_dqk[None, :] < HEAD_QK), sem="relaxed")
    return dk, dv


@triton.jit
def attention_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, DBIAS, BIAS, MASK, SLOPES, CU_Q, CU_K,
                       stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                       stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh,
                       stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
                       stride_dqb, stride_dqh, stride_dqs, stride_dbb, stride_dbh, stride_dbm,
                       stride_bb, stride_bh, stride_bm, stride_bn, stride_mb, stride_mh, stride_mm, stride_mn,
                       stride_sb, stride_sh,
                       seqlen_q, seqlen_kv, heads_q, group, sm_scale, softcap, bottom_right, window_left,
                       window_right, dropout_p, seed, rng_offset,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr,
                       BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr, HAS_BAND: tl.constexpr,
                       USER_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr,
                       HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr, VARLEN: tl.constexpr,
                       ATOMIC_DQ: tl.constexpr, HAS_DBIAS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_n = tl.program_id(0)
    h_kv = tl.program_id(1)
    b = tl.program_id(2)
    q_start, len_q, k_start, len_kv = _sequence(CU_Q, CU_K, b, seqlen_q, seqlen_kv, VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= len_kv:
        return
    PLAIN: tl.constexpr = USER_MASK == 0 and not HAS_BIAS and not HAS_ALIBI and not HAS_SOFTCAP
    b64 = b.to(tl.int64)
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_dqk = tl.arange(0, BLOCK_QK)
    offs_dv = tl.arange(0, BLOCK_V)
    k_base = K + b64 * stride_kb + h_kv.to(tl.int64) * stride_kh + k_start * stride_ks
    v_base = V + b64 * stride_vb + h_kv.to(tl.int64) * stride_vh + k_start * stride_vs
    k = load_tile(k_base, cols, stride_ks, offs_dqk, len_kv, HEAD_QK, BLOCK_QK, True)
    v = load_tile(v_base, cols, stride_vs, offs_dv, len_kv, HEAD_V, BLOCK_V, True)
    dk = tl.zeros([BLOCK_N, BLOCK_QK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    band_offset = bottom_right * (len_kv - len_q)
    alibi_offset = len_kv - len_q
    last_col = tl.minimum(n0 + BLOCK_N, len_kv) - 1
    lo, hi, full_lo, full_hi = query_range(n0, last_col, band_offset, window_left, window_right, len_q, BLOCK_M)
    qk_scale = sm_scale * LOG2E
    inv_keep = 1.0 / (1.0 - dropout_p)
    for g in range(group):
        h = (h_kv * group + g).to(tl.int64)
        q_base = Q + b64 * stride_qb + h * stride_qh + q_start * stride_qs
        do_base = DO + b64 * stride_dob + h * stride_doh + q_start * stride_dos
        dq_base = DQ_ACC + b64 * stride_dqb + h * stride_dqh + q_start * stride_dqs
        dbias_base = DBIAS + b64 * stride_dbb + h * stride_dbh
        l_base = b64 * stride_lb + h * stride_lh + q_start
        bias_base = BIAS + b64 * stride_bb + h * stride_bh
        mask_base = MASK + b64 * stride_mb + h * stride_mh
        slope = 0.0
        if HAS_ALIBI:
            slope = tl.load(SLOPES + b * stride_sb + h * stride_sh).to(tl.float32)
        bh = b * heads_q + h
        runs = ((lo, full_lo, True), (full_lo, full_hi, False), (full_hi, hi, True))
        for i in tl.static_range(3):  # the band's first query blocks (masked), those that see every key, the last
            dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, LSE, DELTA, l_base, DQ_ACC, dq_base, DBIAS,
                                 dbias_base, stride_dbm, bias_base, stride_bm, stride_bn, mask_base, stride_mm,
                                 stride_mn, slope, bh, runs[i][0], runs[i][1], cols, offs_m, offs_dqk, offs_dv,
                                 stride_qs, stride_dos, stride_dqs, len_q, len_kv, band_offset, alibi_offset,
                                 window_left, window_right, sm_scale, qk_scale, softcap, seqlen_q, seqlen_kv,
                                 dropout_p, inv_keep, seed, rng_offset, BLOCK_M, HEAD_QK, HEAD_V, BLOCK_QK, BLOCK_V,
                                 runs[i][2], PLAIN, HAS_BAND, USER_MASK, HAS_BIAS, HAS_ALIBI, HAS_SOFTCAP,
                                 HAS_DROPOUT, ATOMIC_DQ, HAS_DBIAS, DOT_PRECISION)
    dk_base = DK + b64 * stride_dkb + h_kv.to(tl.int64) * stride_dkh + k_start * stride_dks
    dv_base = DV + b64 * stride_dvb + h_kv.to(tl.int64) * stride_dvh + k_start * stride_dvs
    store_tile(dk_base, cols, stride_dks, offs_dqk, len_kv, (dk * sm_scale).to(DK.dtype.element_ty), HEAD_QK, BLOCK_QK)
    store_tile(dv_base, cols, stride_dvs, offs_dv, len_kv, dv.to(DV.dtype.element_ty), HEAD_V, BLOCK_V)


@triton.jit
def _dq_steps(dq, q, do, lse2, delta, k_base, v_base, dbias_base, stride_dbm, bias_base, stride_bm, stride_bn,
              mask_base, stride_mm, stride_mn, slope, bh, start, end, rows, offs_n, offs_dqk, offs_dv,
              stride_ks, stride_vs, len_q, len_kv, band_offset, alibi_offset, window_left, window_right,
              sm_scale, qk_scale, softcap, seqlen_q, seqlen_kv, dropout_p, inv_keep, seed, rng_offset,
              BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_QK: tl.constexpr,
              BLOCK_V: tl.constexpr, MASKED: tl.constexpr, PLAIN: tl.constexpr, HAS_BAND: tl.constexpr,
              USER_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              HAS_DROPOUT: tl.constexpr, HAS_DBIAS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dQ of one query block over key columns [start, end), query-major: (BLOCK_M, BLOCK_N) tiles."""
    r = rows[:, None]
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        c = cols[None, :]
        k = load_tile(k_base, cols, stride_ks, offs_dqk, len_kv, HEAD_QK, BLOCK_QK, MASKED)
        v = load_tile(v_base, cols, stride_vs, offs_dv, len_kv, HEAD_V, BLOCK_V, MASKED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if PLAIN:
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
            t = p  # no soft-cap: unused
            if MASKED:
                p = tl.where(visible_pairs(r, c, len_kv, band_offset, window_left, window_right, HAS_BAND), p, 0.0)
        else:
            x, t = block_scores(qk, r, c, len_q, len_kv, band_offset, alibi_offset, window_left, window_right,
                                sm_scale, softcap, slope, bias_base, stride_bm, stride_bn, mask_base, stride_mm,
                                stride_mn, MASKED, HAS_BAND, USER_MASK, HAS_BIAS, HAS_ALIBI, HAS_SOFTCAP)
            p = tl.math.exp2(x * LOG2E - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, rng_offset, bh, r, c, seqlen_q, seqlen_kv, dropout_p)
            dp = tl.where(keep, dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_DBIAS:
            tl.store(dbias_base + r * stride_dbm + c, ds, mask=(r < len_q) & (c < len_kv))
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def attention_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, DBIAS, BIAS, MASK, SLOPES, CU_Q, CU_K,
                     stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                     stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh,
                     stride_dqb, stride_dqh, stride_dqs, stride_dbb, stride_dbh, stride_dbm,
                     stride_bb, stride_bh, stride_bm, stride_bn, stride_mb, stride_mh, stride_mm, stride_mn,
                     stride_sb, stride_sh,
                     seqlen_q, seqlen_kv, heads_q, group, sm_scale, softcap, bottom_right, window_left,
                     window_right, dropout_p, seed, rng_offset,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr,
                     BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr, HAS_BAND: tl.constexpr,
                     USER_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr,
                     HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr, VARLEN: tl.constexpr,
                     HAS_DBIAS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start, len_q, k_start, len_kv = _sequence(CU_Q, CU_K, b, seqlen_q, seqlen_kv, VARLEN)
    if HAS_BAND:
        pid_m = tl.cdiv(seqlen_q, BLOCK_M) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    if m0 >= len_q:
        return
    PLAIN: tl.constexpr = USER_MASK == 0 and not HAS_BIAS and not HAS_ALIBI and not HAS_SOFTCAP
    b64 = b.to(tl.int64)
    h_kv = h // group
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dqk = tl.arange(0, BLOCK_QK)
    offs_dv = tl.arange(0, BLOCK_V)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + q_start * stride_qs
    do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh + q_start * stride_dos
    k_base = K + b64 * stride_kb + h_kv.to(tl.int64) * stride_kh + k_start * stride_ks
    v_base = V + b64 * stride_vb + h_kv.to(tl.int64) * stride_vh + k_start * stride_vs
    bias_base = BIAS + b64 * stride_bb + h.to(tl.int64) * stride_bh
    mask_base = MASK + b64 * stride_mb + h.to(tl.int64) * stride_mh
    dbias_base = DBIAS + b64 * stride_dbb + h.to(tl.int64) * stride_dbh
    l_base = b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start
    q = load_tile(q_base, rows, stride_qs, offs_dqk, len_q, HEAD_QK, BLOCK_QK, True)
    do = load_tile(do_base, rows, stride_dos, offs_dv, len_q, HEAD_V, BLOCK_V, True)
    lse2, delta = _row_stats(LSE, DELTA, l_base, rows, len_q, True)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + b * stride_sb + h * stride_sh).to(tl.float32)
    band_offset = bottom_right * (len_kv - len_q)
    alibi_offset = len_kv - len_q
    last_row = tl.minimum(m0 + BLOCK_M, len_q) - 1
    lo, hi, full_lo, full_hi = key_range(m0, last_row, band_offset, window_left, window_right, len_kv, BLOCK_N)
    bh = b * heads_q + h
    qk_scale = sm_scale * LOG2E
    inv_keep = 1.0 / (1.0 - dropout_p)
    dq = tl.zeros([BLOCK_M, BLOCK_QK], dtype=tl.float32)
    runs = ((lo, full_lo, True), (full_lo, full_hi, False), (full_hi, hi, True))
    for i in tl.static_range(3):  # the band's first key blocks (masked), those every row sees, the last
        dq = _dq_steps(dq, q, do, lse2, delta, k_base, v_base, dbias_base, stride_dbm, bias_base, stride_bm,
                       stride_bn, mask_base, stride_mm, stride_mn, slope, bh, runs[i][0], runs[i][1], rows, offs_n,
                       offs_dqk, offs_dv, stride_ks, stride_vs, len_q, len_kv, band_offset, alibi_offset,
                       window_left, window_right, sm_scale, qk_scale, softcap, seqlen_q, seqlen_kv, dropout_p,
                       inv_keep, seed, rng_offset, BLOCK_N, HEAD_QK, HEAD_V, BLOCK_QK, BLOCK_V, runs[i][2], PLAIN,
                       HAS_BAND, USER_MASK, HAS_BIAS, HAS_ALIBI, HAS_SOFTCAP, HAS_DROPOUT, HAS_DBIAS, DOT_PRECISION)
    dq_base = DQ + b64 * stride_dqb + h.to(tl.int64) * stride_dqh + q_start * stride_dqs
    store_tile(dq_base, rows, stride_dqs, offs_dqk, len_q, (dq * sm_scale).to(DQ.dtype.element_ty), HEAD_QK, BLOCK_QK)


@triton.jit
def attention_bwd_convert(DQ_ACC, DQ, stride_ab, stride_ah, stride_as, stride_dqb, stride_dqh, stride_dqs,
                          CU_Q, CU_K, seqlen_q, seqlen_kv,
                          BLOCK_M: tl.constexpr, HEAD_QK: tl.constexpr, BLOCK_QK: tl.constexpr,
                          VARLEN: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2)
    q_start, len_q, _, _ = _sequence(CU_Q, CU_K, b, seqlen_q, seqlen_kv, VARLEN)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_QK)
    inside = (rows[:, None] < len_q) & (offs_d[None, :] < HEAD_QK)
    b64 = b.to(tl.int64)
    acc = tl.load(DQ_ACC + b64 * stride_ab + h * stride_ah + (q_start + rows[:, None]) * stride_as + offs_d[None, :],
                  mask=inside, other=0.0)
    tl.store(DQ + b64 * stride_dqb + h * stride_dqh + (q_start + rows[:, None]) * stride_dqs + offs_d[None, :],
             acc.to(DQ.dtype.element_ty), mask=inside)
