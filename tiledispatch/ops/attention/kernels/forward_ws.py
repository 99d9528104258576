"""Family `fwd-ws`: the Hopper forward, warp-specialised, written in Gluon.

Triton's compiler does not specialise warps on Hopper (3.6: `warp_specialize` deadlocked or
was a no-op; see forward_tma.py), nor let the tensor cores work through the softmax. Gluon
states both by hand, as FlashAttention-3 does. A program owns 128 query rows of one head:
  - a loader warp brings Q, then K and V blocks through TMA into two rings of STAGES buffers,
    each with a `ready` barrier (its copy landed) and an `empty` one (both warpgroups are done);
  - two MMA warpgroups, 64 rows each, are partitions of their own. In one partition of 8 warps,
    every barrier arrival (one thread's) first synchronised all 8 warps, so the two ran in
    lockstep; as two partitions each synchronises its own 4;
  - each step issues block j's Q K^T, then block j-1's P V, and runs block j's softmax while
    that P V is on the tensor cores (`_blocks`); P stays in registers as P V's A operand.
    No MMA is in flight across steps: with one (block j+1's Q K^T issued before block j's
    softmax) ptxas serialised every wgmma of the kernel (its warning C7514), and the family
    ran 0.90-0.99x fwd-tma instead of 1.26-1.47x.
Timed in turns on the H100 (benchmarks/studies/attention_forward_ab.py) at d=128 it runs 1.0-1.16x
cuDNN on S >= 4096 and 0.84-0.89x at S1024, where a program's first and last blocks (no
overlap) weigh more; at d=64 about fwd-tma's speed; at d=256 1.26-1.49x fwd-tma. A
persistent grid (a program taking tiles in turn, the next tile's keys loaded under this
one's epilogue) gained 1-10 % on S1024 and d=64 and lost 3-5 % on causal bands, whose
uneven tiles the hardware's dynamic block order balances better; it was not kept.

Causal or window bands, soft-cap, sinks and GQA, half inputs, head dims 64, 128 and 256; no
bias, mask tensor, ALiBi, dropout, varlen (the fwd family takes those) or fp8 (fwd-tma).
Descriptors are 4-D (batch, heads, seq, d) as in fwd-tma, so BHSD and BSHD both fit, and the
copy engine clips each head's sequence: rows past it read as zeros and are never stored. The
key range and its unmasked interior come from `scores.key_range`; the interior runs first.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .scores import LN2, LOG2E, key_range

_key_range = gluon.jit(key_range.fn)  # the same bounds as every other forward, compiled by Gluon


@gluon.jit
def _load_blocks(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, b, h_kv, start, end, count):
    """K and V blocks [start, end) into the rings, each once both warpgroups are done with its buffer."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    n = gl.maximum(gl.cdiv(end - start, BLOCK_N), 0)
    for j in range(n):
        s = (count + j) % STAGES
        phase = (((count + j) // STAGES) & 1) ^ 1  # a fresh barrier reads as if phase 1 were done
        mbarrier.wait(k_empty.index(s), phase)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, h_kv, start + j * BLOCK_N, 0], k_ready.index(s), k_bufs.index(s))
        mbarrier.wait(v_empty.index(s), phase)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, h_kv, start + j * BLOCK_N, 0], v_ready.index(s), v_bufs.index(s))
    return count + n


@gluon.jit
def _capped(qk, cap_scale, cap_log2):
    """Soft-capped scores in log2 units: cap * tanh(qk * scale / cap) * log2(e), by the hardware's
    tanh (tanh.approx.f32, as scores.soft_cap compiles it)."""
    t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [qk * cap_scale], dtype=gl.float32,
                                  is_pure=True, pack=1)
    return t * cap_log2


