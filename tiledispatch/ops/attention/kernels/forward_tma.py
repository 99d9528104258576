"""Family `fwd-tma`: the Hopper forward, Q/K/V moved by the tensor memory accelerator.

The common case only: causal or window bands, soft-cap, sinks and GQA; no bias, mask
tensor, ALiBi, dropout or varlen (the `fwd` family takes those). Each operand is a
4-D descriptor (batch, heads, seq, d) built on the host from the tensor's own strides,
so BHSD and BSHD storage both fit, and the copy engine clips the sequence's ends: a
tile never reads another head's rows and no thread computes an address or a mask.

Program (pid_m, h, b) owns BLOCK_M query rows; the key loop runs in three parts: the
unmasked interior first, then the masked blocks at the band's start and end. The interior
step is the short one: rowmax(qk) * c, then p = exp2(qk * c - m) as one FMA per score,
where c = scale * log2(e) >= 0 (the plan folds a negative scale into a negated K). O is
stored with plain (vectorised) stores.

fp8 inputs (FP8, e4m3, forward only): Q K^T runs on the fp8 tensor cores, its scale times
the dequantization scales of Q and K (read from SCALE_Q and SCALE_K, so the step takes the
general form: their product's sign is not known on the host); V is widened to fp16, exactly,
and P V runs in fp16 (P in e4m3 would keep 3 bits of each probability); O is scaled by
SCALE_V and stored in the output's dtype (bf16).

A warp-specialised variant of the interior loop (Triton 3.6's `warp_specialize`, family
`fwd-tma-ws`) was tried and deadlocked on the H200, so that family was removed.
"""

import triton
import triton.language as tl

from .scores import LN2, LOG2E, key_range, soft_cap


