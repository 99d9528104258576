"""Family `bwd-ws`: the Hopper backward, warp-specialised, written in Gluon.

The plan is the `bwd` family's (preprocess, dK/dV, dQ; kernels/backward.py) with both of its
big stages here, laid out as fwd-ws is (kernels/forward_ws.py): a loader warp and two MMA
warpgroups of 64 rows, each a partition of its own, and nothing in flight across blocks
(ptxas serialises the kernel's wgmma otherwise; see forward_ws.py).
  - dK/dV: a program owns 128 keys of one K/V head; the loader brings them once, then streams
    Q and dO blocks (of every query head of the group) through a ring. S^T = K Q^T and
    dP^T = V dO^T are issued together, P^T is formed while dP^T runs, then dV += P^T dO and
    dK += dS^T Q. dK and dV leave through TMA from the buffers K and V came in.
  - dQ: a program owns 128 query rows of one head; the loader brings Q and dO once, then
    streams K and V blocks. S = Q K^T and dP = dO V^T go together, then dQ += dS K; dQ leaves
    from Q's buffer.
Timed in turns on the H100 (benchmarks/studies/attention_backward_ab.py), 32x128 w8 s3 ran 1.24-1.47x
bwd's 64x128 w8 s3 at d=128 with both stages here, against 1.05-1.27x with bwd's dQ stage.

At d=256 the dK/dV stage is kernels/backward_ws_wide.py's (its warpgroups split by role) and
the dQ stage this one, stepping 32 keys. Bands, soft-cap (the hardware tanh, a branch a block
as in fwd-ws), sinks (their gradient comes from the LSE, outside the kernels) and GQA, half
inputs, head dims 64, 128 and 256; no bias, mask tensor, ALiBi, dropout or varlen (the `bwd`
family takes those). At d=128 a soft-capped dK/dV spills 12 bytes and at d=256 a soft-capped
dQ 20 (sm_90 compiles); the plain ones none.
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

from .scores import LOG2E, SOFTCAP_MUFU, key_range, query_range, soft_cap

# The same bounds and soft-cap as the `bwd` family's, compiled by Gluon
_query_range = gluon.jit(query_range.fn)
_key_range = gluon.jit(key_range.fn)
_soft_cap = gluon.jit(soft_cap.fn)


@gluon.jit
def _probabilities(qk, lse2, scoring):
    """P = exp(score - LSE), and P times the slope dS takes back through the soft-cap (1 - tanh^2;
    P itself without one). The cap is a branch a block: flags reach the partitions as values."""
    qk_scale, sm_scale, softcap, capped = scoring[5], scoring[6], scoring[7], scoring[8]
    if capped != 0:
        x, t = _soft_cap(qk * sm_scale, softcap, SOFTCAP_MUFU)
        p = gl.exp2(x * LOG2E - lse2)
        slope_p = p * (1.0 - t * t)
    else:
        p = gl.exp2(qk * qk_scale - lse2)
        slope_p = p
    return p, slope_p


@gluon.jit
def _load_blocks(first_desc, second_desc, first_bufs, second_bufs, ready, empty, b, h, start, end, count):
    """Blocks [start, end) of rows of head h, of two operands (Q and dO, or K and V), into the ring,
    each once both warpgroups are done with its buffer."""
    BLOCK: gl.constexpr = first_desc.block_type.shape[2]
    STAGES: gl.constexpr = first_bufs.type.shape[0]
    n = gl.maximum(gl.cdiv(end - start, BLOCK), 0)
    for j in range(n):
        s = (count + j) % STAGES
        mbarrier.wait(empty.index(s), (((count + j) // STAGES) & 1) ^ 1)  # a fresh barrier reads as phase 1 done
        mbarrier.expect(ready.index(s), first_desc.block_type.nbytes + second_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(first_desc, [b, h, start + j * BLOCK, 0], ready.index(s),
                                        first_bufs.index(s))
        tma.async_copy_global_to_shared(second_desc, [b, h, start + j * BLOCK, 0], ready.index(s),
                                        second_bufs.index(s))
    return count + n


@gluon.jit
def _transposed_probabilities(s_t, lse, rows, cols, scoring, MASKED: gl.constexpr):
    """P^T and P^T times the soft-cap's slope (see _probabilities) of a block of keys `cols` x
    queries `rows`; in a masked block, zero outside the sequence and the band."""
    p_t, slope_p_t = _probabilities(s_t, (lse * LOG2E)[None, :], scoring)
    if MASKED:
        band_offset, len_kv, window_left, window_right = scoring[0], scoring[2], scoring[3], scoring[4]
        diagonal = rows[None, :] + band_offset
        visible = ((cols[:, None] < len_kv) & (cols[:, None] >= diagonal - window_left)
                   & (cols[:, None] <= diagonal + window_right))
        p_t = gl.where(visible, p_t, 0.0)
        slope_p_t = gl.where(visible, slope_p_t, 0.0)
    return p_t, slope_p_t


@gluon.jit
def _query_blocks(k, v, q_bufs, do_bufs, ready, empty, dk, dv, LSE, DELTA, l_base, start, end, count, cols, scoring,
                  st_layout: gl.constexpr, p_layout: gl.constexpr, MASKED: gl.constexpr):
    """dK and dV of one warpgroup's keys over query blocks [start, end) of one head."""
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    HEAD_QK: gl.constexpr = q_bufs.type.shape[4]
    HEAD_V: gl.constexpr = do_bufs.type.shape[4]
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    ROWS: gl.constexpr = k.type.shape[0]
    len_q = scoring[1]
    offs_m = gl.arange(0, BLOCK_M, gl.SliceLayout(0, st_layout))
    zero = gl.zeros([ROWS, BLOCK_M], gl.float32, st_layout)
    n = gl.maximum(gl.cdiv(end - start, BLOCK_M), 0)
    for j in range(n):
        s = (count + j) % STAGES
        mbarrier.wait(ready.index(s), ((count + j) // STAGES) & 1)
        q = q_bufs.index(s).reshape([BLOCK_M, HEAD_QK])
        do = do_bufs.index(s).reshape([BLOCK_M, HEAD_V])
        s_t = warpgroup_mma(k, q.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v, do.permute((1, 0)), zero, use_acc=False, is_async=True)
        rows = start + j * BLOCK_M + offs_m
        if MASKED:  # rows past the sequence, or that saw no key, get LSE +inf: their P is 0
            lse = gl.load(LSE + l_base + rows, mask=rows < len_q, other=float("inf"))
            delta = gl.load(DELTA + l_base + rows, mask=rows < len_q, other=0.0)
            lse = gl.where(lse == float("-inf"), float("inf"), lse)
        else:
            lse = gl.load(LSE + l_base + rows)
            delta = gl.load(DELTA + l_base + rows)
        s_t = warpgroup_mma_wait(1, deps=[s_t])  # issued first, so done first
        p_t, slope_p_t = _transposed_probabilities(s_t, lse, rows, cols, scoring, MASKED)
        dv = warpgroup_mma(gl.convert_layout(p_t.to(q.dtype), p_layout), do, dv, is_async=True)
        dp_t = warpgroup_mma_wait(1, deps=[dp_t])  # issued before dV's
        ds_t = slope_p_t * (dp_t - delta[None, :])
        dk = warpgroup_mma(gl.convert_layout(ds_t.to(q.dtype), p_layout), q, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
        mbarrier.arrive(empty.index(s))
    return dk, dv, count + n


@gluon.jit
def _warpgroup(which: gl.constexpr, dk_desc, dv_desc, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty, LSE,
               DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring):
    """One MMA warpgroup's 64 keys: every query head of the group, the interior query blocks first,
    then the masked ones at the band's edges; then dK (scaled) and dV."""
    ROWS: gl.constexpr = k_bufs.type.shape[3]
    HEAD_QK: gl.constexpr = k_bufs.type.shape[4]
    HEAD_V: gl.constexpr = v_bufs.type.shape[4]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    k_width: gl.constexpr = 32 // k_bufs.dtype.primitive_bitwidth
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    dk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_QK, 16])
    dv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_V, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv_layout, k_width=k_width)
    first = n0 + which * ROWS
    cols = first + gl.arange(0, ROWS, gl.SliceLayout(1, st_layout))
    k_smem = k_bufs.index(which)
    v_smem = v_bufs.index(which)
    k = k_smem.reshape([ROWS, HEAD_QK])
    v = v_smem.reshape([ROWS, HEAD_V])
    dk = gl.zeros([ROWS, HEAD_QK], gl.float32, dk_layout)
    dv = gl.zeros([ROWS, HEAD_V], gl.float32, dv_layout)
    mbarrier.wait(kv_bar, 0)
    count = gl.to_tensor(0)
    for g in range(group):
        h = h_kv * group + g
        l_base = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh
        dk, dv, count = _query_blocks(k, v, q_bufs, do_bufs, ready, empty, dk, dv, LSE, DELTA, l_base, full_lo,
                                      full_hi, count, cols, scoring, st_layout, p_layout, False)
        dk, dv, count = _query_blocks(k, v, q_bufs, do_bufs, ready, empty, dk, dv, LSE, DELTA, l_base, lo, full_lo,
                                      count, cols, scoring, st_layout, p_layout, True)
        dk, dv, count = _query_blocks(k, v, q_bufs, do_bufs, ready, empty, dk, dv, LSE, DELTA, l_base, full_hi, hi,
                                      count, cols, scoring, st_layout, p_layout, True)
    sm_scale = scoring[6]
    k.store((dk * sm_scale).to(k_bufs.dtype))  # K and V are read no more: their buffers stage dK and dV
    v.store(dv.to(v_bufs.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, h_kv, first, 0], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [b, h_kv, first, 0], v_smem)
    tma.store_wait(0)


