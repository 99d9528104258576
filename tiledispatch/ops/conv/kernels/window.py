"""The sliding-window parts of the direct family's depthwise window kernels (direct.py).

A window kernel's thread holds a run of RUN neighbouring pixels along W for a vector of
channels and keeps its accumulators as a tuple of BLOCK_P x BLOCK_C tiles, one a run
position (forward, backward-data) or one a tap (backward-weight): the helpers here say
which source column feeds which accumulator through which tap, load each source vector
once and add it into every accumulator it reaches. The tuples' indices are constexprs,
so the adds unroll to straight-line FMAs on registers.
"""

import triton
import triton.language as tl

from .geometry import inside


@triton.constexpr_function
def window_columns(run, window, stride, transposed):
    """Source columns a run reads a filter row (the host's DirectConfig.window_columns calls this)."""
    if transposed:
        return (run + window - 2) // stride + 1
    return (run - 1) * stride + window


@triton.constexpr_function
def window_output(j, s, run, window, stride, transposed):
    """The run position that source column j reaches through tap s, or -1 where it reaches none:
    t with t * stride + s = j, or (transposed) t = j * stride + s - (window - 1)."""
    if transposed:
        t = j * stride + s - (window - 1)
    elif (j - s) % stride == 0:
        t = (j - s) // stride
    else:
        return -1
    return t if 0 <= t < run else -1


@triton.jit
def _set(acc, i: tl.constexpr, value):
    """The tuple `acc` with item i replaced (Triton tuples are immutable)."""
    out = ()
    for t in tl.static_range(len(acc)):
        if t == i:
            out = out + (value,)
        else:
            out = out + (acc[t],)
    return out


@triton.jit
def _add(acc, i: tl.constexpr, value):
    """The tuple `acc` with `value` added into item i."""
    return _set(acc, i, acc[i] + value)


@triton.jit
def zero_tiles(BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, COUNT: tl.constexpr):
    """COUNT fp32 zero tiles of BLOCK_P x BLOCK_C, as a tuple: a window kernel's accumulators."""
    acc = ()
    for _t in tl.static_range(COUNT):
        acc = acc + (tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32),)
    return acc


@triton.jit
def program_tile(C, BLOCK_C: tl.constexpr):
    """(pixel block, channel block) of this program, in the order the plan chose by the grid's shape.

    A grid of (pixel blocks, channel blocks) steps the pixel blocks fastest; a grid of one
    axis steps the channel blocks fastest, so that the programs running at once read whole
    pixels of neighbouring runs rather than one BLOCK_C slice of pixels far apart
    (plan.channels_fastest says where that pays). With one channel block the two agree.
    """
    if tl.num_programs(1) == 1:
        blocks = tl.cdiv(C, BLOCK_C)
        pid = tl.program_id(0)
        return pid // blocks, pid % blocks
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def _widen(v):
    """v as fp32. bf16 pairs by two bit operations (the low half shifted up, the high half masked):
    Triton's cvt.f32.bf16 became PRMT + SHF for each high half in sm_90 SASS (12 instructions a
    16-byte vector instead of 8). Under the interpreter (no bf16 there) a plain conversion."""
    if v.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [v],
                                         dtype=tl.float32, is_pure=True, pack=2)
    else:
        return v.to(tl.float32)


