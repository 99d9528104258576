"""Family `fwd`: the online-softmax forward (FlashAttention-2 order), pointer loads, any strides.

Program (pid_m, h, b) computes BLOCK_M query rows of head h of sequence b against every
key block the mask lets it see, in three runs: the key blocks at the start of its band
(masked), the blocks every row sees in full (no position mask, no row mask, no head-dim
mask when the head dim is a power of two: plain 16-byte loads), the blocks at the end
(masked). It writes O and the natural-log LSE, which the backward reads.

Without score features (soft-cap, bias, mask tensors, ALiBi) a full block's softmax is the
short one: rowmax(qk) * c, then p = exp2(qk * c - m), one FMA a score, with c = scale *
log2(e) >= 0 (the plan moves a negative scale into a negated K).
"""

import triton
import triton.language as tl

from .scores import LN2, LOG2E, block_scores, dropout_keep, key_range, load_tile, plain_scores, store_tile


@triton.jit
def _steps(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, start, end, rows, offs_n, offs_dqk, offs_dv,
           len_q, len_kv, band_offset, alibi_offset, window_left, window_right, sm_scale, qk_scale, softcap, slope,
           bias_base, stride_bm, stride_bn, mask_base, stride_mm, stride_mn,
           bh, seqlen_q, seqlen_kv, dropout_p, seed, rng_offset,
           BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr, BLOCK_QK: tl.constexpr,
           BLOCK_V: tl.constexpr, MASKED: tl.constexpr, GUARD_ROWS: tl.constexpr, PLAIN: tl.constexpr,
           HAS_BAND: tl.constexpr, USER_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr,
           HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_base, cols, stride_ks, offs_dqk, len_kv, HEAD_QK, BLOCK_QK, MASKED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if PLAIN and not MASKED:  # c >= 0 (the plan sees to it): rowmax(qk) * c, and qk * c - m as one FMA
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = m_new
            if GUARD_ROWS:
                m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(qk * qk_scale - m_shift[:, None])
        else:
            if PLAIN:
                s = plain_scores(qk, rows[:, None], cols[None, :], len_kv, band_offset, window_left, window_right, qk_scale, MASKED,
                                 HAS_BAND)
            else:
                x, _ = block_scores(qk, rows[:, None], cols[None, :], len_q, len_kv, band_offset, alibi_offset, window_left,
                                    window_right, sm_scale, softcap, slope, bias_base, stride_bm, stride_bn, mask_base,
                                    stride_mm, stride_mn, MASKED, HAS_BAND, USER_MASK, HAS_BIAS, HAS_ALIBI,
                                    HAS_SOFTCAP)
                s = x * LOG2E
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_shift = m_new
            if GUARD_ROWS:  # a row that has seen no key yet keeps m = -inf: shift by 0, not by -inf
                m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_shift[:, None])
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            keep = dropout_keep(seed, rng_offset, bh, rows[:, None], cols[None, :], seqlen_q, seqlen_kv, dropout_p)
            p = tl.where(keep, p, 0.0)  # the 1 / (1 - p) rescale is applied once, at the end
        v = load_tile(v_base, cols, stride_vs, offs_dv, len_kv, HEAD_V, BLOCK_V, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attention_fwd(Q, K, V, O, LSE, BIAS, MASK, SLOPES, SINKS, CU_Q, CU_K,
                  stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                  stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                  stride_bb, stride_bh, stride_bm, stride_bn, stride_mb, stride_mh, stride_mm, stride_mn,
                  stride_sb, stride_sh,
                  seqlen_q, seqlen_kv, heads_q, group, sm_scale, softcap, bottom_right, window_left, window_right,
                  dropout_p, seed, rng_offset,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr,
                  BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr, HAS_BAND: tl.constexpr, USER_MASK: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                  HAS_SINKS: tl.constexpr, HAS_DROPOUT: tl.constexpr, VARLEN: tl.constexpr,
                  MASKS_ROWS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    if VARLEN:
        q_start = tl.load(CU_Q + b)
        len_q = tl.load(CU_Q + b + 1) - q_start
        k_start = tl.load(CU_K + b)
        len_kv = tl.load(CU_K + b + 1) - k_start
        q_start = q_start.to(tl.int64)  # token offsets: 64-bit before they meet a stride
        k_start = k_start.to(tl.int64)
    else:
        q_start = 0
        k_start = 0
        len_q = seqlen_q
        len_kv = seqlen_kv
    if HAS_BAND:  # the longest rows of a causal band first: the last wave is then the short ones
        pid_m = tl.cdiv(seqlen_q, BLOCK_M) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    if m0 >= len_q:
        return
    h_kv = h // group
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + q_start * stride_qs
    k_base = K + b64 * stride_kb + h_kv.to(tl.int64) * stride_kh + k_start * stride_ks
    v_base = V + b64 * stride_vb + h_kv.to(tl.int64) * stride_vh + k_start * stride_vs
    bias_base = BIAS + b64 * stride_bb + h.to(tl.int64) * stride_bh
    mask_base = MASK + b64 * stride_mb + h.to(tl.int64) * stride_mh

    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dqk = tl.arange(0, BLOCK_QK)
    offs_dv = tl.arange(0, BLOCK_V)
    q = load_tile(q_base, rows, stride_qs, offs_dqk, len_q, HEAD_QK, BLOCK_QK, True)
    qk_scale = sm_scale * LOG2E
    PLAIN: tl.constexpr = USER_MASK == 0 and not HAS_BIAS and not HAS_ALIBI and not HAS_SOFTCAP

    band_offset = bottom_right * (len_kv - len_q)
    alibi_offset = len_kv - len_q
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + b * stride_sb + h * stride_sh).to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_SINKS:  # the sink is one more logit in every row: start the running max and sum with it
        m_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32) * (tl.load(SINKS + h).to(tl.float32) * LOG2E)
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    bh = b * heads_q + h
    last_row = tl.minimum(m0 + BLOCK_M, len_q) - 1
    lo, hi, full_lo, full_hi = key_range(m0, last_row, band_offset, window_left, window_right, len_kv, BLOCK_N)

    runs = ((lo, full_lo, True, True), (full_lo, full_hi, False, MASKS_ROWS), (full_hi, hi, True, True))
    for i in tl.static_range(3):  # the band's start (masked), the blocks every row sees in full, its end
        acc, l_i, m_i = _steps(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, runs[i][0], runs[i][1], rows,
                               offs_n, offs_dqk, offs_dv, len_q, len_kv, band_offset, alibi_offset, window_left,
                               window_right, sm_scale, qk_scale, softcap, slope, bias_base, stride_bm, stride_bn,
                               mask_base, stride_mm, stride_mn, bh, seqlen_q, seqlen_kv, dropout_p, seed, rng_offset,
                               BLOCK_N, HEAD_QK, HEAD_V, BLOCK_QK, BLOCK_V, runs[i][2], runs[i][3], PLAIN, HAS_BAND,
                               USER_MASK, HAS_BIAS, HAS_ALIBI, HAS_SOFTCAP, HAS_DROPOUT, DOT_PRECISION)

    empty = l_i == 0.0  # a row that saw no key: output 0, LSE -inf
    l_norm = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_norm)) * LN2)
    if HAS_DROPOUT:
        l_norm = l_norm * (1.0 - dropout_p)
    out = acc / l_norm[:, None]
    o_base = O + b64 * stride_ob + h.to(tl.int64) * stride_oh + q_start * stride_os
    store_tile(o_base, rows, stride_os, offs_dv, len_q, out.to(O.dtype.element_ty), HEAD_V, BLOCK_V)
    lse_base = LSE + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start
    tl.store(lse_base + rows, lse, mask=rows < len_q)