# Every partition takes the same arguments (Gluon asks it of the workers); each uses its share.
@gluon.jit
def _first_keys(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready,
                empty, LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring):
    _warpgroup(0, dk_desc, dv_desc, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty, LSE, DELTA, stride_lb,
               stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring)


@gluon.jit
def _second_keys(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready,
                 empty, LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring):
    _warpgroup(1, dk_desc, dv_desc, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty, LSE, DELTA, stride_lb,
               stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready,
            empty, LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring):
    """The loader warp: both warpgroups' K and V, then Q and dO blocks in the order they take them."""
    ROWS: gl.constexpr = k_desc.block_type.shape[2]
    mbarrier.expect(kv_bar, 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [b, h_kv, n0 + w * ROWS, 0], kv_bar, k_bufs.index(w))
        tma.async_copy_global_to_shared(v_desc, [b, h_kv, n0 + w * ROWS, 0], kv_bar, v_bufs.index(w))
    count = gl.to_tensor(0)
    for g in range(group):
        h = h_kv * group + g
        count = _load_blocks(q_desc, do_desc, q_bufs, do_bufs, ready, empty, b, h, full_lo, full_hi, count)
        count = _load_blocks(q_desc, do_desc, q_bufs, do_bufs, ready, empty, b, h, lo, full_lo, count)
        count = _load_blocks(q_desc, do_desc, q_bufs, do_bufs, ready, empty, b, h, full_hi, hi, count)


