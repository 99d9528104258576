"""Family `direct`: depthwise and few-channels-per-group convolution on CUDA cores, at the bandwidth limit.

These problems do 2 * (C/G) * taps FLOPs per output element, far too few for tensor
cores to matter: the time is the bytes. A program owns BLOCK_P pixels x BLOCK_C
channels; in channels-last BLOCK_C consecutive channels are one vector load per pixel,
and the reuse between neighbouring taps is served by L1/L2. DEPTHWISE (C/G = K/G = 1)
drops the per-lane group arithmetic so the channel loads stay provably contiguous.
Same arguments as the implicit-GEMM kernels, so one plan serves both families. The
depthwise window kernels (below the per-tap ones) build on the run and tap bookkeeping
of window.py.
"""

import triton
import triton.language as tl

from ...gemm.kernels.epilogue import apply_epilogue
from .geometry import advance_pixel, inside, next_tap, source_of, split_pixel, split_tap, target_of
from .window import program_tile, weight_window_tile, window_columns, window_output, window_row, zero_tiles

# The plan's kernel units name the six kernels; the host reads the window geometry
# (window_columns, window_output) from here as well.
__all__ = ["conv_fwd_direct", "conv_bwd_data_direct", "conv_bwd_weight_direct", "conv_fwd_direct_window",
           "conv_bwd_data_direct_window", "conv_bwd_weight_direct_window", "window_columns", "window_output"]