@triton.jit
def window_row(acc, src, row_ok, col0, cols, col_stride, offs_c, in_c, w_row,
               RUN: tl.constexpr, WINDOW: tl.constexpr, STEP: tl.constexpr, TRANSPOSED: tl.constexpr):
    """Adds one filter row into the RUN accumulators of each pixel run.

    src: [BLOCK_P] pointers to source column 0 (channel 0) of each run; col0: that column's
    index, checked against `cols`; row_ok: the source row exists. Forward: output t of a run
    takes source column t * STEP + s times filter tap s. TRANSPOSED (backward-data, the source
    is dy): source column j reaches output t = j * STEP + x - (WINDOW - 1) through tap x, where
    that t lies in the run (at stride 1 the correlation with the flipped filter). w_row:
    [BLOCK_C] pointers to tap 0 of the filter row, valid for every lane (channels past C are
    clamped to C - 1, so the weight loads need no mask: those lanes are never stored). The
    filter's taps along W are contiguous (the plan copies a weight whose are not): the tap
    offsets are then immediates of the loads. With the stride as a runtime value (sm_90 SASS,
    16x64 w4, window 7, run 2) ptxas kept a 64-bit pointer per (channel, tap), 255 registers
    and spills, against 113 registers and 411 instead of 511 instructions a filter row.
    """
    wts = ()
    for s in tl.static_range(WINDOW):
        wts = wts + (tl.load(w_row + s).to(tl.float32)[None, :],)  # taps contiguous: see above
    first = src[:, None] + offs_c[None, :]
    for j in tl.static_range(window_columns(RUN, WINDOW, STEP, TRANSPOSED)):
        ok = row_ok & inside(col0 + j, cols)
        xv = _widen(tl.load(first + j * col_stride, mask=ok[:, None] & in_c[None, :], other=0.0))
        for s in tl.static_range(WINDOW):
            # called twice, not named: a name bound to it would hold a tensor, which cannot index a tuple
            if window_output(j, s, RUN, WINDOW, STEP, TRANSPOSED) >= 0:
                acc = _add(acc, window_output(j, s, RUN, WINDOW, STEP, TRANSPOSED), xv * wts[s])
    return acc


@triton.jit
def weight_window_tile(acc, in_q, n, od, ohb, r, fz, fy0, x_ptr, y_ptr, offs_c, in_c,
                       D, H, W, OH, OW, SD, SH, PD, PH, PW, DD, DH,
                       sxn_v, sxd_v, sxh_v, sxw_v, syn_v, syd_v, syh_v, syw_v,
                       RUN: tl.constexpr, WINDOW: tl.constexpr, ROWS: tl.constexpr, BAND: tl.constexpr,
                       STEP: tl.constexpr):
    """Adds one tile of blocks (BAND output rows x RUN output pixels along W each) into the
    ROWS x WINDOW tap accumulators of filter rows fy0 .. fy0 + ROWS - 1 of plane fz.

    Output (b, t) of a block meets input row u = b + i at filter row i (BAND > 1 is taken at
    stride and dilation 1 along H only) and input column ow0 STEP - PW + t STEP + s at tap s
    (STEP: the stride along W): the BAND + ROWS - 1 input rows a block sees are loaded once
    each, and column j of row u feeds taps (i, s) = (u - b, j - t STEP) for the (b, t) in
    reach. dy past OH or OW loads as zero, so those products add nothing; sums of rows past
    FY (ROWS not dividing FY) are not stored.
    """
    oh0 = ohb * BAND
    ow0 = r * RUN
    n64 = n.to(tl.int64)
    dy_row = y_ptr + (n64 * syn_v + od * syd_v + oh0 * syh_v + ow0 * syw_v)
    dys = ()  # (b, t) at b * RUN + t
    for b in tl.static_range(BAND):
        for t in tl.static_range(RUN):
            ok = in_q & (oh0 + b < OH) & (ow0 + t < OW)
            at = dy_row[:, None] + (b * syh_v + t * syw_v + offs_c)[None, :]
            dys = dys + (_widen(tl.load(at, mask=ok[:, None] & in_c[None, :], other=0.0)),)
    idd = od * SD - PD + fz * DD
    col0 = ow0 * STEP - PW
    ok_d = in_q & inside(idd, D)
    x_run = x_ptr + (n64 * sxn_v + idd * sxd_v + col0 * sxw_v)
    for u in tl.static_range(BAND + ROWS - 1):
        ih = oh0 * SH - PH + (fy0 + u) * DH
        row_ok = ok_d & inside(ih, H)
        src = x_run + ih * sxh_v
        for j in tl.static_range(window_columns(RUN, WINDOW, STEP, False)):
            ok = row_ok & inside(col0 + j, W)
            xv = _widen(tl.load(src[:, None] + (j * sxw_v + offs_c)[None, :], mask=ok[:, None] & in_c[None, :],
                                other=0.0))
            for b in tl.static_range(BAND):
                for s in tl.static_range(WINDOW):
                    if u - b >= 0 and u - b < ROWS and window_output(j, s, RUN, WINDOW, STEP, False) >= 0:
                        acc = _add(acc, (u - b) * WINDOW + s,
                                   xv * dys[b * RUN + window_output(j, s, RUN, WINDOW, STEP, False)])
    return acc