@gluon.jit
def attention_bwd_dkdv_ws(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA, stride_lb, stride_lh,
                          seqlen_q, seqlen_kv, group, sm_scale, softcap, bottom_right, window_left, window_right,
                          HAS_SOFTCAP: gl.constexpr, STAGES: gl.constexpr):
    ROWS: gl.constexpr = k_desc.block_type.shape[2]  # a warpgroup's keys
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    pid_n = gl.program_id(0)
    h_kv = gl.program_id(1)
    b = gl.program_id(2)
    n0 = pid_n * 2 * ROWS
    band_offset = bottom_right * (seqlen_kv - seqlen_q)
    last_col = gl.minimum(n0 + 2 * ROWS, seqlen_kv) - 1
    lo, hi, full_lo, full_hi = _query_range(n0, last_col, band_offset, window_left, window_right, seqlen_q, BLOCK_M)

    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival from each warpgroup
    scoring = (band_offset, seqlen_q, seqlen_kv, window_left, window_right, sm_scale * LOG2E, sm_scale, softcap,
               1 if HAS_SOFTCAP else 0)
    args = (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_bufs, v_bufs, q_bufs, do_bufs, kv_bar, ready, empty,
            LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring)
    gl.warp_specialize([(_first_keys, args), (_second_keys, args), (_loader, args)], [4, 1], [240, 24])


