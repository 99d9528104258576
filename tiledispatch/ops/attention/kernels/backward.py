"""Families `bwd` and `bwd-atomic`: the backward as stages of one plan.

    preprocess   delta = rowsum(dO * O), per query row (fp32)
    dkdv         program per key block and key/value head: loops over the query heads of
                 its group and the query blocks that see it, accumulating dK and dV in
                 registers. In `bwd-atomic` it also adds each dQ contribution into an fp32
                 workspace with atomics (fast, not bit-reproducible).
    dq           (`bwd`) program per query block and head: loops over its key blocks; no
                 atomics, so gradients are the same on every run (deterministic)
    convert      (`bwd-atomic`) the fp32 dQ workspace to dQ's dtype and strides

P is recomputed from the forward's LSE: P = exp(x - lse); dS = P * (dP - delta), times the
soft-cap's derivative 1 - tanh^2 where there is one. dS before that factor is the bias
gradient (written out when the bias requires grad).
"""

import triton
import triton.language as tl

from .scores import LOG2E, block_scores, dropout_keep, key_range


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
    b64 = b.to(tl.int64)
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_dqk = tl.arange(0, BLOCK_QK)
    offs_dv = tl.arange(0, BLOCK_V)
    k_base = K + b64 * stride_kb + h_kv.to(tl.int64) * stride_kh + k_start * stride_ks
    v_base = V + b64 * stride_vb + h_kv.to(tl.int64) * stride_vh + k_start * stride_vs
    k = tl.load(k_base + cols[:, None] * stride_ks + offs_dqk[None, :],
                mask=(cols[:, None] < len_kv) & (offs_dqk[None, :] < HEAD_QK), other=0.0)
    v = tl.load(v_base + cols[:, None] * stride_vs + offs_dv[None, :],
                mask=(cols[:, None] < len_kv) & (offs_dv[None, :] < HEAD_V), other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_QK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    band_offset = bottom_right * (len_kv - len_q)
    alibi_offset = len_kv - len_q
    # Query rows that see keys [n0, n0 + BLOCK_N): i + offset - left <= j <= i + offset + right.
    last_col = tl.minimum(n0 + BLOCK_N, len_kv) - 1
    q_lo = tl.maximum(n0 - band_offset - window_right, 0) // BLOCK_M * BLOCK_M
    q_hi = tl.minimum(tl.maximum(last_col - band_offset + window_left + 1, 0), len_q)
    inv_keep = 1.0 / (1.0 - dropout_p)
    for g in range(group):
        h = h_kv * group + g
        q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + q_start * stride_qs
        do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh + q_start * stride_dos
        l_base = b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start
        bias_base = BIAS + b64 * stride_bb + h.to(tl.int64) * stride_bh
        mask_base = MASK + b64 * stride_mb + h.to(tl.int64) * stride_mh
        slope = 0.0
        if HAS_ALIBI:
            slope = tl.load(SLOPES + b * stride_sb + h * stride_sh).to(tl.float32)
        bh = b * heads_q + h
        for start_m in range(q_lo, q_hi, BLOCK_M):
            rows = start_m + offs_m
            in_rows = rows < len_q
            q = tl.load(q_base + rows[:, None] * stride_qs + offs_dqk[None, :],
                        mask=in_rows[:, None] & (offs_dqk[None, :] < HEAD_QK), other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_dos + offs_dv[None, :],
                         mask=in_rows[:, None] & (offs_dv[None, :] < HEAD_V), other=0.0)
            lse = tl.load(LSE + l_base + rows, mask=in_rows, other=float("inf"))
            lse = tl.where(lse == float("-inf"), float("inf"), lse)  # a row that saw no key has P = 0
            delta = tl.load(DELTA + l_base + rows, mask=in_rows, other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            x, t = block_scores(qk, rows, cols, len_q, len_kv, band_offset, alibi_offset, window_left,
                                window_right, sm_scale, softcap, slope, bias_base, stride_bm, stride_bn, mask_base,
                                stride_mm, stride_mn, True, HAS_BAND, USER_MASK, HAS_BIAS, HAS_ALIBI, HAS_SOFTCAP)
            p = tl.math.exp2((x - lse[:, None]) * LOG2E)
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            if HAS_DROPOUT:
                keep = dropout_keep(seed, rng_offset, bh, rows, cols, seqlen_q, seqlen_kv, dropout_p)
                p_kept = tl.where(keep, p * inv_keep, 0.0)
                dp = tl.where(keep, dp * inv_keep, 0.0)
            else:
                p_kept = p
            dv = tl.dot(tl.trans(p_kept.to(do.dtype)), do, dv, input_precision=DOT_PRECISION)
            ds = p * (dp - delta[:, None])
            if HAS_DBIAS:
                db_ptr = DBIAS + b64 * stride_dbb + h.to(tl.int64) * stride_dbh + rows[:, None] * stride_dbm + cols[None, :]
                tl.store(db_ptr, ds, mask=in_rows[:, None] & (cols[None, :] < len_kv))
            if HAS_SOFTCAP:
                ds = ds * (1.0 - t * t)
            dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk, input_precision=DOT_PRECISION)
            if ATOMIC_DQ:
                dq = tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION) * sm_scale
                dq_ptr = (DQ_ACC + b64 * stride_dqb + h.to(tl.int64) * stride_dqh + (q_start + rows[:, None]) * stride_dqs
                          + offs_dqk[None, :])
                tl.atomic_add(dq_ptr, dq, mask=in_rows[:, None] & (offs_dqk[None, :] < HEAD_QK), sem="relaxed")
    dk = dk * sm_scale
    in_cols = cols[:, None] < len_kv
    dk_base = DK + b64 * stride_dkb + h_kv.to(tl.int64) * stride_dkh + k_start * stride_dks
    dv_base = DV + b64 * stride_dvb + h_kv.to(tl.int64) * stride_dvh + k_start * stride_dvs
    tl.store(dk_base + cols[:, None] * stride_dks + offs_dqk[None, :], dk.to(DK.dtype.element_ty),
             mask=in_cols & (offs_dqk[None, :] < HEAD_QK))
    tl.store(dv_base + cols[:, None] * stride_dvs + offs_dv[None, :], dv.to(DV.dtype.element_ty),
             mask=in_cols & (offs_dv[None, :] < HEAD_V))


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
    b64 = b.to(tl.int64)
    h_kv = h // group
    rows = m0 + tl.arange(0, BLOCK_M)
    in_rows = rows < len_q
    offs_n = tl.arange(0, BLOCK_N)
    offs_dqk = tl.arange(0, BLOCK_QK)
    offs_dv = tl.arange(0, BLOCK_V)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + q_start * stride_qs
    do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh + q_start * stride_dos
    k_base = K + b64 * stride_kb + h_kv.to(tl.int64) * stride_kh + k_start * stride_ks
    v_base = V + b64 * stride_vb + h_kv.to(tl.int64) * stride_vh + k_start * stride_vs
    bias_base = BIAS + b64 * stride_bb + h.to(tl.int64) * stride_bh
    mask_base = MASK + b64 * stride_mb + h.to(tl.int64) * stride_mh
    l_base = b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start
    q = tl.load(q_base + rows[:, None] * stride_qs + offs_dqk[None, :],
                mask=in_rows[:, None] & (offs_dqk[None, :] < HEAD_QK), other=0.0)
    do = tl.load(do_base + rows[:, None] * stride_dos + offs_dv[None, :],
                 mask=in_rows[:, None] & (offs_dv[None, :] < HEAD_V), other=0.0)
    lse = tl.load(LSE + l_base + rows, mask=in_rows, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(DELTA + l_base + rows, mask=in_rows, other=0.0)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + b * stride_sb + h * stride_sh).to(tl.float32)
    band_offset = bottom_right * (len_kv - len_q)
    alibi_offset = len_kv - len_q
    last_row = tl.minimum(m0 + BLOCK_M, len_q) - 1
    lo, hi, _, _ = key_range(m0, last_row, band_offset, window_left, window_right, len_kv, BLOCK_N)
    bh = b * heads_q + h
    inv_keep = 1.0 / (1.0 - dropout_p)
    dq = tl.zeros([BLOCK_M, BLOCK_QK], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        in_cols = cols < len_kv
        k = tl.load(k_base + cols[:, None] * stride_ks + offs_dqk[None, :],
                    mask=in_cols[:, None] & (offs_dqk[None, :] < HEAD_QK), other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vs + offs_dv[None, :],
                    mask=in_cols[:, None] & (offs_dv[None, :] < HEAD_V), other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        x, t = block_scores(qk, rows, cols, len_q, len_kv, band_offset, alibi_offset, window_left, window_right,
                            sm_scale, softcap, slope, bias_base, stride_bm, stride_bn, mask_base, stride_mm,
                            stride_mn, True, HAS_BAND, USER_MASK, HAS_BIAS, HAS_ALIBI, HAS_SOFTCAP)
        p = tl.math.exp2((x - lse[:, None]) * LOG2E)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, rng_offset, bh, rows, cols, seqlen_q, seqlen_kv, dropout_p)
            dp = tl.where(keep, dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_DBIAS:
            db_ptr = DBIAS + b64 * stride_dbb + h.to(tl.int64) * stride_dbh + rows[:, None] * stride_dbm + cols[None, :]
            tl.store(db_ptr, ds, mask=in_rows[:, None] & in_cols[None, :])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    dq = dq * sm_scale
    dq_base = DQ + b64 * stride_dqb + h.to(tl.int64) * stride_dqh + q_start * stride_dqs
    tl.store(dq_base + rows[:, None] * stride_dqs + offs_dqk[None, :], dq.to(DQ.dtype.element_ty),
             mask=in_rows[:, None] & (offs_dqk[None, :] < HEAD_QK))


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
