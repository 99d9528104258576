"""What the forward and both backward kernels share: the score of a block, and dropout.

A score goes through the same steps everywhere, in this order, so that the backward
recomputes exactly what the forward saw:
    x = scale * q.k;  x = cap * tanh(x / cap);  x += bias + additive mask + ALiBi;
    x = -inf where the key is outside the sequence, outside the band, or masked out.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E): exp2 is one instruction
LN2 = tl.constexpr(0.6931471805599453)
# What the host passes for an unbounded side of the band: far beyond any sequence length.
UNBOUNDED = 1 << 30

USER_MASK_NONE = tl.constexpr(0)
USER_MASK_BOOL = tl.constexpr(1)
USER_MASK_ADDITIVE = tl.constexpr(2)


@triton.jit
def block_scores(qk, rows, cols, len_q, len_kv, band_offset, alibi_offset, window_left, window_right,
                 sm_scale, softcap, slope, bias_base, stride_bm, stride_bn, mask_base, stride_mm, stride_mn,
                 MASKED: tl.constexpr, HAS_BAND: tl.constexpr, USER_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
                 HAS_ALIBI: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """Scores (fp32, natural units) of a BLOCK_M x BLOCK_N block, and tanh of the soft-cap (for its gradient).

    MASKED: the block may hold keys past the sequence or outside the band; blocks proven
    inside both skip those comparisons.
    """
    x = qk * sm_scale
    t = x
    if HAS_SOFTCAP:
        t = 2.0 * tl.sigmoid(2.0 * x / softcap) - 1.0  # tanh, from a primitive every backend has
        x = softcap * t
    inside = (rows[:, None] < len_q) & (cols[None, :] < len_kv)
    if HAS_BIAS:
        bias = tl.load(bias_base + rows[:, None] * stride_bm + cols[None, :] * stride_bn, mask=inside, other=0.0)
        x += bias.to(tl.float32)
    if USER_MASK == USER_MASK_ADDITIVE:
        extra = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn, mask=inside, other=0.0)
        x += extra.to(tl.float32)
    if HAS_ALIBI:
        distance = tl.abs(rows[:, None] + alibi_offset - cols[None, :]).to(tl.float32)
        x -= slope * distance
    if USER_MASK == USER_MASK_BOOL:
        keep = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn, mask=inside, other=0)
        x = tl.where(keep != 0, x, float("-inf"))
    if MASKED:
        visible = cols[None, :] < len_kv
        if HAS_BAND:
            diagonal = rows[:, None] + band_offset
            visible = visible & (cols[None, :] >= diagonal - window_left) & (cols[None, :] <= diagonal + window_right)
        x = tl.where(visible, x, float("-inf"))
    return x, t


@triton.jit
def dropout_keep(seed, rng_offset, bh, rows, cols, seqlen_q, seqlen_kv, dropout_p):
    """Which (query, key) pairs dropout keeps: Philox on a counter unique to (batch, head, i, j).

    The forward and the backward call this with the same seed and offset, so they drop
    the same pairs; so does `dropout_mask` (for tests and users who want to see the mask).
    """
    counter = (bh.to(tl.int64) * seqlen_q + rows[:, None]) * seqlen_kv + cols[None, :] + rng_offset
    return tl.rand(seed, counter) >= dropout_p


@triton.jit
def key_range(m0, last_row, band_offset, window_left, window_right, len_kv, BLOCK_N: tl.constexpr):
    """Keys that rows [m0, last_row] of a query block may see: [lo, hi), and the whole key blocks
    [full_lo, full_hi) that every one of them sees (no position mask needed there)."""
    lo = tl.maximum(m0 + band_offset - window_left, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(tl.maximum(last_row + band_offset + window_right + 1, 0), len_kv)
    full_lo = tl.cdiv(tl.maximum(last_row + band_offset - window_left, 0), BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), tl.maximum(hi, lo))
    full_hi = tl.minimum(tl.maximum(m0 + band_offset + window_right + 1, 0), len_kv) // BLOCK_N * BLOCK_N
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, hi, full_lo, full_hi


@triton.jit
def dropout_mask(KEEP, seed, rng_offset, heads, seqlen_q, seqlen_kv, dropout_p,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keep mask (batch, heads, seqlen_q, seqlen_kv) as uint8, exactly as the kernels draw it."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    for start_n in range(0, seqlen_kv, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        keep = dropout_keep(seed, rng_offset, bh, rows, cols, seqlen_q, seqlen_kv, dropout_p)
        where = KEEP + (bh.to(tl.int64) * seqlen_q + rows[:, None]) * seqlen_kv + cols[None, :]
        tl.store(where, keep.to(tl.uint8), mask=(rows[:, None] < seqlen_q) & (cols[None, :] < seqlen_kv))