# The dQ stage. Its rows are fixed, so LSE and delta are read once, not per block.

@gluon.jit
def _key_blocks(q, do, k_bufs, v_bufs, ready, empty, dq, lse2, delta, rows, start, end, count, scoring,
                s_layout: gl.constexpr, ds_layout: gl.constexpr, MASKED: gl.constexpr):
    """dQ of one warpgroup's rows over key blocks [start, end)."""
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    HEAD_QK: gl.constexpr = k_bufs.type.shape[4]
    HEAD_V: gl.constexpr = v_bufs.type.shape[4]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    ROWS: gl.constexpr = q.type.shape[0]
    band_offset, len_kv, window_left, window_right = scoring[0], scoring[2], scoring[3], scoring[4]
    offs_n = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    n = gl.maximum(gl.cdiv(end - start, BLOCK_N), 0)
    for j in range(n):
        s = (count + j) % STAGES
        mbarrier.wait(ready.index(s), ((count + j) // STAGES) & 1)
        k = k_bufs.index(s).reshape([BLOCK_N, HEAD_QK])
        qk = warpgroup_mma(q, k.permute((1, 0)), zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do, v_bufs.index(s).reshape([BLOCK_N, HEAD_V]).permute((1, 0)), zero, use_acc=False,
                           is_async=True)
        qk = warpgroup_mma_wait(1, deps=[qk])  # issued first, so done first
        p, slope_p = _probabilities(qk, lse2[:, None], scoring)
        if MASKED:
            cols = start + j * BLOCK_N + offs_n
            diagonal = rows[:, None] + band_offset
            visible = ((cols[None, :] < len_kv) & (cols[None, :] >= diagonal - window_left)
                       & (cols[None, :] <= diagonal + window_right))
            slope_p = gl.where(visible, slope_p, 0.0)
        dp = warpgroup_mma_wait(0, deps=[dp])
        ds = slope_p * (dp - delta[:, None])
        dq = warpgroup_mma(gl.convert_layout(ds.to(q.dtype), ds_layout), k, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(empty.index(s))
    return dq, count + n


@gluon.jit
def _dq_warpgroup(which: gl.constexpr, dq_desc, q_bufs, do_bufs, k_bufs, v_bufs, q_bar, ready, empty, LSE, DELTA,
                  l_base, b, h, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, sm_scale):
    """One MMA warpgroup's 64 query rows: the interior key blocks, then the masked ones at the band's edges; dQ."""
    ROWS: gl.constexpr = q_bufs.type.shape[3]
    HEAD_QK: gl.constexpr = q_bufs.type.shape[4]
    HEAD_V: gl.constexpr = do_bufs.type.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    k_width: gl.constexpr = 32 // q_bufs.dtype.primitive_bitwidth
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_QK, 16])
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=k_width)
    first = m0 + which * ROWS
    rows = first + gl.arange(0, ROWS, gl.SliceLayout(1, s_layout))
    # rows past the sequence, or that saw no key, get LSE +inf: their P is 0
    lse = gl.load(LSE + l_base + rows, mask=rows < seqlen_q, other=float("inf"))
    lse2 = gl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = gl.load(DELTA + l_base + rows, mask=rows < seqlen_q, other=0.0)
    q_smem = q_bufs.index(which)
    q = q_smem.reshape([ROWS, HEAD_QK])
    do = do_bufs.index(which).reshape([ROWS, HEAD_V])
    dq = gl.zeros([ROWS, HEAD_QK], gl.float32, dq_layout)
    mbarrier.wait(q_bar, 0)
    dq, count = _key_blocks(q, do, k_bufs, v_bufs, ready, empty, dq, lse2, delta, rows, full_lo, full_hi, 0,
                            scoring, s_layout, ds_layout, False)
    dq, count = _key_blocks(q, do, k_bufs, v_bufs, ready, empty, dq, lse2, delta, rows, lo, full_lo, count,
                            scoring, s_layout, ds_layout, True)
    dq, count = _key_blocks(q, do, k_bufs, v_bufs, ready, empty, dq, lse2, delta, rows, full_hi, hi, count,
                            scoring, s_layout, ds_layout, True)
    q.store((dq * sm_scale).to(q_bufs.dtype))  # Q is read no more: its buffer stages dQ for the TMA store
    fence_async_shared()
    tma.async_copy_shared_to_global(dq_desc, [b, h, first, 0], q_smem)
    tma.store_wait(0)


