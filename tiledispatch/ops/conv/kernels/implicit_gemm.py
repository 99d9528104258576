"""Family `igemm`: implicit GEMM on tensor cores, one kernel per direction, groups on grid axis 1.

Every kernel takes the same arguments: the three tensors (x, w, y: y stands for dy in
the backward directions), bias, residual and the split-K workspace, the 3-D geometry,
and the strides of every non-channel dim (channels are contiguous: NDHWGC / GKZYXC /
NDHWGK). VEC is the vector width (in elements) the data's alignment allows: sizes and
strides are rounded with ``// VEC * VEC``, a no-op on the data it is compiled for, which
lets the compiler prove aligned vector loads along channels. VEC_Y is the same for the
output-channel side alone (y or dy, K/G): a C=3 stem has VEC 1 but reads dy and writes y
in 16-byte vectors (one element at a time there made its kernels 4-20x slower, H200).

The reduction walks (tap, channel block) in one flat loop, so the software pipeline
spans all taps instead of restarting at each. What a step costs besides its MMAs was
what made these kernels slow (sm_90 SASS, 128x128x64 with 8 warps: 396 instructions a
step forward, 738 backward-data, against 4 wgmma): so each row's pixel and pointers are
computed once before the loop, a step adds one scalar offset for its (tap, channel
block), carried from step to step by compares instead of divisions (`next_step`), checks
rows against the borders with unsigned compares (`inside`), and with EVEN_K (C/G a
multiple of BLOCK_K) has no channel mask at all: 195-199 instructions a step.
"""

import triton
import triton.language as tl

from ...gemm.kernels.epilogue import apply_epilogue
from ...gemm.kernels.tile_order import grouped_tile
from .geometry import advance_pixel, inside, linear_walk, next_step, phase_taps, split_pixel, split_tap, walk
from .weight_reduce import store_weight_partial


