"""bwd-ws's dK/dV stage for wide heads (d=256): the two warpgroups split the work by role.

At d=128 each MMA warpgroup owns 64 keys and holds their dK and dV (kernels/backward_ws.py).
At d=256 those are 128 fp32 registers a thread each, which do not fit beside each other, so
a program owns 64 keys and both warpgroups take every query block of them:
  - the P warpgroup holds dV: S^T = K Q^T, P^T (masked, through the soft-cap), then
    dV += P^T dO; it hands P^T (times the soft-cap's slope) over through shared memory;
  - the dS warpgroup holds dK: dP^T = V dO^T, then dS^T = P^T (dP^T - delta) with the P^T it
    was handed, and dK += dS^T Q.
Each warpgroup issues two of the four GEMMs, none twice. A P^T buffer per ring stage: the P
warpgroup writes it and arrives on `p_ready`; the dS warpgroup reads it before it releases
the stage's Q and dO, so the loader's refill (which waits for that release) orders the next
write after the read. dV leaves from K's buffer and dK from V's: each warpgroup's own.
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

from .backward_ws import _load_blocks, _query_range, _transposed_probabilities
from .scores import LOG2E


@gluon.jit
def _p_blocks(k, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dv, LSE, l_base, start, end, count, cols, scoring,
              st_layout: gl.constexpr, p_layout: gl.constexpr, MASKED: gl.constexpr):
    """The P warpgroup over query blocks [start, end): P^T, handed over, and dV += P^T dO."""
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
        s_t = warpgroup_mma(k, q.permute((1, 0)), zero, use_acc=False, is_async=True)
        rows = start + j * BLOCK_M + offs_m
        # rows past the sequence, or that saw no key, get LSE +inf: their P is 0
        lse = gl.load(LSE + l_base + rows, mask=rows < len_q, other=float("inf"))
        lse = gl.where(lse == float("-inf"), float("inf"), lse)
        s_t = warpgroup_mma_wait(0, deps=[s_t])
        p_t, slope_p_t = _transposed_probabilities(s_t, lse, rows, cols, scoring, MASKED)
        p_bufs.index(s).store(slope_p_t)
        mbarrier.arrive(p_ready.index(s))
        do = do_bufs.index(s).reshape([BLOCK_M, HEAD_V])
        dv = warpgroup_mma(gl.convert_layout(p_t.to(q.dtype), p_layout), do, dv, is_async=True)
        dv = warpgroup_mma_wait(0, deps=[dv])
        mbarrier.arrive(empty.index(s))
    return dv, count + n


@gluon.jit
def _ds_blocks(v, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dk, DELTA, l_base, start, end, count, len_q,
               st_layout: gl.constexpr, ds_layout: gl.constexpr):
    """The dS warpgroup over query blocks [start, end): dP^T, dS^T from the handed P^T, dK += dS^T Q."""
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    HEAD_QK: gl.constexpr = q_bufs.type.shape[4]
    HEAD_V: gl.constexpr = do_bufs.type.shape[4]
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    ROWS: gl.constexpr = v.type.shape[0]
    offs_m = gl.arange(0, BLOCK_M, gl.SliceLayout(0, st_layout))
    zero = gl.zeros([ROWS, BLOCK_M], gl.float32, st_layout)
    n = gl.maximum(gl.cdiv(end - start, BLOCK_M), 0)
    for j in range(n):
        s = (count + j) % STAGES
        phase = ((count + j) // STAGES) & 1
        mbarrier.wait(ready.index(s), phase)
        do = do_bufs.index(s).reshape([BLOCK_M, HEAD_V])
        dp_t = warpgroup_mma(v, do.permute((1, 0)), zero, use_acc=False, is_async=True)
        rows = start + j * BLOCK_M + offs_m
        delta = gl.load(DELTA + l_base + rows, mask=rows < len_q, other=0.0)
        dp_t = warpgroup_mma_wait(0, deps=[dp_t])
        mbarrier.wait(p_ready.index(s), phase)
        ds_t = p_bufs.index(s).load(st_layout) * (dp_t - delta[None, :])
        q = q_bufs.index(s).reshape([BLOCK_M, HEAD_QK])
        dk = warpgroup_mma(gl.convert_layout(ds_t.to(q.dtype), ds_layout), q, dk, is_async=True)
        dk = warpgroup_mma_wait(0, deps=[dk])
        mbarrier.arrive(empty.index(s))  # after the read of P^T: see the module docstring
    return dk, count + n


# Every partition takes the same arguments (Gluon asks it of the workers); each uses its share.
@gluon.jit
def _p_warpgroup(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_buf, v_buf, q_bufs, do_bufs, p_bufs, kv_bar,
                 ready, empty, p_ready, LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo,
                 full_hi, scoring):
    ROWS: gl.constexpr = k_buf.type.shape[2]
    HEAD_QK: gl.constexpr = k_buf.type.shape[3]
    HEAD_V: gl.constexpr = v_buf.type.shape[3]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    k_width: gl.constexpr = 32 // k_buf.dtype.primitive_bitwidth
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    dv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_V, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dv_layout, k_width=k_width)
    cols = n0 + gl.arange(0, ROWS, gl.SliceLayout(1, st_layout))
    k = k_buf.reshape([ROWS, HEAD_QK])
    dv = gl.zeros([ROWS, HEAD_V], gl.float32, dv_layout)
    mbarrier.wait(kv_bar, 0)
    count = gl.to_tensor(0)
    for g in range(group):
        l_base = b.to(gl.int64) * stride_lb + (h_kv * group + g).to(gl.int64) * stride_lh
        dv, count = _p_blocks(k, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dv, LSE, l_base, full_lo, full_hi,
                              count, cols, scoring, st_layout, p_layout, False)
        dv, count = _p_blocks(k, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dv, LSE, l_base, lo, full_lo,
                              count, cols, scoring, st_layout, p_layout, True)
        dv, count = _p_blocks(k, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dv, LSE, l_base, full_hi, hi,
                              count, cols, scoring, st_layout, p_layout, True)
    k.store(dv.to(k_buf.dtype))  # K is read no more (by this warpgroup, its only reader): it stages dV
    fence_async_shared()
    tma.async_copy_shared_to_global(dv_desc, [b, h_kv, n0, 0], k_buf)
    tma.store_wait(0)


@gluon.jit
def _ds_warpgroup(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_buf, v_buf, q_bufs, do_bufs, p_bufs, kv_bar,
                  ready, empty, p_ready, LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo,
                  full_hi, scoring):
    ROWS: gl.constexpr = v_buf.type.shape[2]
    HEAD_QK: gl.constexpr = k_buf.type.shape[3]
    HEAD_V: gl.constexpr = v_buf.type.shape[3]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    k_width: gl.constexpr = 32 // k_buf.dtype.primitive_bitwidth
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    dk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_QK, 16])
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dk_layout, k_width=k_width)
    v = v_buf.reshape([ROWS, HEAD_V])
    dk = gl.zeros([ROWS, HEAD_QK], gl.float32, dk_layout)
    len_q = scoring[1]
    mbarrier.wait(kv_bar, 0)
    count = gl.to_tensor(0)
    for g in range(group):
        l_base = b.to(gl.int64) * stride_lb + (h_kv * group + g).to(gl.int64) * stride_lh
        dk, count = _ds_blocks(v, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dk, DELTA, l_base, full_lo, full_hi,
                               count, len_q, st_layout, ds_layout)
        dk, count = _ds_blocks(v, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dk, DELTA, l_base, lo, full_lo,
                               count, len_q, st_layout, ds_layout)
        dk, count = _ds_blocks(v, q_bufs, do_bufs, p_bufs, ready, empty, p_ready, dk, DELTA, l_base, full_hi, hi,
                               count, len_q, st_layout, ds_layout)
    sm_scale = scoring[6]
    v.store((dk * sm_scale).to(v_buf.dtype))  # V is read no more (by this warpgroup, its only reader): it stages dK
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, h_kv, n0, 0], v_buf)
    tma.store_wait(0)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_buf, v_buf, q_bufs, do_bufs, p_bufs, kv_bar,
            ready, empty, p_ready, LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi,
            scoring):
    """The loader warp: the program's K and V, then Q and dO blocks in the order both warpgroups take them."""
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, h_kv, n0, 0], kv_bar, k_buf)
    tma.async_copy_global_to_shared(v_desc, [b, h_kv, n0, 0], kv_bar, v_buf)
    count = gl.to_tensor(0)
    for g in range(group):
        h = h_kv * group + g
        count = _load_blocks(q_desc, do_desc, q_bufs, do_bufs, ready, empty, b, h, full_lo, full_hi, count)
        count = _load_blocks(q_desc, do_desc, q_bufs, do_bufs, ready, empty, b, h, lo, full_lo, count)
        count = _load_blocks(q_desc, do_desc, q_bufs, do_bufs, ready, empty, b, h, full_hi, hi, count)