@gluon.jit
def _first_rows(q_desc, k_desc, v_desc, do_desc, dq_desc, q_bufs, do_bufs, k_bufs, v_bufs, q_bar, ready, empty, LSE,
                DELTA, l_base, b, h, h_kv, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, sm_scale):
    _dq_warpgroup(0, dq_desc, q_bufs, do_bufs, k_bufs, v_bufs, q_bar, ready, empty, LSE, DELTA, l_base, b, h, m0, lo,
                  hi, full_lo, full_hi, seqlen_q, scoring, sm_scale)


@gluon.jit
def _second_rows(q_desc, k_desc, v_desc, do_desc, dq_desc, q_bufs, do_bufs, k_bufs, v_bufs, q_bar, ready, empty, LSE,
                 DELTA, l_base, b, h, h_kv, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, sm_scale):
    _dq_warpgroup(1, dq_desc, q_bufs, do_bufs, k_bufs, v_bufs, q_bar, ready, empty, LSE, DELTA, l_base, b, h, m0, lo,
                  hi, full_lo, full_hi, seqlen_q, scoring, sm_scale)


@gluon.jit
def _dq_loader(q_desc, k_desc, v_desc, do_desc, dq_desc, q_bufs, do_bufs, k_bufs, v_bufs, q_bar, ready, empty, LSE,
               DELTA, l_base, b, h, h_kv, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, sm_scale):
    """The loader warp: both warpgroups' Q and dO, then the key blocks in the order they take them."""
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    mbarrier.expect(q_bar, 2 * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(q_desc, [b, h, m0 + w * ROWS, 0], q_bar, q_bufs.index(w))
        tma.async_copy_global_to_shared(do_desc, [b, h, m0 + w * ROWS, 0], q_bar, do_bufs.index(w))
    count = _load_blocks(k_desc, v_desc, k_bufs, v_bufs, ready, empty, b, h_kv, full_lo, full_hi, 0)
    count = _load_blocks(k_desc, v_desc, k_bufs, v_bufs, ready, empty, b, h_kv, lo, full_lo, count)
    _load_blocks(k_desc, v_desc, k_bufs, v_bufs, ready, empty, b, h_kv, full_hi, hi, count)


@gluon.jit
def attention_bwd_dq_ws(q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA, stride_lb, stride_lh, seqlen_q,
                        seqlen_kv, group, sm_scale, softcap, bottom_right, window_left, window_right,
                        HAS_SOFTCAP: gl.constexpr, STAGES: gl.constexpr):
    ROWS: gl.constexpr = q_desc.block_type.shape[2]  # a warpgroup's rows
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    pid_m = gl.program_id(0)
    h = gl.program_id(1)
    b = gl.program_id(2)
    pid_m = gl.cdiv(seqlen_q, 2 * ROWS) - 1 - pid_m  # under a causal band, the longest rows first
    m0 = pid_m * 2 * ROWS
    band_offset = bottom_right * (seqlen_kv - seqlen_q)
    last_row = gl.minimum(m0 + 2 * ROWS, seqlen_q) - 1
    lo, hi, full_lo, full_hi = _key_range(m0, last_row, band_offset, window_left, window_right, seqlen_kv, BLOCK_N)
    l_base = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival from each warpgroup
    scoring = (band_offset, seqlen_q, seqlen_kv, window_left, window_right, sm_scale * LOG2E, sm_scale, softcap,
               1 if HAS_SOFTCAP else 0)
    args = (q_desc, k_desc, v_desc, do_desc, dq_desc, q_bufs, do_bufs, k_bufs, v_bufs, q_bar, ready, empty, LSE,
            DELTA, l_base, b, h, h // group, m0, lo, hi, full_lo, full_hi, seqlen_q, scoring, sm_scale)
    gl.warp_specialize([(_first_rows, args), (_second_rows, args), (_dq_loader, args)], [4, 1], [240, 24])