@triton.jit
def conv_fwd_igemm(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                   N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                   SD, SH, SW, PD, PH, PW, DD, DH, DW,
                   sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                   HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr, VEC: tl.constexpr,
                   VEC_Y: tl.constexpr, POINTWISE: tl.constexpr, GROUPS_PER_TILE: tl.constexpr, EVEN_K: tl.constexpr,
                   UNIT_STRIDE: tl.constexpr):
    """y[n, o, g, k] = sum over taps and c of x[n, o*S-P+tap*D, g, c] * w[g, k, tap, c]: M = pixels, N = K/G.

    GROUPS_PER_TILE > 1 merges that many groups into one tile when C/G and K/G are small:
    N = their K/G x GROUPS_PER_TILE output channels, the reduction their input channels,
    and the weight tile block-diagonal (zero across groups). The MMAs do GROUPS_PER_TILE
    times the useful work, but the channel runs loaded and stored get that much longer.
    """
    pid = tl.program_id(0)
    g = tl.program_id(1) * GROUPS_PER_TILE  # the tile's first group
    CG = CG // VEC * VEC
    KG = KG // VEC_Y * VEC_Y
    if GROUPS_PER_TILE == 1:
        n_valid = KG
        c_valid = CG
    else:  # the last tile may hold fewer groups
        n_valid = min(GROUPS_PER_TILE, G - g) * KG
        c_valid = min(GROUPS_PER_TILE, G - g) * CG
    M = N * OD * OH * OW
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(GROUPS_PER_TILE * KG, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_m = offs_m < M
    in_n = offs_n < n_valid
    n, od, oh, ow = split_pixel(offs_m, OD, OH, OW)
    sxd_v, sxh_v, sxw_v = sxd // VEC * VEC, sxh // VEC * VEC, sxw // VEC * VEC
    swz_v, swy_v, swx_v = swz // VEC * VEC, swy // VEC * VEC, swx // VEC * VEC
    # Hoisted out of the loop: each row's input pixel at tap 0 and its pointers; a step only
    # adds one scalar offset (tap and channel block) and checks the rows against the borders.
    d0 = od * SD - PD
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    x_rows = n.to(tl.int64) * (sxn // VEC * VEC) + d0 * sxd_v + h0 * sxh_v + w0 * sxw_v + g * CG
    a_ptrs = x_ptr + x_rows[:, None] + offs_k[None, :]
    w_col = (g * KG + offs_n).to(tl.int64) * (swk // VEC * VEC)
    if GROUPS_PER_TILE == 1:
        b_ptrs = w_ptr + w_col[None, :] + offs_k[:, None]
    else:  # merged channel c belongs to group c // CG: its weight is that group's channel c % CG
        b_ptrs = w_ptr + w_col[None, :] + (offs_k % CG)[:, None]
        # One channel block holds every merged channel (`supports` asks GROUPS_PER_TILE * C/G <=
        # BLOCK_K), so the block-diagonal mask is the same at every step: built once, here.
        in_c = offs_k < c_valid
        a_cols = in_c[None, :]
        b_mask = in_c[:, None] & in_n[None, :] & ((offs_k // CG)[:, None] == (offs_n // KG)[None, :])

    c_tiles = tl.cdiv(GROUPS_PER_TILE * CG, BLOCK_K)
    cb = tl.full((), 0, tl.int32)  # the (channel block, tap) of this step, carried: see next_step
    fz = cb
    fy = cb
    fx = cb
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(FZ * FY * FX * c_tiles):
        c0 = cb * BLOCK_K
        if POINTWISE:
            ok = in_m
            x_off = c0.to(tl.int64)
            w_off = 0
        else:
            ok = in_m & inside(d0 + fz * DD, D) & inside(h0 + fy * DH, H) & inside(w0 + fx * DW, W)
            x_off = (fz * DD) * sxd_v + (fy * DH) * sxh_v + (fx * DW) * sxw_v + c0
            w_off = fz * swz_v + fy * swy_v + fx * swx_v
        if EVEN_K:  # whole channel blocks: only the border rows are masked
            a = tl.load(a_ptrs + x_off, mask=ok[:, None], other=0.0)
            b = tl.load(b_ptrs + (w_off + c0), mask=in_n[None, :], other=0.0)
        elif GROUPS_PER_TILE == 1:
            in_c = c0 + offs_k < c_valid
            a = tl.load(a_ptrs + x_off, mask=ok[:, None] & in_c[None, :], other=0.0)
            b = tl.load(b_ptrs + (w_off + c0), mask=in_c[:, None] & in_n[None, :], other=0.0)
        else:  # merged groups: a single channel block (c0 = 0), its masks built before the loop
            a = tl.load(a_ptrs + x_off, mask=ok[:, None] & a_cols, other=0.0)
            b = tl.load(b_ptrs + w_off, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        cb, fz, fy, fx = next_step(cb, fz, fy, fx, c_tiles, FY, FX)

    store_forward_tile(acc, y_ptr, bias_ptr, res_ptr, offs_m, offs_n, M, n_valid, g * KG, n, od, oh, ow,
                       syn, syd, syh, syw, srn, srd, srh, srw, VEC_Y, HAS_BIAS, ACTIVATION, HAS_RESIDUAL)


@triton.jit
def store_forward_tile(acc, y_ptr, bias_ptr, res_ptr, offs_m, offs_n, M, n_valid, k_first, n, od, oh, ow,
                       syn, syd, syh, syw, srn, srd, srh, srw, VEC_Y: tl.constexpr, HAS_BIAS: tl.constexpr,
                       ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """A forward tile's epilogue (bias, activation, then the residual) and its store: rows are output
    pixels (n, od, oh, ow), columns the output channels from k_first (the group's first)."""
    acc = apply_epilogue(acc, offs_m, offs_n, M, n_valid, 0, bias_ptr, bias_ptr, bias_ptr + k_first, 1,
                         res_ptr, 0, 0, 0, False, HAS_BIAS, ACTIVATION, False)
    mask = (offs_m < M)[:, None] & (offs_n < n_valid)[None, :]
    if HAS_RESIDUAL:
        r_row = n.to(tl.int64) * srn + od * srd + oh * srh + ow * srw + k_first
        acc += tl.load(res_ptr + r_row[:, None] + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    y_row = (n.to(tl.int64) * (syn // VEC_Y * VEC_Y) + od * (syd // VEC_Y * VEC_Y)
             + oh * (syh // VEC_Y * VEC_Y) + ow * (syw // VEC_Y * VEC_Y) + k_first)
    tl.store(y_ptr + y_row[:, None] + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def conv_bwd_data_igemm(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                        N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                        SD, SH, SW, PD, PH, PW, DD, DH, DW,
                        sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, VEC: tl.constexpr, VEC_Y: tl.constexpr,
                        POINTWISE: tl.constexpr, GROUPS_PER_TILE: tl.constexpr, EVEN_K: tl.constexpr,
                        UNIT_STRIDE: tl.constexpr):
    """dx[n, i, g, c] = sum over taps and k of dy[n, o, g, k] * w[g, k, tap, c] where o*S-P+tap*D = i.

    M = input pixels, N = C/G. Grid axis 2 is the stride's phase: a program's rows are the
    input pixels i = i' * S + phase, which only the taps of one residue class reach
    (`phase_taps`), at o = i' + base - t * step: the loop visits those taps alone, with
    row pointers hoisted and one scalar offset a step, as at stride 1 (one phase, every
    tap). Visiting every tap and masking the misses cost stride 2 a 14x slowdown (H200,
    7x7 stem). GROUPS_PER_TILE merges groups as the forward kernel does (N = their input
    channels, the reduction their output channels).
    """
    pid = tl.program_id(0)
    g = tl.program_id(1) * GROUPS_PER_TILE
    phase = tl.program_id(2)
    CG = CG // VEC * VEC
    KG = KG // VEC_Y * VEC_Y
    if GROUPS_PER_TILE == 1:
        n_valid = CG
        k_valid = KG
    else:
        n_valid = min(GROUPS_PER_TILE, G - g) * CG
        k_valid = min(GROUPS_PER_TILE, G - g) * KG
    # Input pixels of this phase: ceil(size / stride) of them per dim (fewer in some phases: masked).
    if UNIT_STRIDE:
        PD_, PH_, PW_ = D, H, W
    else:
        PD_, PH_, PW_ = tl.cdiv(D, SD), tl.cdiv(H, SH), tl.cdiv(W, SW)
    M = N * PD_ * PH_ * PW_
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(GROUPS_PER_TILE * CG, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_n = offs_n < n_valid
    n, qd, qh, qw = split_pixel(offs_m, PD_, PH_, PW_)
    if UNIT_STRIDE:  # one phase, every tap: the search compiled away (it cost stride 1 up to 25%)
        idd, ih, iw = qd, qh, qw
        in_m = offs_m < M
        fz0, tz_period, nz, bz, z_step = 0, 1, FZ, PD, DD
        fy0, ty_period, ny, by, y_step = 0, 1, FY, PH, DH
        fx0, tx_period, nx, bx, x_step = 0, 1, FX, PW, DW
    else:
        pz, py, px = split_tap(phase, SH, SW)
        idd, ih, iw = qd * SD + pz, qh * SH + py, qw * SW + px
        in_m = (offs_m < M) & (idd < D) & (ih < H) & (iw < W)
        fz0, tz_period, nz, bz, z_step = phase_taps(pz, FZ, SD, PD, DD)
        fy0, ty_period, ny, by, y_step = phase_taps(py, FY, SH, PH, DH)
        fx0, tx_period, nx, bx, x_step = phase_taps(px, FX, SW, PW, DW)
    syd_v, syh_v, syw_v = syd // VEC_Y * VEC_Y, syh // VEC_Y * VEC_Y, syw // VEC_Y * VEC_Y
    swz_v, swy_v, swx_v = swz // VEC * VEC, swy // VEC * VEC, swx // VEC * VEC
    dy_n = n.to(tl.int64) * (syn // VEC_Y * VEC_Y) + g * KG
    if GROUPS_PER_TILE == 1:
        c_in_group = offs_n
    else:
        c_in_group = offs_n % CG
    # The output pixel each row meets at its phase's first tap; tap t of the phase is t steps back.
    d0 = qd + bz
    h0 = qh + by
    w0 = qw + bx
    a_ptrs = y_ptr + (dy_n + d0 * syd_v + h0 * syh_v + w0 * syw_v)[:, None] + offs_k[None, :]
    b_ptrs = (w_ptr + (g * KG + offs_k).to(tl.int64)[:, None] * (swk // VEC * VEC) + c_in_group[None, :]
              + (fz0 * swz_v + fy0 * swy_v + fx0 * swx_v))
    if GROUPS_PER_TILE > 1:
        # One channel block holds every merged output channel (`supports` asks GROUPS_PER_TILE *
        # K/G <= BLOCK_K): the block-diagonal mask is the same at every step, built once here.
        in_k = offs_k < k_valid
        a_cols = in_k[None, :]
        b_mask = in_k[:, None] & in_n[None, :] & ((offs_k // KG)[:, None] == (offs_n // CG)[None, :])

    k_tiles = tl.cdiv(GROUPS_PER_TILE * KG, BLOCK_K)
    cb = tl.full((), 0, tl.int32)  # the (channel block, tap of the phase) of this step: see next_step
    tz = cb
    ty = cb
    tx = cb
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(nz * ny * nx * k_tiles):
        k0 = cb * BLOCK_K
        w_off = k0.to(tl.int64) * (swk // VEC * VEC)
        if POINTWISE:
            ok = in_m
            dy_off = k0.to(tl.int64)
        else:
            ok = in_m & inside(d0 - tz * z_step, OD) & inside(h0 - ty * y_step, OH) & inside(w0 - tx * x_step, OW)
            dy_off = k0 - (tz * z_step) * syd_v - (ty * y_step) * syh_v - (tx * x_step) * syw_v
            w_off += (tz * tz_period) * swz_v + (ty * ty_period) * swy_v + (tx * tx_period) * swx_v
        if EVEN_K:  # whole channel blocks: only the rows without an output pixel are masked
            a = tl.load(a_ptrs + dy_off, mask=ok[:, None], other=0.0)
            b = tl.load(b_ptrs + w_off, mask=in_n[None, :], other=0.0)
        elif GROUPS_PER_TILE == 1:
            in_k = k0 + offs_k < k_valid
            a = tl.load(a_ptrs + dy_off, mask=ok[:, None] & in_k[None, :], other=0.0)
            b = tl.load(b_ptrs + w_off, mask=in_k[:, None] & in_n[None, :], other=0.0)
        else:  # merged groups: a single channel block (k0 = 0), its masks built before the loop
            a = tl.load(a_ptrs + dy_off, mask=ok[:, None] & a_cols, other=0.0)
            b = tl.load(b_ptrs + w_off, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        cb, tz, ty, tx = next_step(cb, tz, ty, tx, k_tiles, ny, nx)

    x_row = (n.to(tl.int64) * (sxn // VEC * VEC) + idd * (sxd // VEC * VEC) + ih * (sxh // VEC * VEC)
             + iw * (sxw // VEC * VEC) + g * CG)
    tl.store(x_ptr + x_row[:, None] + offs_n[None, :], acc.to(x_ptr.dtype.element_ty),
             mask=in_m[:, None] & in_n[None, :])


@triton.jit
def conv_bwd_weight_igemm(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                          N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                          SD, SH, SW, PD, PH, PW, DD, DH, DW,
                          sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr,
                          HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, VEC: tl.constexpr, VEC_Y: tl.constexpr,
                          POINTWISE: tl.constexpr, GROUPS_PER_TILE: tl.constexpr, EVEN_K: tl.constexpr,
                          UNIT_STRIDE: tl.constexpr):
    """dw[g, k, tap, c] = sum over output pixels of dy[n, o, g, k] * x[n, o*S-P+tap*D, g, c].

    M = K/G, N = C/G, one tap per program (grid axis 0 = tap x tiles), and the pixels
    split over SPLIT_K programs (grid axis 2). With SPLIT_K > 1 each program writes an
    fp32 slab of the workspace [SPLIT_K, K, taps, C/G] (or adds into one slab, ATOMIC)
    and `conv_weight_reduce` finishes.

    The reduction runs over output pixels, BLOCK_K a step. Their coordinates and row
    offsets are computed once, before the loop; a step then adds BLOCK_K written as
    digits over (N, OD, OH, OW) with one carry compare a digit (`advance_pixel`) and
    moves the offsets by the step plus the wrap corrections of the digits that carried,
    instead of dividing every pixel index by OW, OH and OD and rebuilding both offsets
    (the old loop's cost: 6 divisions and 8 64-bit products a pixel a step).
    EVEN_K here means whole BLOCK_M and BLOCK_N blocks of K/G and C/G: no channel masks.
    """
    pid = tl.program_id(0)
    g = tl.program_id(1)
    pid_s = tl.program_id(2)
    CG = CG // VEC * VEC
    KG = KG // VEC_Y * VEC_Y
    grid_m = tl.cdiv(KG, BLOCK_M)
    grid_n = tl.cdiv(CG, BLOCK_N)
    tiles = grid_m * grid_n
    tap = pid // tiles
    pid_m = (pid % tiles) // grid_n
    pid_n = (pid % tiles) % grid_n
    fz, fy, fx = split_tap(tap, FY, FX)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = offs_m < KG
    in_n = offs_n < CG
    P = N * OD * OH * OW
    p_tiles = tl.cdiv(P, BLOCK_K)
    per_split = tl.cdiv(p_tiles, SPLIT_K)
    p_first = pid_s * per_split
    p_last = min(p_first + per_split, p_tiles)

    offs_p = p_first * BLOCK_K + tl.arange(0, BLOCK_K)
    n, od, oh, ow = split_pixel(offs_p, OD, OH, OW)  # once: later steps carry them
    step_n, step_d, step_h, step_w = split_pixel(tl.full((), BLOCK_K, tl.int32), OD, OH, OW)
    # A pixel's dy offset is linear in (n, od, oh, ow) with the dy strides, its x offset with the
    # x strides times the conv stride: both are carried too. A step adds the step's offset, and
    # each digit that wraps adds its wrap correction (one more of the next dim, OW fewer of this).
    cy = (syn // VEC_Y * VEC_Y, syd // VEC_Y * VEC_Y, syh // VEC_Y * VEC_Y, syw // VEC_Y * VEC_Y)
    cx = (sxn // VEC * VEC, SD * (sxd // VEC * VEC), SH * (sxh // VEC * VEC), SW * (sxw // VEC * VEC))
    z_off = fz * DD - PD  # the tap's input offset from o * S in each dim
    y_off = fy * DH - PH
    x_off = fx * DW - PW
    dy_row, dy_step, dy_wraps = linear_walk(cy, n, od, oh, ow, step_n, step_d, step_h, step_w, OD, OH, OW)
    x_row, x_step, x_wraps = linear_walk(cx, n, od, oh, ow, step_n, step_d, step_h, step_w, OD, OH, OW)
    dy_row += g * KG
    x_row += g * CG + z_off * (sxd // VEC * VEC) + y_off * (sxh // VEC * VEC) + x_off * (sxw // VEC * VEC)
    a_cols = y_ptr + offs_m[:, None]
    b_cols = x_ptr + offs_n[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(p_first, p_last):
        in_p = offs_p < P
        if POINTWISE:
            ok = in_p
        else:
            ok = (in_p & inside(od * SD + z_off, D) & inside(oh * SH + y_off, H)
                  & inside(ow * SW + x_off, W))
        if EVEN_K:  # whole channel blocks: only pixels past the end and outside the input are masked
            a = tl.load(a_cols + dy_row[None, :], mask=in_p[None, :], other=0.0)
            b = tl.load(b_cols + x_row[:, None], mask=ok[:, None], other=0.0)
        else:
            a = tl.load(a_cols + dy_row[None, :], mask=in_m[:, None] & in_p[None, :], other=0.0)
            b = tl.load(b_cols + x_row[:, None], mask=ok[:, None] & in_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        offs_p += BLOCK_K
        od, oh, ow, wrap_d, wrap_h, wrap_w = advance_pixel(od, oh, ow, step_d, step_h, step_w, OD, OH, OW)
        dy_row = walk(dy_row, dy_step, dy_wraps, wrap_d, wrap_h, wrap_w)
        x_row = walk(x_row, x_step, x_wraps, wrap_d, wrap_h, wrap_w)

    mask = in_m[:, None] & in_n[None, :]
    if SPLIT_K == 1:
        w_rows = ((g * KG + offs_m).to(tl.int64) * (swk // VEC * VEC) + fz * (swz // VEC * VEC)
                  + fy * (swy // VEC * VEC) + fx * (swx // VEC * VEC))
        tl.store(w_ptr + w_rows[:, None] + offs_n[None, :], acc.to(w_ptr.dtype.element_ty), mask=mask)
    else:
        store_weight_partial(ws_ptr, acc, g * KG + offs_m, offs_n, mask, tap, pid_s, G, KG, CG, FZ * FY * FX, ATOMIC)