@triton.jit
def conv_fwd_direct(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                    N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                    SD, SH, SW, PD, PH, PW, DD, DH, DW,
                    sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT_K: tl.constexpr,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                    VEC: tl.constexpr, DEPTHWISE: tl.constexpr, UNIT_STRIDE: tl.constexpr):
    """Lanes are output channels k (all groups); each sums C/G input channels of its group over the taps."""
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    K = G * KG // VEC * VEC
    M = N * OD * OH * OW
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_p = offs_p < M
    in_k = offs_k < K
    n, od, oh, ow = split_pixel(offs_p, OD, OH, OW)
    sxd_v, sxh_v, sxw_v = sxd // VEC * VEC, sxh // VEC * VEC, sxw // VEC * VEC
    if DEPTHWISE:
        x_ch = offs_k
    else:
        x_ch = (offs_k // KG) * CG
    # Hoisted out of the tap loop: each row's input pixel at tap 0 and its pointers; a tap
    # adds one scalar offset and checks the rows against the borders (unsigned compares).
    d0 = od * SD - PD
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    x_rows = n.to(tl.int64) * (sxn // VEC * VEC) + d0 * sxd_v + h0 * sxh_v + w0 * sxw_v
    x_ptrs = x_ptr + x_rows[:, None] + x_ch[None, :]
    w_ptrs = w_ptr + offs_k.to(tl.int64) * swk

    fz = tl.full((), 0, tl.int32)  # the tap, carried: see next_step
    fy = fz
    fx = fz
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for _ in range(FZ * FY * FX):
        ok = in_p & inside(d0 + fz * DD, D) & inside(h0 + fy * DH, H) & inside(w0 + fx * DW, W)
        x_off = (fz * DD) * sxd_v + (fy * DH) * sxh_v + (fx * DW) * sxw_v
        w_off = fz * swz + fy * swy + fx * swx
        mask = ok[:, None] & in_k[None, :]
        if DEPTHWISE:
            xv = tl.load(x_ptrs + x_off, mask=mask, other=0.0)
            wv = tl.load(w_ptrs + w_off, mask=in_k, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
        else:
            for c in range(CG):
                xv = tl.load(x_ptrs + (x_off + c), mask=mask, other=0.0)
                wv = tl.load(w_ptrs + (w_off + c), mask=in_k, other=0.0)
                acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
        fz, fy, fx = next_tap(fz, fy, fx, FY, FX)

    acc = apply_epilogue(acc, offs_p, offs_k, M, K, 0, bias_ptr, bias_ptr, bias_ptr, 1,
                         res_ptr, 0, 0, 0, False, HAS_BIAS, ACTIVATION, False)
    mask = in_p[:, None] & in_k[None, :]
    if HAS_RESIDUAL:
        r_row = n.to(tl.int64) * srn + od * srd + oh * srh + ow * srw
        acc += tl.load(res_ptr + r_row[:, None] + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    y_row = (n.to(tl.int64) * (syn // VEC * VEC) + od * (syd // VEC * VEC) + oh * (syh // VEC * VEC)
             + ow * (syw // VEC * VEC))
    tl.store(y_ptr + y_row[:, None] + offs_k[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def conv_bwd_data_direct(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                         N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                         SD, SH, SW, PD, PH, PW, DD, DH, DW,
                         sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT_K: tl.constexpr,
                         HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                         VEC: tl.constexpr, DEPTHWISE: tl.constexpr, UNIT_STRIDE: tl.constexpr):
    """Lanes are input channels c (all groups); each sums the K/G output channels of its group over the taps."""
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    C = G * CG // VEC * VEC
    M = N * D * H * W
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_p = offs_p < M
    in_c = offs_c < C
    n, idd, ih, iw = split_pixel(offs_p, D, H, W)
    syd_v, syh_v, syw_v = syd // VEC * VEC, syh // VEC * VEC, syw // VEC * VEC
    dy_n = n.to(tl.int64) * (syn // VEC * VEC)
    if DEPTHWISE:
        k_first = offs_c
        c_in_group = offs_c * 0
    else:
        k_first = (offs_c // CG) * KG
        c_in_group = offs_c % CG
    # Stride 1: a tap's output pixel is the row's (i + P) minus the tap's offset, so the rows'
    # pointers are hoisted and a tap adds one scalar, as in the forward kernel.
    d0 = idd + PD
    h0 = ih + PH
    w0 = iw + PW
    if UNIT_STRIDE:
        dy_ptrs = y_ptr + (dy_n + d0 * syd_v + h0 * syh_v + w0 * syw_v)[:, None] + k_first[None, :]
    else:
        dy_ptrs = y_ptr + dy_n[:, None] + k_first[None, :]
    w_ptrs = w_ptr + k_first.to(tl.int64) * swk + c_in_group

    fz = tl.full((), 0, tl.int32)  # the tap, carried: see next_step
    fy = fz
    fx = fz
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for _ in range(FZ * FY * FX):
        if UNIT_STRIDE:
            ok = in_p & inside(d0 - fz * DD, OD) & inside(h0 - fy * DH, OH) & inside(w0 - fx * DW, OW)
            at = dy_ptrs - ((fz * DD) * syd_v + (fy * DH) * syh_v + (fx * DW) * syw_v)
        else:
            od, ok_d = target_of(idd, fz, OD, SD, PD, DD)
            oh, ok_h = target_of(ih, fy, OH, SH, PH, DH)
            ow, ok_w = target_of(iw, fx, OW, SW, PW, DW)
            ok = in_p & ok_d & ok_h & ok_w
            at = dy_ptrs + (od * syd_v + oh * syh_v + ow * syw_v)[:, None]
        w_tap = w_ptrs + (fz * swz + fy * swy + fx * swx)
        mask = ok[:, None] & in_c[None, :]
        if DEPTHWISE:  # one output channel per lane: no loop over K/G
            dyv = tl.load(at, mask=mask, other=0.0)
            wv = tl.load(w_tap, mask=in_c, other=0.0)
            acc += dyv.to(tl.float32) * wv.to(tl.float32)[None, :]
        else:
            for kk in range(KG):
                dyv = tl.load(at + kk, mask=mask, other=0.0)
                wv = tl.load(w_tap + kk * swk, mask=in_c, other=0.0)
                acc += dyv.to(tl.float32) * wv.to(tl.float32)[None, :]
        fz, fy, fx = next_tap(fz, fy, fx, FY, FX)

    x_row = (n.to(tl.int64) * (sxn // VEC * VEC) + idd * (sxd // VEC * VEC) + ih * (sxh // VEC * VEC)
             + iw * (sxw // VEC * VEC))
    tl.store(x_ptr + x_row[:, None] + offs_c[None, :], acc.to(x_ptr.dtype.element_ty),
             mask=in_p[:, None] & in_c[None, :])


@triton.jit
def conv_bwd_weight_direct(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                           N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                           SD, SH, SW, PD, PH, PW, DD, DH, DW,
                           sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                           BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT_K: tl.constexpr,
                           HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                           VEC: tl.constexpr, DEPTHWISE: tl.constexpr, UNIT_STRIDE: tl.constexpr):
    """Lanes are weights (k, c), over every tap; the pixels split over SPLIT_K programs (grid axis 1).

    Taps are the outer loop and this program's pixels the inner one, so the dy and x
    rows a program reads for its first tap are still in L1/L2 for the others: memory
    sees each byte about once, not once per tap. Products are summed per lane in a
    BLOCK_P x BLOCK_C tile and reduced over pixels once per tap. With SPLIT_K > 1 the
    sums go to the fp32 workspace [SPLIT_K, K, taps, C/G] that `conv_weight_reduce` finishes.
    """
    pid_c = tl.program_id(0)
    pid_s = tl.program_id(1)
    K = G * KG // VEC * VEC
    taps = FZ * FY * FX
    offs_j = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)  # flat (k, c) over K x C/G
    in_j = offs_j < K * CG
    if DEPTHWISE:
        k = offs_j
        c = offs_j * 0
        x_ch = offs_j
    else:
        k = offs_j // CG
        c = offs_j % CG
        x_ch = (k // KG) * CG + c

    P = N * OD * OH * OW
    p_tiles = tl.cdiv(P, BLOCK_P)
    per_split = tl.cdiv(p_tiles, SPLIT_K)
    p_first = pid_s * per_split
    p_last = min(p_first + per_split, p_tiles)
    for tap in range(taps):
        fz, fy, fx = split_tap(tap, FY, FX)
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        for pt in range(p_first, p_last):
            offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
            in_p = offs_p < P
            n, od, oh, ow = split_pixel(offs_p, OD, OH, OW)
            dy_row = (n.to(tl.int64) * (syn // VEC * VEC) + od * (syd // VEC * VEC) + oh * (syh // VEC * VEC)
                      + ow * (syw // VEC * VEC))
            dyv = tl.load(y_ptr + dy_row[:, None] + k[None, :], mask=in_p[:, None] & in_j[None, :], other=0.0)
            idd, ok_d = source_of(od, fz, D, SD, PD, DD)
            ih, ok_h = source_of(oh, fy, H, SH, PH, DH)
            iw, ok_w = source_of(ow, fx, W, SW, PW, DW)
            ok = in_p & ok_d & ok_h & ok_w
            x_row = (n.to(tl.int64) * (sxn // VEC * VEC) + idd * (sxd // VEC * VEC) + ih * (sxh // VEC * VEC)
                     + iw * (sxw // VEC * VEC))
            xv = tl.load(x_ptr + x_row[:, None] + x_ch[None, :], mask=ok[:, None] & in_j[None, :], other=0.0)
            acc += dyv.to(tl.float32) * xv.to(tl.float32)
        total = tl.sum(acc, axis=0)
        if SPLIT_K == 1:
            w_off = k.to(tl.int64) * swk + fz * swz + fy * swy + fx * swx + c
            tl.store(w_ptr + w_off, total.to(w_ptr.dtype.element_ty), mask=in_j)
        else:
            slab = pid_s.to(tl.int64) * K * taps * CG
            tl.store(ws_ptr + slab + (k.to(tl.int64) * taps + tap) * CG + c, total, mask=in_j)


# -- depthwise by sliding windows ------------------------------------------------------------
# The per-tap kernels above spend ~6 SASS instructions a output-tap (sm_90: 385 a tap for 64
# FMAs in the 128x64 w4 tile): a 16-byte load, its widening, border mask and address for
# every tap of every pixel. Below, a thread holds RUN neighbouring output pixels of one
# row (W) for a vector of channels: for each filter row it loads the RUN + WINDOW - 1
# input pixels that row needs once, widens each once, and adds each into the WINDOW
# outputs it touches (register reuse along W); the filter row's weights are loaded once
# for the RUN outputs. The loops over taps in W are unrolled (WINDOW = the filter width
# is a constexpr of the config), the rows of the filter (H, D) are runtime loops, so any
# stride, padding and dilation there is served; along W the window is built for one stride
# (WINDOW_STRIDE, 1 or 2) and dilation 1 (`supports` sends other problems to the per-tap kernels).
# At stride 2 a forward run reads its 2 (RUN - 1) + WINDOW input columns once, each feeding the
# half of the taps whose outputs it reaches; a backward-data run of RUN input columns reads the
# (RUN + WINDOW - 1) / 2 dy columns that reach it, and each of its columns takes the taps of its
# parity. So the downsampling layers of MobileNet and EfficientNet load each byte once too.


@triton.jit
def conv_fwd_direct_window(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                           N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                           SD, SH, SW, PD, PH, PW, DD, DH, DW,
                           sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                           BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT_K: tl.constexpr,
                           HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                           VEC: tl.constexpr, DEPTHWISE: tl.constexpr, UNIT_STRIDE: tl.constexpr,
                           RUN: tl.constexpr, WINDOW: tl.constexpr, WINDOW_STRIDE: tl.constexpr,
                           ONE_ROW: tl.constexpr):
    """Depthwise forward (C/G = K/G = 1, FX = WINDOW, stride WINDOW_STRIDE and dilation 1 along W).

    Rows of the tile are runs of RUN output pixels along W, (n, od, oh, run) flattened
    with the runs fastest; lanes are channels.
    """
    C = G // VEC * VEC
    pid_p, pid_c = program_tile(C, BLOCK_C)
    runs = tl.cdiv(OW, RUN)
    Q = N * OD * OH * runs
    offs_q = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_q = offs_q < Q
    in_c = offs_c < C
    n, od, oh, r = split_pixel(offs_q, OD, OH, runs)
    ow0 = r * RUN
    sxd_v, sxh_v, sxw_v = sxd // VEC * VEC, sxh // VEC * VEC, sxw // VEC * VEC
    d0 = od * SD - PD
    h0 = oh * SH - PH
    w0 = ow0 * WINDOW_STRIDE - PW
    src0 = x_ptr + (n.to(tl.int64) * (sxn // VEC * VEC) + d0 * sxd_v + h0 * sxh_v + w0 * sxw_v)
    w_ch = w_ptr + tl.minimum(offs_c, C - 1).to(tl.int64) * swk  # clamped: see window_row

    acc = zero_tiles(BLOCK_P, BLOCK_C, RUN)
    # ONE_ROW (a filter of one row): the loops are one iteration the compiler drops, so each output's
    # registers are free once it is stored, not held across a loop (Mamba's k4 run of 14: 142, not 253).
    for fz in range(1 if ONE_ROW else FZ):
        ok_d = in_q & inside(d0 + fz * DD, D)
        for fy in range(1 if ONE_ROW else FY):
            row_ok = ok_d & inside(h0 + fy * DH, H)
            src = src0 + ((fz * DD) * sxd_v + (fy * DH) * sxh_v)
            acc = window_row(acc, src, row_ok, w0, W, sxw_v, offs_c, in_c, w_ch + (fz * swz + fy * swy),
                             RUN, WINDOW, WINDOW_STRIDE, False)

    y_row = (n.to(tl.int64) * (syn // VEC * VEC) + od * (syd // VEC * VEC) + oh * (syh // VEC * VEC)
             + ow0 * (syw // VEC * VEC))
    r_row = n.to(tl.int64) * srn + od * srd + oh * srh + ow0 * srw
    for t in tl.static_range(RUN):
        out = acc[t]
        in_p = in_q & (ow0 + t < OW)
        # The epilogue's own residual masks by row index < M: rows here are runs, so it is added below.
        out = apply_epilogue(out, offs_q, offs_c, Q, C, 0, bias_ptr, bias_ptr, bias_ptr, 1,
                             res_ptr, 0, 0, 0, False, HAS_BIAS, ACTIVATION, False)
        mask = in_p[:, None] & in_c[None, :]
        if HAS_RESIDUAL:
            at = res_ptr + (r_row + t * srw)[:, None] + offs_c[None, :]
            out += tl.load(at, mask=mask, other=0.0).to(tl.float32)
        at = y_ptr + (y_row + t * (syw // VEC * VEC))[:, None] + offs_c[None, :]
        tl.store(at, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def conv_bwd_data_direct_window(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                                N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                                SD, SH, SW, PD, PH, PW, DD, DH, DW,
                                sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                                BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT_K: tl.constexpr,
                                HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                                VEC: tl.constexpr, DEPTHWISE: tl.constexpr, UNIT_STRIDE: tl.constexpr,
                                RUN: tl.constexpr, WINDOW: tl.constexpr, WINDOW_STRIDE: tl.constexpr,
                                ONE_ROW: tl.constexpr):
    """Depthwise backward-data: the window over dy, each dy column into the outputs it reaches.

    Along W, dx[iw] = sum_x w[x] dy[(iw + PW - x) / S] over the x that divide (S = WINDOW_STRIDE).
    The run of RUN input columns at iw0 reads dy columns col0 + j, col0 = (iw0 + PW - (WINDOW - 1)) / S,
    and column j reaches output t = S j + x - (WINDOW - 1) through tap x. At S = 2 that needs
    iw0 + PW - (WINDOW - 1) even: the runs start `shift` (0 or 1) columns before a multiple of
    RUN (RUN even, rules.py), so the first one may begin at column -1, masked. Along D and H
    any stride and dilation: each filter row finds its dy row (or none) as the per-tap kernel does.
    """
    C = G // VEC * VEC
    pid_p, pid_c = program_tile(C, BLOCK_C)
    shift = (PW + WINDOW + 1) % WINDOW_STRIDE  # (PW - (WINDOW - 1)) mod S, kept non-negative
    runs = tl.cdiv(W + shift, RUN)
    Q = N * D * H * runs
    offs_q = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_q = offs_q < Q
    in_c = offs_c < C
    n, idd, ih, r = split_pixel(offs_q, D, H, runs)
    iw0 = r * RUN - shift
    syd_v, syh_v, syw_v = syd // VEC * VEC, syh // VEC * VEC, syw // VEC * VEC
    col0 = (iw0 + PW - (WINDOW - 1)) // WINDOW_STRIDE  # exact: the numerator is a multiple of S
    dy_n = y_ptr + (n.to(tl.int64) * (syn // VEC * VEC) + col0 * syw_v)
    w_ch = w_ptr + tl.minimum(offs_c, C - 1).to(tl.int64) * swk  # clamped: see window_row

    acc = zero_tiles(BLOCK_P, BLOCK_C, RUN)
    for fz in range(1 if ONE_ROW else FZ):  # see conv_fwd_direct_window
        if UNIT_STRIDE:
            od = idd + PD - fz * DD
            ok_d = in_q & inside(od, OD)
        else:
            od, ok_d = target_of(idd, fz, OD, SD, PD, DD)
            ok_d = in_q & ok_d
        for fy in range(1 if ONE_ROW else FY):
            if UNIT_STRIDE:
                oh = ih + PH - fy * DH
                row_ok = ok_d & inside(oh, OH)
            else:
                oh, ok_h = target_of(ih, fy, OH, SH, PH, DH)
                row_ok = ok_d & ok_h
            src = dy_n + (od * syd_v + oh * syh_v)
            acc = window_row(acc, src, row_ok, col0, OW, syw_v, offs_c, in_c, w_ch + (fz * swz + fy * swy),
                             RUN, WINDOW, WINDOW_STRIDE, True)

    x_row = (n.to(tl.int64) * (sxn // VEC * VEC) + idd * (sxd // VEC * VEC) + ih * (sxh // VEC * VEC)
             + iw0 * (sxw // VEC * VEC))
    for t in tl.static_range(RUN):
        mask = (in_q & inside(iw0 + t, W))[:, None] & in_c[None, :]
        at = x_ptr + (x_row + t * (sxw // VEC * VEC))[:, None] + offs_c[None, :]
        tl.store(at, acc[t].to(x_ptr.dtype.element_ty), mask=mask)


# -- depthwise backward-weight by sliding windows --------------------------------------------
# dw[c, fy, fx] = sum over output pixels of x[ih(oh, fy), ow + fx - PW, c] * dy[oh, ow, c]. The
# per-tap kernel above loads a dy and an x vector per (pixel, tap), widens both and makes one
# vector FMA of them, then sums a tile over its pixels once per tap. Here a thread holds a run
# of RUN output pixels along W for one channel vector: it loads the run's dy once (widened once),
# then for each of ROWS filter rows loads the RUN + WINDOW - 1 input pixels that row sees once
# and adds each into the WINDOW taps it meets. The accumulators are the taps themselves
# (ROWS x WINDOW per channel), held over the program's whole share of the pixels and summed
# across the tile's runs once at the end: the loads and widenings of the per-tap kernel are
# shared by WINDOW (x) and ROWS x WINDOW (dy) FMAs, and there is one cross-thread sum per tap
# and program instead of one per tap and tile.


@triton.jit
def conv_bwd_weight_direct_window(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                                  N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                                  SD, SH, SW, PD, PH, PW, DD, DH, DW,
                                  sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                                  BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT_K: tl.constexpr,
                                  HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                                  VEC: tl.constexpr, DEPTHWISE: tl.constexpr, UNIT_STRIDE: tl.constexpr,
                                  RUN: tl.constexpr, WINDOW: tl.constexpr, ROWS: tl.constexpr,
                                  BAND: tl.constexpr, WINDOW_STRIDE: tl.constexpr):
    """Depthwise backward-weight (C/G = K/G = 1, FX = WINDOW, stride WINDOW_STRIDE and dilation 1 along W).

    Grid: (channel blocks, SPLIT_K). Rows of the tile are blocks of BAND output rows x RUN
    output pixels along W, (n, od, oh / BAND, run) flattened with the runs fastest; program
    pid_s takes a contiguous share of the tiles of BLOCK_P blocks, stepping their
    coordinates by carries (no division a tile). Filter rows are held ROWS at a time: one
    pass over the share per group of ROWS rows and per plane fz (ROWS = FY, FZ = 1: one
    pass). Along D and H any stride and dilation (BAND = 1). With SPLIT_K > 1 each program
    writes its sums to its own fp32 slab of the workspace [SPLIT_K, C, taps], which
    `conv_weight_reduce` sums in order; with SPLIT_K = 1 it stores dw by its strides.
    """
    pid_c = tl.program_id(0)
    pid_s = tl.program_id(1)
    C = G // VEC * VEC
    taps = FZ * FY * WINDOW
    runs = tl.cdiv(OW, RUN)
    OHB = tl.cdiv(OH, BAND)
    Q = N * OD * OHB * runs
    q_tiles = tl.cdiv(Q, BLOCK_P)
    per_split = tl.cdiv(q_tiles, SPLIT_K)
    q_first = pid_s * per_split
    q_last = tl.minimum(q_first + per_split, q_tiles)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    sxn_v, sxd_v, sxh_v, sxw_v = sxn // VEC * VEC, sxd // VEC * VEC, sxh // VEC * VEC, sxw // VEC * VEC
    syn_v, syd_v, syh_v, syw_v = syn // VEC * VEC, syd // VEC * VEC, syh // VEC * VEC, syw // VEC * VEC
    # A tile's step of BLOCK_P runs as digits over (n, od, oh, run), for advance_pixel.
    step_r = BLOCK_P % runs
    step_h = BLOCK_P // runs % OHB
    step_d = BLOCK_P // runs // OHB % OD
    step_n = BLOCK_P // runs // OHB // OD
    slab = ws_ptr + pid_s.to(tl.int64) * C * taps
    for fz in range(FZ):
        for fy0 in range(0, FY, ROWS):
            acc = zero_tiles(BLOCK_P, BLOCK_C, ROWS * WINDOW)
            offs_q = q_first * BLOCK_P + tl.arange(0, BLOCK_P)
            n, od, ohb, r = split_pixel(offs_q, OD, OHB, runs)
            for _ in range(q_first, q_last):
                acc = weight_window_tile(acc, offs_q < Q, n, od, ohb, r, fz, fy0, x_ptr, y_ptr, offs_c, in_c,
                                         D, H, W, OH, OW, SD, SH, PD, PH, PW, DD, DH,
                                         sxn_v, sxd_v, sxh_v, sxw_v, syn_v, syd_v, syh_v, syw_v,
                                         RUN, WINDOW, ROWS, BAND, WINDOW_STRIDE)
                od, ohb, r, wrap_d, _wrap_h, _wrap_r = advance_pixel(od, ohb, r, step_d, step_h, step_r, OD, OHB,
                                                                     runs)
                n += step_n + wrap_d.to(tl.int32)
                offs_q += BLOCK_P
            for i in tl.static_range(ROWS):
                fy = fy0 + i
                ok = in_c & (fy < FY)
                for s in tl.static_range(WINDOW):
                    total = tl.sum(acc[i * WINDOW + s], axis=0)
                    if SPLIT_K == 1:
                        at = w_ptr + offs_c.to(tl.int64) * swk + fz * swz + fy * swy + s * swx
                        tl.store(at, total.to(w_ptr.dtype.element_ty), mask=ok)
                    else:
                        tap = (fz * FY + fy) * WINDOW + s
                        tl.store(slab + offs_c.to(tl.int64) * taps + tap, total, mask=ok)
