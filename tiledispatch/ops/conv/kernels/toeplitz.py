"""Family `toeplitz`: depthwise 2-D convolution on tensor cores.

A depthwise conv has no channel sum, so it is no GEMM, and the direct family runs it on
CUDA-core FMAs: at 7x7 those FMAs, not the bytes, set its time. Per channel and filter row
fy, though, the outputs of one row are a small matrix product:

    Y[m, j] += sum_k X[row(m) + fy, col(m) + k] * T_fy[k, j],   T_fy[k, j] = w[fy, k - j]

with m = (image, chunk of NW output columns), j the column within the chunk and k the
KW = NW + 8 input columns the chunk reads (families/toeplitz.py holds both). T_fy is banded
(Toeplitz), zero off the filter's width; each program gathers its channels' T_fy straight from
w once, as MMA operands kept in registers (a filter-building kernel before the walk cost 2-2.5
us: 14 % of a 16 us 5x5 layer).
The MMA's batch is the channel, spread over the warps. A program walks down the rows once: each
input row is loaded once and feeds the FY output rows it touches, held as FY accumulators, one of which
is finished (stored and cleared) a row, through the forward's epilogue (bias, activation,
residual, as the GEMM's). Backward-data at stride 1 is the same walk over dy with the filter
flipped in both directions and padding F - 1 - P. Backward-weight (`conv_depthwise_toeplitz_weight`)
is the same walk with the pixels as the reduction: S_fy[k, j] = sum over m of X[m, k] * dY[m, j],
whose diagonals k - j = s are dw[fy, s].

The kernels are Gluon (mma_v2 with explicit layouts): the FY filter (or dy) operands stay in
registers for the program's whole walk, which `tl.dot` of a 3-D block did not keep there
(it re-read them from shared memory every row and ran at 90 % of the L1 pipe). GPU only.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ...gemm.kernels.epilogue import activate

_activate = gluon.jit(activate.fn)  # the GEMM epilogue's activations, compiled by Gluon


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
def _chunk_rows(ptr, m_first, c_first, M, C, chunks, shift, width, s_image, s_column, BLOCK_M: gl.constexpr,
                BLOCK_C: gl.constexpr, NW: gl.constexpr, COLUMNS: gl.constexpr, layout: gl.constexpr):
    """Pointers (at row 0) and mask of a block's rows in `layout`: [channels, (image, chunk), column],
    column j of chunk q at q * NW + shift + j (an input row's: shift = -padding), inside 0 .. width."""
    m = m_first + gl.arange(0, BLOCK_M, gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    c = (c_first + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, layout))))[:, None, None]
    j = gl.arange(0, COLUMNS, gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    col = ((m % chunks) * NW + shift)[None, :, None] + j[None, None, :]
    ok = (col >= 0) & (col < width) & (m < M)[None, :, None] & (c < C)
    return ptr + ((m // chunks).to(gl.int64)[None, :, None] * s_image + col * s_column) + c, ok


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

    # Input rows (KW columns a chunk, from its first output column less the padding) and output rows.
    m_first = pid_m * BLOCK_M
    c_first = pid_c * BLOCK_C
    x_rows, x_ok = _chunk_rows(x_ptr, m_first, c_first, M, C, chunks, -PW, W, sxn, sxw, BLOCK_M, BLOCK_C, NW, KW,
                               rows_layout)
    y_rows, y_ok = _chunk_rows(y_ptr, m_first, c_first, M, C, chunks, 0, OW, syn, syw, BLOCK_M, BLOCK_C, NW, NW,
                               out_layout)
    r_rows, _ = _chunk_rows(res_ptr, m_first, c_first, M, C, chunks, 0, OW, srn, srw, BLOCK_M, BLOCK_C, NW, NW,
                            out_layout)
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

    # Step u (u - PH the input row) adds into output rows u - fy, output row q in slot (q - u_first) % FY.
    # The walk skips what only padding would feed: it starts at the band's first input row that is
    # no padding above the image (the output rows those steps would finish lie above the band), and
    # stops after the last real input row, rounded up to whole unrolled turns (and not before oh_end,
    # should the padding pass the filter); the rows then left in the slots see only padding below,
    # so they are complete, and are finished without further steps. At 5x5 and 7x7 with `same`
    # padding over a whole map, this takes 15 steps and 1 finish instead of 20 steps, 28 and 3
    # instead of 35.
    slots = ()
    for _i in gl.static_range(FY):
        slots = slots + (gl.zeros([BLOCK_C, BLOCK_M, NW], gl.float32, mma),)
    u_first = oh_first + gl.minimum(gl.maximum(PH - oh_first, 0), FY - 1)
    u_real = gl.minimum(gl.maximum(H + PH, oh_end), oh_end + FY - 1)  # steps u_first .. u_real - 1 matter
    u_last = u_first + gl.cdiv(u_real - u_first, FY) * FY - 1  # the walk's last step
    ih = u_first - PH
    pending = gl.load(x_rows + ih * sxh, mask=x_ok & (ih >= 0) & (ih < H) & (u_first < u_real), other=0.0)
    for base in range(u_first, u_last + 1, FY):
        for s in gl.static_range(FY):
            u = base + s
            ih = u + 1 - PH
            current = pending
            pending = gl.load(x_rows + ih * sxh, mask=x_ok & (ih >= 0) & (ih < H) & (u + 1 < u_real), other=0.0)
            a = gl.convert_layout(current, a_layout)
            summed = ()
            for slot in gl.static_range(FY):  # this row meets output row (u - fy) through filter row fy
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
    # The walk ends on a turn's last step (s = FY - 1): output row u_last - FY + 1 + i sits in slot i,
    # finished if the band has it (where the walk was not cut short, it has none of them).
    for i in gl.static_range(1, FY):
        oh = u_last - FY + 1 + i
        if oh < oh_end:
            ok = y_ok & (oh >= oh_first)
            out = _finish(slots[i], bias, r_rows + oh * srh, ok, out_layout, y_ptr.dtype.element_ty,
                          HAS_BIAS, ACTIVATION, HAS_RESIDUAL)
            gl.store(y_rows + oh * syh, out, mask=ok)


@gluon.jit
def conv_depthwise_toeplitz_weight(x_ptr, y_ptr, ws_ptr, N, C, H, W, OH, OW, FX, PH, PW,
                                   sxn, sxh, sxw, syn, syh, syw,
                                   BLOCK_M: gl.constexpr, BLOCK_C: gl.constexpr, ROWS: gl.constexpr,
                                   FILTER_ROWS: gl.constexpr, KW: gl.constexpr, NW: gl.constexpr,
                                   VEC: gl.constexpr, SPLIT_K: gl.constexpr):
    """Backward-weight: the forward's walk with the pixels as the MMA's reduction. Per channel and
    filter row fy,
        S_fy[k, j] += sum over m of x[row u, chunk column k][m] * dy[row u - fy, chunk column j][m]
    is one MMA a row (A = the x row transposed, B = the dy row), and dw[fy, s] is the sum of S_fy
    along its diagonal k - j = s, taken once at the end: a band of FX diagonals of the 16 x 8 tile.

    Grid: (channel blocks, SPLIT_K). The work items are (BLOCK_M block of (image, chunk) rows, band
    of ROWS output rows); program pid_s walks items pid_s, pid_s + SPLIT_K, ... down their input
    rows, each x and dy row loaded a row ahead and converted to its operand once. The last FY dy
    rows stay in registers as B operands, one replaced a row (the loop is unrolled by FY, as the
    forward's); the FY sums stay for all the program's items, then go to slab pid_s of the
    workspace [SPLIT_K, C, FY * FX] (weight_reduce.conv_weight_reduce sums the slabs in order).
    """
    FY: gl.constexpr = FILTER_ROWS
    WARPS: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = _mma_layout(WARPS)
    a_layout: gl.constexpr = _operand_layout(mma, 0)
    b_layout: gl.constexpr = _operand_layout(mma, 1)
    rows_layout: gl.constexpr = _vector_layout(BLOCK_C, VEC, KW, WARPS)
    dy_layout: gl.constexpr = _vector_layout(BLOCK_C, VEC, NW, WARPS)

    pid_c = gl.program_id(0)
    pid_s = gl.program_id(1)
    chunks = gl.cdiv(OW, NW)
    M = N * chunks
    blocks = gl.cdiv(M, BLOCK_M)

    # The rows' pointers as the forward's _chunk_rows builds them, with what does not change from item
    # to item built once: built whole inside the item loop they spilled (a 72-byte stack at 7 rows).
    m_x = gl.arange(0, BLOCK_M, gl.SliceLayout(0, gl.SliceLayout(2, rows_layout)))
    c_x = (pid_c * BLOCK_C + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, rows_layout))))[:, None, None]
    k = gl.arange(0, KW, gl.SliceLayout(0, gl.SliceLayout(1, rows_layout)))[None, None, :]
    m_d = gl.arange(0, BLOCK_M, gl.SliceLayout(0, gl.SliceLayout(2, dy_layout)))
    c_d = (pid_c * BLOCK_C + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, dy_layout))))[:, None, None]
    j = gl.arange(0, NW, gl.SliceLayout(0, gl.SliceLayout(1, dy_layout)))[None, None, :]

    sums = ()
    for _i in gl.static_range(FY):
        sums = sums + (gl.zeros([BLOCK_C, KW, NW], gl.float32, mma),)
    for item in range(pid_s, blocks * gl.cdiv(OH, ROWS), SPLIT_K):
        oh_first = (item // blocks) * ROWS
        oh_end = gl.minimum(oh_first + ROWS, OH)
        mx = (item % blocks) * BLOCK_M + m_x
        col = ((mx % chunks) * NW - PW)[None, :, None] + k
        x_ok = (col >= 0) & (col < W) & (mx < M)[None, :, None] & (c_x < C)
        x_rows = x_ptr + ((mx // chunks).to(gl.int64)[None, :, None] * sxn + col * sxw) + c_x
        md = (item % blocks) * BLOCK_M + m_d
        ow = ((md % chunks) * NW)[None, :, None] + j
        dy_ok = (ow < OW) & (md < M)[None, :, None] & (c_d < C)
        dy_rows = y_ptr + ((md // chunks).to(gl.int64)[None, :, None] * syn + ow * syw) + c_d
        # Step u (from oh_first) takes x row u - PH and dy row u (past oh_end: zeros), which sits in
        # slot (u - oh_first) % FY; x row u meets dy rows u - fy, those before oh_first the slots' zeros.
        dys = ()
        for _i in gl.static_range(FY):
            dys = dys + (gl.zeros([BLOCK_C, BLOCK_M, NW], y_ptr.dtype.element_ty, b_layout),)
        u_end = oh_end + FY - 1
        ih = oh_first - PH
        x_next = gl.load(x_rows + ih * sxh, mask=x_ok & (ih >= 0) & (ih < H), other=0.0)
        dy_next = gl.load(dy_rows + oh_first * syh, mask=dy_ok, other=0.0)
        for base in range(oh_first, u_end, FY):
            for s in gl.static_range(FY):
                u = base + s
                x_row = x_next
                dy_row = dy_next
                ih = u + 1 - PH
                x_next = gl.load(x_rows + ih * sxh, mask=x_ok & (ih >= 0) & (ih < H) & (u + 1 < u_end), other=0.0)
                dy_next = gl.load(dy_rows + (u + 1) * syh, mask=dy_ok & (u + 1 < oh_end), other=0.0)
                newest = gl.convert_layout(dy_row, b_layout)
                rolled = ()
                for t in gl.static_range(FY):
                    rolled = rolled + ((newest if t == s else dys[t]),)
                dys = rolled
                a = gl.convert_layout(gl.permute(x_row, [0, 2, 1]), a_layout)
                summed = ()
                for fy in gl.static_range(FY):
                    summed = summed + (mma_v2(a, dys[(s - fy + FY) % FY], sums[fy]),)
                sums = summed

    # dw[c, fy, s] = the sum of S_fy along its diagonal k - j = s, into this program's slab: a gather
    # within the warp turns each diagonal into a row (D[s, j] = S[j + s, j]), then one sum along j.
    d = gl.arange(0, KW, gl.SliceLayout(0, gl.SliceLayout(2, mma)))[None, :, None]
    jj = gl.arange(0, NW, gl.SliceLayout(0, gl.SliceLayout(1, mma)))[None, None, :]
    on_band = d + jj < KW
    diagonal = gl.zeros([BLOCK_C, KW, NW], gl.int32, mma) + gl.where(on_band, d + jj, 0)
    cc = pid_c * BLOCK_C + gl.arange(0, BLOCK_C, gl.SliceLayout(1, gl.SliceLayout(2, mma)))
    tap = gl.arange(0, KW, gl.SliceLayout(0, gl.SliceLayout(2, mma)))[None, :]
    slab = ws_ptr + (pid_s * C + cc).to(gl.int64)[:, None] * (FY * FX) + tap
    for fy in gl.static_range(FY):
        total = gl.sum(gl.where(on_band, gl.gather(sums[fy], diagonal, 1), 0.0), axis=2)
        gl.store(slab + fy * FX, total, mask=(cc < C)[:, None] & (tap < FX))
