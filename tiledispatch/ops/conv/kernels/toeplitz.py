"""Family `toeplitz`: depthwise 2-D convolution on tensor cores.

A depthwise conv has no channel sum, so it is no GEMM, and the direct family runs it on
CUDA-core FMAs: at 7x7 those FMAs, not the bytes, set its time. Per channel and filter row
fy, though, the outputs of one row are a small matrix product:

    Y[m, j] += sum_k X[row(m) + fy, col(m) + k] * T_fy[k, j],   T_fy[k, j] = w[fy, k - j]

with m = (image, chunk of NW output columns), j the column within the chunk and k the
KW = NW + 8 input columns the chunk reads. T_fy is banded (Toeplitz), zero off the filter's
width; each program gathers its channels' T_fy straight from w once, as MMA operands kept in
registers (a filter-building kernel before the walk cost 2-2.5 us: 14 % of a 16 us 5x5 layer).
The MMA's batch is the channel, spread over the warps. A program walks down the rows once: each
input row is loaded once and feeds the FY output rows it touches, held as FY accumulators, one of which
is finished (stored and cleared) a row, through the forward's epilogue (bias, activation,
residual, as the GEMM's). Backward-data at stride 1 is the same walk over dy with the filter
flipped in both directions and padding F - 1 - P. Backward-weight is another walk
(`conv_depthwise_toeplitz_weight`): MMAs whose reduction is the pixels and whose diagonal is
the channel, their operands read by ldmatrix from channels-last rows in shared memory.

The main kernel is Gluon (mma_v2 with explicit layouts): the FY filter operands stay in
registers for the program's whole walk, which `tl.dot` of a 3-D block did not keep there
(it re-read them from shared memory every row and ran at 90 % of the L1 pipe). GPU only.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from ...gemm.kernels.epilogue import activate

_activate = gluon.jit(activate.fn)  # the GEMM epilogue's activations, compiled by Gluon
NW = 8  # output columns of a chunk: the MMA's N
KW = 16  # input columns a chunk reads: the MMA's K; a filter up to KW - NW + 1 wide fits
MAX_WIDTH = KW - NW + 1


@gluon.constexpr_function
def _mma_layout(warps):
    """mma.sync's accumulator over [channels, rows, columns]: the channel is the batch, a warp's own."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[warps, 1, 1], instr_shape=[1, 16, 8])


@gluon.constexpr_function
def _operand_layout(mma, index):
    """The A (index 0) or B (index 1) operand of `mma`, 16-bit values in pairs."""
    return gl.DotOperandLayout(operand_index=index, parent=mma, k_width=2)