@triton.jit
def _tma_step(acc, l_i, m_i, q, k_desc, v_desc, b, h_kv, start_n, rows, offs_n, band_offset, len_kv,
              window_left, window_right, qk_scale, sm_scale, softcap,
              BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr, MASKED: tl.constexpr,
              GUARD_ROWS: tl.constexpr, HAS_BAND: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FP8: tl.constexpr):
    """One key block: scores, the online-softmax update, and P V into the accumulator."""
    k = k_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_QK)
    qk = tl.dot(q, k.T)
    if HAS_SOFTCAP or MASKED or FP8:
        if HAS_SOFTCAP:
            x = qk * sm_scale
            x, _ = soft_cap(x, softcap, HAS_SOFTCAP)
            s = x * LOG2E
        else:
            s = qk * qk_scale
        if MASKED:
            cols = start_n + offs_n
            visible = cols[None, :] < len_kv
            if HAS_BAND:
                diagonal = rows[:, None] + band_offset
                visible = visible & (cols[None, :] >= diagonal - window_left) \
                    & (cols[None, :] <= diagonal + window_right)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_shift = m_new
        if GUARD_ROWS:  # a row that has seen no key yet keeps m = -inf: shift by 0, not by -inf
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_shift[:, None])
    else:  # c >= 0, so rowmax(qk) * c is rowmax(qk * c), and qk * c - m is one FMA
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_shift = m_new
        if GUARD_ROWS:
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk * qk_scale - m_shift[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = v_desc.load([b, h_kv, start_n, 0]).reshape(BLOCK_N, HEAD_V)
    if FP8:
        v = v.to(tl.float16)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _tma_steps(acc, l_i, m_i, q, k_desc, v_desc, b, h_kv, start, end, rows, offs_n, band_offset, len_kv,
               window_left, window_right, qk_scale, sm_scale, softcap,
               BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr, MASKED: tl.constexpr,
               GUARD_ROWS: tl.constexpr, HAS_BAND: tl.constexpr, HAS_SOFTCAP: tl.constexpr, FP8: tl.constexpr):
    for start_n in tl.range(start, end, BLOCK_N):
        acc, l_i, m_i = _tma_step(acc, l_i, m_i, q, k_desc, v_desc, b, h_kv, start_n, rows, offs_n, band_offset,
                                  len_kv, window_left, window_right, qk_scale, sm_scale, softcap, BLOCK_N, HEAD_QK,
                                  HEAD_V, MASKED, GUARD_ROWS, HAS_BAND, HAS_SOFTCAP, FP8)
    return acc, l_i, m_i


@triton.jit
def attention_fwd_tma(q_desc, k_desc, v_desc, O, LSE, SINKS, SCALE_Q, SCALE_K, SCALE_V,
                      stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                      seqlen_q, seqlen_kv, group, sm_scale, softcap, bottom_right, window_left, window_right,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_QK: tl.constexpr, HEAD_V: tl.constexpr,
                      HAS_BAND: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
                      MASKS_ROWS: tl.constexpr, FP8: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    if HAS_BAND:  # the longest rows of a causal band first: the last wave is then the short ones
        pid_m = tl.cdiv(seqlen_q, BLOCK_M) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    h_kv = h // group
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = q_desc.load([b, h, m0, 0]).reshape(BLOCK_M, HEAD_QK)
    if FP8:  # the scores are q.k times both dequantization scales
        sm_scale = sm_scale * tl.load(SCALE_Q) * tl.load(SCALE_K)
    qk_scale = sm_scale * LOG2E

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_SINKS:  # the sink is one more logit in every row: start the running max and sum with it
        m_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32) * (tl.load(SINKS + h).to(tl.float32) * LOG2E)
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_V], dtype=tl.float32)
    band_offset = bottom_right * (seqlen_kv - seqlen_q)
    last_row = tl.minimum(m0 + BLOCK_M, seqlen_q) - 1
    lo, hi, full_lo, full_hi = key_range(m0, last_row, band_offset, window_left, window_right, seqlen_kv, BLOCK_N)

    # The interior first (every row sees every key there: no mask, no guard), then the edges.
    acc, l_i, m_i = _tma_steps(acc, l_i, m_i, q, k_desc, v_desc, b, h_kv, full_lo, full_hi, rows, offs_n,
                               band_offset, seqlen_kv, window_left, window_right, qk_scale, sm_scale, softcap,
                               BLOCK_N, HEAD_QK, HEAD_V, False, False, HAS_BAND, HAS_SOFTCAP, FP8)
    acc, l_i, m_i = _tma_steps(acc, l_i, m_i, q, k_desc, v_desc, b, h_kv, lo, full_lo, rows, offs_n,
                               band_offset, seqlen_kv, window_left, window_right, qk_scale, sm_scale, softcap,
                               BLOCK_N, HEAD_QK, HEAD_V, True, MASKS_ROWS, HAS_BAND, HAS_SOFTCAP, FP8)
    acc, l_i, m_i = _tma_steps(acc, l_i, m_i, q, k_desc, v_desc, b, h_kv, full_hi, hi, rows, offs_n,
                               band_offset, seqlen_kv, window_left, window_right, qk_scale, sm_scale, softcap,
                               BLOCK_N, HEAD_QK, HEAD_V, True, MASKS_ROWS, HAS_BAND, HAS_SOFTCAP, FP8)

    empty = l_i == 0.0  # a row that saw no key: output 0, LSE -inf
    l_norm = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_norm)) * LN2)
    out = acc / l_norm[:, None]
    if FP8:
        out = out * tl.load(SCALE_V)
    b64 = b.to(tl.int64)
    offs_v = tl.arange(0, HEAD_V)
    o_ptrs = O + b64 * stride_ob + h.to(tl.int64) * stride_oh + rows[:, None] * stride_os + offs_v[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=rows[:, None] < seqlen_q)
    lse_base = LSE + b64 * stride_lb + h.to(tl.int64) * stride_lh
    tl.store(lse_base + rows, lse, mask=rows < seqlen_q)
