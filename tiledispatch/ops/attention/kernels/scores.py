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

# HAS_SOFTCAP: 0 without a soft-cap, else how its tanh is computed (plan.softcap_code picks).
SOFTCAP_PORTABLE = tl.constexpr(1)  # from sigmoid: what the interpreter can run
SOFTCAP_MUFU = tl.constexpr(2)  # tanh.approx.f32, one special-function instruction (compiled code)


@triton.jit
def soft_cap(x, softcap, HOW: tl.constexpr):
    """(cap * tanh(x / cap), tanh(x / cap)): the capped score and the tanh its gradient needs.

    Compiled code takes the hardware tanh (tanh.approx.f32, max relative error 2^-11, as
    FlashAttention's soft-cap does): the sigmoid form spends an exp and two IEEE divisions a
    score on the special-function unit, which the exp2 of the softmax already keeps busy.
    Inline PTX cannot run under the interpreter, which gets the sigmoid form.
    """
    y = x * (1.0 / softcap)
    if HOW == SOFTCAP_MUFU:
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [y], dtype=tl.float32, is_pure=True, pack=1)
    else:
        t = 2.0 * tl.sigmoid(2.0 * y) - 1.0
    return softcap * t, t


@triton.jit
def load_tile(base, rows, stride, offs_d, n_rows, HEAD: tl.constexpr, BLOCK_D: tl.constexpr,
              CHECK_ROWS: tl.constexpr):
    """A (rows, BLOCK_D) tile of a row-major operand, zeros outside.

    Masks only what can be outside: rows when CHECK_ROWS, the head dim when it is padded
    (BLOCK_D > HEAD). Unmasked loads of aligned operands become 16-byte vector copies.
    """
    ptrs = base + rows[:, None] * stride + offs_d[None, :]
    if CHECK_ROWS:
        if BLOCK_D == HEAD:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD), other=0.0)
    else:
        if BLOCK_D == HEAD:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD, other=0.0)
    return tile


@triton.jit
def store_tile(base, rows, stride, offs_d, n_rows, value, HEAD: tl.constexpr, BLOCK_D: tl.constexpr):
    """Stores a (rows, BLOCK_D) tile, rows < n_rows and the head dim's real columns only."""
    ptrs = base + rows[:, None] * stride + offs_d[None, :]
    if BLOCK_D == HEAD:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)
    else:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD))


@triton.jit
def plain_scores(qk, r, c, len_kv, band_offset, window_left, window_right, qk_scale,
                 MASKED: tl.constexpr, HAS_BAND: tl.constexpr):
    """Scores in log2 units, qk * scale * log2(e), for kernels with none of the score features
    (soft-cap, bias, masks, ALiBi); masked positions -inf."""
    s = qk * qk_scale
    if MASKED:
        s = tl.where(visible_pairs(r, c, len_kv, band_offset, window_left, window_right, HAS_BAND), s, float("-inf"))
    return s


@triton.jit
def block_scores(qk, r, c, len_q, len_kv, band_offset, alibi_offset, window_left, window_right,
                 sm_scale, softcap, slope, bias_base, stride_bm, stride_bn, mask_base, stride_mm, stride_mn,
                 MASKED: tl.constexpr, HAS_BAND: tl.constexpr, USER_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
                 HAS_ALIBI: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """Scores (fp32, natural units) of a block, and tanh of the soft-cap (for its gradient).

    r and c are the query and key indices as 2-D tensors that broadcast to qk's shape:
    (rows[:, None], cols[None, :]) for a query-major block, (rows[None, :], cols[:, None])
    for the backward's key-major one. MASKED: the block may hold keys past the sequence or
    outside the band; blocks proven inside both skip those comparisons.
    """
    x = qk * sm_scale
    t = x
    if HAS_SOFTCAP:
        x, t = soft_cap(x, softcap, HAS_SOFTCAP)
    inside = (r < len_q) & (c < len_kv)
    if HAS_BIAS:
        bias = tl.load(bias_base + r * stride_bm + c * stride_bn, mask=inside, other=0.0)
        x += bias.to(tl.float32)
    if USER_MASK == USER_MASK_ADDITIVE:
        extra = tl.load(mask_base + r * stride_mm + c * stride_mn, mask=inside, other=0.0)
        x += extra.to(tl.float32)
    if HAS_ALIBI:
        distance = tl.abs(r + alibi_offset - c).to(tl.float32)
        x -= slope * distance
    if USER_MASK == USER_MASK_BOOL:
        keep = tl.load(mask_base + r * stride_mm + c * stride_mn, mask=inside, other=0)
        x = tl.where(keep != 0, x, float("-inf"))
    if MASKED:
        x = tl.where(visible_pairs(r, c, len_kv, band_offset, window_left, window_right, HAS_BAND), x, float("-inf"))
    return x, t


@triton.jit
def visible_pairs(r, c, len_kv, band_offset, window_left, window_right, HAS_BAND: tl.constexpr):
    """Which (query r, key c) pairs the position mask keeps: keys inside the sequence and the band."""
    visible = c < len_kv
    if HAS_BAND:
        diagonal = r + band_offset
        visible = visible & (c >= diagonal - window_left) & (c <= diagonal + window_right)
    return visible


@triton.jit
def dropout_keep(seed, rng_offset, bh, r, c, seqlen_q, seqlen_kv, dropout_p):
    """Which (query, key) pairs dropout keeps: Philox on a counter unique to (batch, head, i, j).

    r and c are broadcastable 2-D index tensors, as in `block_scores`. The forward and the
    backward call this with the same seed and offset, so they drop the same pairs; so does
    `dropout_mask` (for tests and users who want to see the mask).
    """
    counter = (bh.to(tl.int64) * seqlen_q + r) * seqlen_kv + c + rng_offset
    return tl.rand(seed, counter) >= dropout_p


@triton.jit
def query_range(n0, last_col, band_offset, window_left, window_right, len_q, BLOCK_M: tl.constexpr):
    """Queries that see keys [n0, last_col] of a key block: [lo, hi), and the whole query blocks
    [full_lo, full_hi) whose every row sees every one of those keys (no position mask needed)."""
    lo = tl.maximum(n0 - band_offset - window_right, 0) // BLOCK_M * BLOCK_M
    hi = tl.minimum(tl.maximum(last_col - band_offset + window_left + 1, 0), len_q)
    full_lo = tl.cdiv(tl.maximum(last_col - band_offset - window_right, 0), BLOCK_M) * BLOCK_M
    full_lo = tl.minimum(tl.maximum(full_lo, lo), tl.maximum(hi, lo))
    full_hi = tl.minimum(tl.maximum(n0 - band_offset + window_left + 1, 0), len_q) // BLOCK_M * BLOCK_M
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, hi, full_lo, full_hi


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
        keep = dropout_keep(seed, rng_offset, bh, rows[:, None], cols[None, :], seqlen_q, seqlen_kv, dropout_p)
        where = KEEP + (bh.to(tl.int64) * seqlen_q + rows[:, None]) * seqlen_kv + cols[None, :]
        tl.store(where, keep.to(tl.uint8), mask=(rows[:, None] < seqlen_q) & (cols[None, :] < seqlen_kv))