@gluon.jit
def _softmax(qk, m_i, l_i, cols, rows, scoring, dtype: gl.constexpr, p_layout: gl.constexpr, MASKED: gl.constexpr):
    """The online-softmax step of one block (its keys at `cols`): P (in P V's operand layout), the
    rescale, m and l.

    The feature flags cannot reach the partitions as constants (`warp_specialize` passes its
    workers values), so the soft-cap is a branch a block, and a masked block applies the
    sequence end and the band whatever the problem (an unbounded window admits every key) and
    guards rows that have seen no key yet. Only the band's edge blocks and the last block are
    masked."""
    band_offset, len_kv, window_left, window_right, qk_scale, cap_scale, cap_log2, capped = scoring
    if MASKED:
        if capped != 0:
            s = _capped(qk, cap_scale, cap_log2)
        else:
            s = qk * qk_scale
        diagonal = rows[:, None] + band_offset
        visible = ((cols[None, :] < len_kv) & (cols[None, :] >= diagonal - window_left)
                   & (cols[None, :] <= diagonal + window_right))
        s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # shift a row with no key yet by 0, not -inf
        p = gl.exp2(s - m_shift[:, None])
    else:  # the interior runs first and every row sees all its keys: m is finite from its first block on
        if capped != 0:
            s = _capped(qk, cap_scale, cap_log2)
            m_new = gl.maximum(m_i, gl.max(s, 1))
            p = gl.exp2(s - m_new[:, None])
        else:  # qk_scale >= 0 (the plan sees to it): rowmax(qk) * c is rowmax(qk * c), and qk * c - m one FMA
            m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
            p = gl.exp2(qk * qk_scale - m_new[:, None])
        m_shift = m_new
    alpha = gl.exp2(m_i - m_shift)
    l_i = l_i * alpha + gl.sum(p, 1)
    return gl.convert_layout(p.to(dtype), p_layout), alpha, m_new, l_i


@gluon.jit
def _blocks(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i, start, end, count, rows, scoring,
            s_layout: gl.constexpr, p_layout: gl.constexpr, MASKED: gl.constexpr):
    """Key blocks [start, end) of one warpgroup. Each step issues block j's Q K^T and then block
    j-1's P V, and runs block j's softmax while that P V is on the tensor cores. Nothing is in
    flight across steps: ptxas serialises every wgmma of a kernel that reads an accumulator while
    an MMA from an earlier iteration may still write one (its warning C7514). `count` numbers the
    rings' buffers."""
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    HEAD: gl.constexpr = k_bufs.type.shape[4]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q.type.shape[0]
    row_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    offs_n = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    n = gl.maximum(gl.cdiv(end - start, BLOCK_N), 0)
    if n > 0:
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        st = count % STAGES
        mbarrier.wait(k_ready.index(st), (count // STAGES) & 1)
        qk = warpgroup_mma(q, k_bufs.index(st).reshape([BLOCK_N, HEAD]).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        qk = warpgroup_mma_wait(0, deps=[qk])
        mbarrier.arrive(k_empty.index(st))
        p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, start + offs_n, rows, scoring, q.dtype, p_layout, MASKED)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        for j in range(1, n):
            st = (count + j) % STAGES
            prev = (count + j - 1) % STAGES
            mbarrier.wait(k_ready.index(st), ((count + j) // STAGES) & 1)
            qk = warpgroup_mma(q, k_bufs.index(st).reshape([BLOCK_N, HEAD]).permute((1, 0)), s_zero,
                               use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), ((count + j - 1) // STAGES) & 1)
            pv = warpgroup_mma(p, v_bufs.index(prev).reshape([BLOCK_N, HEAD]), acc, is_async=True)
            qk = warpgroup_mma_wait(1, deps=[qk])  # issued first, so done first
            mbarrier.arrive(k_empty.index(st))
            p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, start + j * BLOCK_N + offs_n, rows, scoring, q.dtype,
                                          p_layout, MASKED)
            acc = warpgroup_mma_wait(0, deps=[pv])
            mbarrier.arrive(v_empty.index(prev))
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        last = (count + n - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((count + n - 1) // STAGES) & 1)
        acc = warpgroup_mma(p, v_bufs.index(last).reshape([BLOCK_N, HEAD]), acc)
        mbarrier.arrive(v_empty.index(last))
    return acc, m_i, l_i, count + n


@gluon.jit
def _warpgroup(which: gl.constexpr, o_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, LSE,
               lse_base, SINKS, h, b, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, has_sinks):
    """One MMA warpgroup's 64 query rows: the interior key blocks, then the masked ones at the band's
    edges; O and the LSE."""
    ROWS: gl.constexpr = q_bufs.type.shape[3]
    HEAD_QK: gl.constexpr = q_bufs.type.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    HEAD_V: gl.constexpr = v_bufs.type.shape[4]
    k_width: gl.constexpr = 32 // q_bufs.dtype.primitive_bitwidth
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_V, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=k_width)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    first = m0 + which * ROWS
    rows = first + gl.arange(0, ROWS, row_s)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([ROWS], gl.float32, row_s)
    if has_sinks != 0:  # the sink is one more logit in every row: start the running max and sum with it
        m_i = gl.full([ROWS], 1.0, gl.float32, row_s) * (gl.load(SINKS + h).to(gl.float32) * LOG2E)
        l_i = gl.full([ROWS], 1.0, gl.float32, row_s)
    acc = gl.zeros([ROWS, HEAD_V], gl.float32, o_layout)
    q_smem = q_bufs.index(which)
    q = q_smem.reshape([ROWS, HEAD_QK])
    mbarrier.wait(q_bar, 0)
    acc, m_i, l_i, count = _blocks(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i,
                                   full_lo, full_hi, 0, rows, scoring, s_layout, p_layout, False)
    acc, m_i, l_i, count = _blocks(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i,
                                   lo, full_lo, count, rows, scoring, s_layout, p_layout, True)
    acc, m_i, l_i, count = _blocks(q, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i,
                                   full_hi, hi, count, rows, scoring, s_layout, p_layout, True)
    empty = l_i == 0.0  # a row that saw no key: output 0, LSE -inf
    l_norm = gl.where(empty, 1.0, l_i)
    gl.store(LSE + lse_base + rows, gl.where(empty, float("-inf"), (m_i + gl.log2(l_norm)) * LN2),
             mask=rows < seqlen_q)
    out = acc / gl.convert_layout(l_norm, gl.SliceLayout(1, o_layout))[:, None]
    q.store(out.to(q_bufs.dtype))  # Q is read no more: its buffer stages O for the TMA store (HEAD_QK == HEAD_V)
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, first, 0], q_smem)
    tma.store_wait(0)


# Every partition takes the same arguments (Gluon asks it of the workers); each uses its share.
@gluon.jit
def _first_rows(q_desc, k_desc, v_desc, o_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty,
                LSE, lse_base, SINKS, b, h, h_kv, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, has_sinks):
    _warpgroup(0, o_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, LSE, lse_base, SINKS, h,
               b, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, has_sinks)


@gluon.jit
def _second_rows(q_desc, k_desc, v_desc, o_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty,
                 LSE, lse_base, SINKS, b, h, h_kv, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, has_sinks):
    _warpgroup(1, o_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, LSE, lse_base, SINKS, h,
               b, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, has_sinks)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, o_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty,
            LSE, lse_base, SINKS, b, h, h_kv, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, has_sinks):
    """The loader warp: both warpgroups' Q, then the key blocks in the order they take them."""
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, m0, 0], q_bar, q_bufs.index(0))
    tma.async_copy_global_to_shared(q_desc, [b, h, m0 + ROWS, 0], q_bar, q_bufs.index(1))
    count = _load_blocks(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, b, h_kv,
                         full_lo, full_hi, 0)
    count = _load_blocks(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, b, h_kv,
                         lo, full_lo, count)
    _load_blocks(k_desc, v_desc, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, b, h_kv, full_hi, hi, count)