@gluon.constexpr_function
def _vector_layout(block_c, vec, columns, warps):
    """[channels, rows, `columns`] moved `vec` channels of a pixel a lane: 16-byte vectors in
    channels-last, the lanes along a pixel's channels, then the columns, then the rows."""
    lanes_c = block_c // vec
    lanes_col = min(columns, 32 // lanes_c)
    return gl.BlockedLayout(size_per_thread=[vec, 1, 1], threads_per_warp=[lanes_c, 32 // lanes_c // lanes_col, lanes_col],
                            warps_per_cta=[1, warps, 1], order=[0, 2, 1])


@gluon.jit
def _finish(acc, bias, res_rows, res_ok, out_layout: gl.constexpr, out_dtype: gl.constexpr,
            HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """A finished output row, in the store's layout: bias and activation where the MMA left it, the
    residual (read in the store's layout) added in fp32 before the one rounding to out_dtype."""
    if HAS_BIAS:
        acc = acc + bias
    acc = _activate(acc, ACTIVATION)
    if HAS_RESIDUAL:
        out = gl.convert_layout(acc, out_layout)
        out = (out + gl.load(res_rows, mask=res_ok, other=0.0).to(gl.float32)).to(out_dtype)
    else:
        out = gl.convert_layout(acc.to(out_dtype), out_layout)
    return out


@gluon.jit
def conv_depthwise_toeplitz(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, N, C, H, W, OH, OW, FX, PH, PW,
                            swk, swy, swx, sxn, sxh, sxw, syn, syh, syw, srn, srh, srw,
                            BLOCK_M: gl.constexpr, BLOCK_C: gl.constexpr, ROWS: gl.constexpr,
                            FILTER_ROWS: gl.constexpr, KW: gl.constexpr, NW: gl.constexpr, VEC: gl.constexpr,
                            FLIP: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
                            HAS_RESIDUAL: gl.constexpr):
    """y = the depthwise correlation of x with w (stride and dilation 1); FLIP: with w turned by
    180 degrees, which is backward-data's walk over dy.

    Grid: (blocks of BLOCK_M (image, chunk) rows, channel blocks, bands of ROWS output rows).
    The loop over input rows is unrolled by FILTER_ROWS, so that each accumulator keeps its
    registers and the next row's load, issued a row ahead, is never copied while in flight.
    """
    FY: gl.constexpr = FILTER_ROWS
    WARPS: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = _mma_layout(WARPS)
    a_layout: gl.constexpr = _operand_layout(mma, 0)
    b_layout: gl.constexpr = _operand_layout(mma, 1)
    rows_layout: gl.constexpr = _vector_layout(BLOCK_C, VEC, KW, WARPS)
    out_layout: gl.constexpr = _vector_layout(BLOCK_C, VEC, NW, WARPS)
    filter_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, NW // 2], threads_per_warp=[1, 16, 2],
                                                   warps_per_cta=[WARPS, 1, 1], order=[2, 1, 0])

    pid_m = gl.program_id(0)
    pid_c = gl.program_id(1)
    oh_first = gl.program_id(2) * ROWS
    oh_end = gl.minimum(oh_first + ROWS, OH)
    chunks = gl.cdiv(OW, NW)
    M = N * chunks

    # Source rows: [channels, (image, chunk), input column] pointers at input row 0.
    m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(0, gl.SliceLayout(2, rows_layout)))
    c = pid_c * BLOCK_C + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, rows_layout)))
    k = gl.arange(0, KW, gl.SliceLayout(0, gl.SliceLayout(1, rows_layout)))
    col = ((m % chunks) * NW - PW)[None, :, None] + k[None, None, :]
    c3 = c[:, None, None]
    x_ok = (col >= 0) & (col < W) & (m < M)[None, :, None] & (c3 < C)
    x_rows = x_ptr + ((m // chunks).to(gl.int64)[None, :, None] * sxn + col * sxw) + c3

    # Output rows: [channels, (image, chunk), output column] pointers at output row 0.
    m_out = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(0, gl.SliceLayout(2, out_layout)))
    c_out = (pid_c * BLOCK_C + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, out_layout))))[:, None, None]
    j = gl.arange(0, NW, gl.SliceLayout(0, gl.SliceLayout(1, out_layout)))
    ow = ((m_out % chunks) * NW)[None, :, None] + j[None, None, :]
    y_rows = y_ptr + ((m_out // chunks).to(gl.int64)[None, :, None] * syn + ow * syw) + c_out
    y_ok = (ow < OW) & (m_out < M)[None, :, None] & (c_out < C)
    r_rows = res_ptr + ((m_out // chunks).to(gl.int64)[None, :, None] * srn + ow * srw) + c_out
    bias = 0.0
    if HAS_BIAS:  # one value a channel, where the accumulators are
        c_acc = pid_c * BLOCK_C + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, mma)))
        bias = gl.load(bias_ptr + c_acc, mask=c_acc < C, other=0.0).to(gl.float32)[:, None, None]

    # The filter rows as banded B operands, T_fy[k, j] = w[fy, k - j] inside the filter's width, gathered
    # from w and kept in registers for the whole walk (channels past C read C - 1's).
    tc = gl.minimum(pid_c * BLOCK_C + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, filter_layout))),
                    C - 1)
    tk = gl.arange(0, KW, gl.SliceLayout(0, gl.SliceLayout(2, filter_layout)))
    tj = gl.arange(0, NW, gl.SliceLayout(0, gl.SliceLayout(1, filter_layout)))
    tap = tk[None, :, None] - tj[None, None, :]
    in_band = (tap >= 0) & (tap < FX)
    if FLIP:
        tap = FX - 1 - tap
    w_rows = w_ptr + (tc.to(gl.int64) * swk)[:, None, None] + tap * swx
    filters = ()
    for fy in gl.static_range(FY):
        row = FY - 1 - fy if FLIP else fy
        band = gl.load(w_rows + row * swy, mask=in_band, other=0.0)
        filters = filters + (gl.convert_layout(band, b_layout),)

    # Input row r (from oh_first) adds into output rows r - fy: output row q sits in slot q % FY.
    slots = ()
    for _i in gl.static_range(FY):
        slots = slots + (gl.zeros([BLOCK_C, BLOCK_M, NW], gl.float32, mma),)
    u_end = oh_end + FY - 1  # input rows oh_first .. u_end - 1 (relative to the padding)
    ih = oh_first - PH
    pending = gl.load(x_rows + ih * sxh, mask=x_ok & (ih >= 0) & (ih < H) & (oh_first < u_end), other=0.0)
    for base in range(oh_first, u_end, FY):
        for s in gl.static_range(FY):
            u = base + s
            ih = u + 1 - PH
            current = pending
            pending = gl.load(x_rows + ih * sxh, mask=x_ok & (ih >= 0) & (ih < H) & (u + 1 < u_end), other=0.0)
            a = gl.convert_layout(current, a_layout)
            summed = ()
            for slot in gl.static_range(FY):  # this row meets output row (r - fy) through filter row fy
                summed = summed + (mma_v2(a, filters[(s - slot + FY) % FY], slots[slot]),)
            # Output row u - FY + 1 has all its rows now: slot (s + 1) % FY. (Constexpr slot indices
            # are written out: Gluon turned one bound to a name into a tensor.)
            oh = u - FY + 1
            ok = y_ok & (oh >= oh_first) & (oh < oh_end)
            out = _finish(summed[(s + 1) % FY], bias, r_rows + oh * srh, ok, out_layout, y_ptr.dtype.element_ty,
                          HAS_BIAS, ACTIVATION, HAS_RESIDUAL)
            gl.store(y_rows + oh * syh, out, mask=ok)
            slots = ()
            for slot in gl.static_range(FY):
                slots = slots + ((gl.zeros([BLOCK_C, BLOCK_M, NW], gl.float32, mma) if slot == (s + 1) % FY
                                  else summed[slot]),)