@gluon.jit
def attention_bwd_dkdv_ws_wide(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA, stride_lb, stride_lh,
                               seqlen_q, seqlen_kv, group, sm_scale, softcap, bottom_right, window_left,
                               window_right, HAS_SOFTCAP: gl.constexpr, STAGES: gl.constexpr):
    ROWS: gl.constexpr = k_desc.block_type.shape[2]  # the program's keys, shared by both warpgroups
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    n0 = gl.program_id(0) * ROWS
    h_kv = gl.program_id(1)
    b = gl.program_id(2)
    band_offset = bottom_right * (seqlen_kv - seqlen_q)
    last_col = gl.minimum(n0 + ROWS, seqlen_kv) - 1
    lo, hi, full_lo, full_hi = _query_range(n0, last_col, band_offset, window_left, window_right, seqlen_q, BLOCK_M)

    k_buf = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_buf = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    p_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, ROWS, BLOCK_M],
                                       gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival from each warpgroup
        mbarrier.init(p_ready.index(i), count=1)
    scoring = (band_offset, seqlen_q, seqlen_kv, window_left, window_right, sm_scale * LOG2E, sm_scale, softcap,
               1 if HAS_SOFTCAP else 0)
    args = (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, k_buf, v_buf, q_bufs, do_bufs, p_bufs, kv_bar, ready,
            empty, p_ready, LSE, DELTA, stride_lb, stride_lh, b, h_kv, n0, group, lo, hi, full_lo, full_hi, scoring)
    gl.warp_specialize([(_p_warpgroup, args), (_ds_warpgroup, args), (_loader, args)], [4, 1], [240, 24])