@gluon.jit
def attention_fwd_ws(q_desc, k_desc, v_desc, o_desc, LSE, SINKS, stride_lb, stride_lh, seqlen_q, seqlen_kv, group,
                     sm_scale, softcap, bottom_right, window_left, window_right,
                     HAS_BAND: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_SINKS: gl.constexpr,
                     STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = 2 * q_desc.block_type.shape[2]  # two warpgroups' rows
    pid_m = gl.program_id(0)
    h = gl.program_id(1)
    b = gl.program_id(2)
    if HAS_BAND:  # the longest rows of a causal band first: the last wave is then the short ones
        pid_m = gl.cdiv(seqlen_q, BLOCK_M) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    band_offset = bottom_right * (seqlen_kv - seqlen_q)
    last_row = gl.minimum(m0 + BLOCK_M, seqlen_q) - 1
    lo, hi, full_lo, full_hi = _key_range(m0, last_row, band_offset, window_left, window_right, seqlen_kv,
                                          k_desc.block_type.shape[2])
    lse_base = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival from each warpgroup
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    # (band offset, keys, window, log2 scale, soft-cap's scale and log2 cap, capped?): the flags go
    # as values, which is all warp_specialize can pass its workers.
    scoring = (band_offset, seqlen_kv, window_left, window_right, sm_scale * LOG2E, sm_scale / softcap,
               softcap * LOG2E, 1 if HAS_SOFTCAP else 0)
    args = (q_desc, k_desc, v_desc, o_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, LSE,
            lse_base, SINKS, b, h, h // group, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, 1 if HAS_SINKS else 0)
    # The warpgroups are partitions of their own, so neither waits on the other's barriers.
    gl.warp_specialize([(_first_rows, args), (_second_rows, args), (_loader, args)], [4, 1], [240, 24])