@gluon.constexpr_function
def weight_taps(filter_rows):
    """Taps along W a backward-weight walk holds: the pairs of a square filter's width, to a power of 2
    (rules and ranking call it on the host too)."""
    return triton.next_power_of_2(2 * ((filter_rows + 1) // 2))


@gluon.jit
def conv_depthwise_toeplitz_weight(x_ptr, y_ptr, ws_ptr, N, C, H, W, OH, OW, FX, PH, PW,
                                   sxn, sxh, sxw, syn, syh, syw,
                                   BLOCK_M: gl.constexpr, BLOCK_C: gl.constexpr, ROWS: gl.constexpr,
                                   FILTER_ROWS: gl.constexpr, SPLIT_K: gl.constexpr):
    """Backward-weight on tensor cores, the channel kept on the MMA's diagonal.

    For a warp's 8 channels, a pair of taps (s, s + 1) and 16 output columns k:
        D[(j, c'), c] += sum_k x[row, ow0 + k + s + j - PW, c'] * dy[row', ow0 + k, c]
    is one m16n8k16 MMA; its c' = c diagonal holds dw[c, fy, s + j] and the rest is discarded
    (1/8 of the MMA is useful, still ~2x what the CUDA-core FMAs of the direct family reach,
    in a tenth of their instructions). Both operands come straight from channels-last rows in
    shared memory by ldmatrix.trans, so no layout conversion sits in the walk: the x row is
    stored once a tap, shifted (a [pixel, (tap, channel)] tile, XOR-swizzled), and dy's row
    as it is; both arrive by cp.async a row ahead, in two slots.

    Grid: (channel blocks of BLOCK_C = 8 x warps, SPLIT_K). The work items are (image, block of
    BLOCK_M output columns, band of ROWS output rows); program pid_s walks items pid_s,
    pid_s + SPLIT_K, ... down their x rows, with the last FILTER_ROWS dy rows held as B operands
    (one replaced a row: the loop is unrolled by FILTER_ROWS), and the sums of every item in
    its registers; then it writes its slab pid_s of the workspace [SPLIT_K, C, FY * FX]
    (weight_reduce.conv_weight_reduce sums the slabs in order). Rows of the padding load as
    zeros and skip their MMAs. The filter is at most FILTER_ROWS (rounded up to even) wide.
    """
    FY: gl.constexpr = FILTER_ROWS
    G: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_C == 8 * G, "a warp's 8 channels are the MMA's diagonal")
    CHUNKS: gl.constexpr = BLOCK_M // 16
    T: gl.constexpr = weight_taps(FY)
    PAIRS: gl.constexpr = T // 2
    mma: gl.constexpr = _mma_layout(G)
    a_layout: gl.constexpr = _operand_layout(mma, 0)
    b_layout: gl.constexpr = _operand_layout(mma, 1)
    x_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 32 // T, T],
                                              warps_per_cta=[G, 1, 1], order=[2, 1, 0])
    dy_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 32, 1],
                                               warps_per_cta=[G, 1, 1], order=[2, 1, 0])
    # rows of T 16-byte vectors, swizzled so that the 8 rows an ldmatrix reads fall in different banks
    x_smem: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=8 // T, max_phase=T, order=[2, 1, 0])
    dy_smem: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])
    xs = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [2, G, BLOCK_M, T * 8], x_smem)
    ds = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [2, G, BLOCK_M, 8], dy_smem)

    pid_c = gl.program_id(0)
    pid_s = gl.program_id(1)
    col_blocks = gl.cdiv(OW, BLOCK_M)
    bands = gl.cdiv(OH, ROWS)
    # x as [warp, output column k, (tap t, channel c)]: column k + t - PW of channel 8 warp + c
    wx = gl.arange(0, G, gl.SliceLayout(1, gl.SliceLayout(2, x_layout)))[:, None, None]
    kx = gl.arange(0, BLOCK_M, gl.SliceLayout(0, gl.SliceLayout(2, x_layout)))[None, :, None]
    tc = gl.arange(0, T * 8, gl.SliceLayout(0, gl.SliceLayout(1, x_layout)))[None, None, :]
    cx = pid_c * BLOCK_C + wx * 8 + tc % 8
    wd = gl.arange(0, G, gl.SliceLayout(1, gl.SliceLayout(2, dy_layout)))[:, None, None]
    kd = gl.arange(0, BLOCK_M, gl.SliceLayout(0, gl.SliceLayout(2, dy_layout)))[None, :, None]
    cd = pid_c * BLOCK_C + wd * 8 + gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(1, dy_layout)))[None, None, :]

    sums = ()  # sums[fy * PAIRS + q]: taps (fy, 2q) and (fy, 2q + 1)
    for _i in gl.static_range(FY * PAIRS):
        sums = sums + (gl.zeros([G, 16, 8], gl.float32, mma),)
    for item in range(pid_s, N * col_blocks * bands, SPLIT_K):
        n = item // (col_blocks * bands)
        oh_first = (item // col_blocks % bands) * ROWS
        oh_end = gl.minimum(oh_first + ROWS, OH)
        ow0 = (item % col_blocks) * BLOCK_M
        col = ow0 - PW + kx + tc // 8
        x_ok = (col >= 0) & (col < W) & (tc // 8 < FX) & (cx < C)
        x_rows = x_ptr + n.to(gl.int64) * sxn + cx + col * sxw
        dy_ok = (ow0 + kd < OW) & (cd < C)
        dy_rows = y_ptr + n.to(gl.int64) * syn + cd + (ow0 + kd) * syw
        dys = ()  # dys[slot * CHUNKS + k]: dy row u + PH - fy of x row u in slot (u - u_first - fy) % FY
        for _i in gl.static_range(FY * CHUNKS):
            dys = dys + (gl.zeros([G, 16, 8], y_ptr.dtype.element_ty, b_layout),)
        # x row u and dy row u + PH (the newest it meets) go to slot (u - u_first) % 2, a step ahead
        u_first = oh_first - PH
        u_end = oh_end - PH + FY - 1
        async_copy.async_copy_global_to_shared(xs.index(0), x_rows + u_first * sxh,
                                               mask=(u_first >= 0) & (u_first < H) & x_ok)
        async_copy.async_copy_global_to_shared(ds.index(0), dy_rows + oh_first * syh, mask=dy_ok)
        async_copy.commit_group()
        for base in range(u_first, u_end, FY):
            for s in gl.static_range(FY):
                u = base + s
                slot = (u - u_first) % 2
                un = u + 1
                async_copy.async_copy_global_to_shared(xs.index(1 - slot), x_rows + un * sxh,
                                                       mask=(un >= 0) & (un < H) & (un < u_end) & x_ok)
                async_copy.async_copy_global_to_shared(ds.index(1 - slot), dy_rows + (un + PH) * syh,
                                                       mask=(un + PH < oh_end) & dy_ok)
                async_copy.commit_group()
                async_copy.wait_group(1)
                gl.thread_barrier()
                x_tile = xs.index(slot)
                newest = ()
                for k in gl.static_range(CHUNKS):
                    newest = newest + (ds.index(slot).slice(16 * k, 16, dim=1).load(b_layout),)
                rolled = ()
                for t in gl.static_range(FY):
                    for k in gl.static_range(CHUNKS):
                        rolled = rolled + ((newest[k] if t == s else dys[t * CHUNKS + k]),)
                dys = rolled
                if (u >= 0) & (u < H):  # rows of the padding are zeros: no MMA
                    by_pair = ()
                    for q in gl.static_range(PAIRS):
                        a = ()
                        for k in gl.static_range(CHUNKS):
                            a = a + (x_tile.slice(16 * k, 16, dim=1).slice(16 * q, 16, dim=2).permute([0, 2, 1])
                                     .load(a_layout),)
                        for fy in gl.static_range(FY):  # x row u meets dy row u + PH - fy through filter row fy
                            acc = sums[fy * PAIRS + q]
                            for k in gl.static_range(CHUNKS):
                                acc = mma_v2(a[k], dys[((s - fy + FY) % FY) * CHUNKS + k], acc)
                            by_pair = by_pair + (acc,)
                    regrouped = ()
                    for fy in gl.static_range(FY):
                        for q in gl.static_range(PAIRS):
                            regrouped = regrouped + (by_pair[q * FY + fy],)
                    sums = regrouped
                gl.thread_barrier()  # the slot is refilled a step later: its reads are done
        async_copy.wait_group(0)  # the walk's last (empty) copies land before the next walk's first
        gl.thread_barrier()

    # Row (j, c') of a pair's MMA is channel c' at tap 2q + j; its diagonal element sits in column c'.
    m = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(2, mma)))
    col_c = gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(1, mma)))[None, None, :]
    wo = gl.arange(0, G, gl.SliceLayout(1, gl.SliceLayout(2, mma)))[:, None]
    c_out = pid_c * BLOCK_C + wo * 8 + (m % 8)[None, :]
    slab = ws_ptr + (pid_s * C + c_out).to(gl.int64) * (FY * FX)
    for fy in gl.static_range(FY):
        for q in gl.static_range(PAIRS):
            diagonal = gl.sum(gl.where((m % 8)[None, :, None] == col_c, sums[fy * PAIRS + q], 0.0), axis=2)
            tap = 2 * q + (m // 8)[None, :]
            gl.store(slab + fy * FX + tap, diagonal, mask=(c_out < C) & (tap < FX))
