"""Family `igemm-flat`: implicit GEMM whose reduction (forward) or whose N (backward-weight) walks the
filter's (tap, channel) pairs as one flat index j = tap * C/G + c.

For few channels a group (the C=3 stem of an image model) the `igemm` kernels pad each
tap's C/G channels to a whole block: 3 channels in a block of 16 make 5 in 6 of the MMAs
and loads zeros, and backward-weight runs one program per tap over all the pixels, each
re-reading dy. Flat, a block of 32 holds ten taps of 3 channels: a 7x7x3 filter is 5
steps of 32 instead of 49 steps of 16. The price is a gather: the (pixel, j) element of
the im2col matrix has its own address and border mask, built per step from per-column
(tap, channel) vectors, where `igemm` adds one scalar offset a step.

Backward-data's reduction is over K/G, which no flattening shortens, but its N, C/G, is the
small side: `igemm` pads each 3-channel tap to a tile of 16 or more. Flat, it is the GEMM
columns[g, j, p] = sum over k of dy[p, g, k] * w[g, k, j] (p the output pixels, j the flat
(tap, channel) pairs: 147 for the stem, in tiles of 64 or more), into an fp32 buffer, then a
gather (`conv_col2im`) that sums, for each input pixel, the columns of the taps that reach it:
PyTorch's im2col backward, with the column matrix made by tensor cores and summed per phase.

Arguments and constexprs are the `igemm` family's (kernels/implicit_gemm.py); the split
workspace of backward-weight is the same [SPLIT_K, K, taps, C/G] as flat [K, taps x C/G].
"""

import triton
import triton.language as tl

from ...gemm.kernels.tile_order import grouped_tile
from .geometry import advance_pixel, inside, linear_walk, phase_taps, split_pixel, split_tap, walk
from .implicit_gemm import store_forward_tile
from .weight_reduce import store_weight_partial


@triton.jit
def _filter_columns(j, CG, FY, FX, DD, DH, DW, swz, swy, swx, VEC: tl.constexpr):
    """Flat (tap, channel) index -> the tap's dilated offsets along (D, H, W), the channel, and its
    column offset in a filter row [taps, C/G] (strides in VEC-element units, as the kernels read them)."""
    c = j % CG
    fz, fy, fx = split_tap(j // CG, FY, FX)
    w_col = fz * (swz // VEC * VEC) + fy * (swy // VEC * VEC) + fx * (swx // VEC * VEC) + c
    return fz * DD, fy * DH, fx * DW, c, w_col


@triton.jit
def conv_fwd_igemm_flat(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                        N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                        SD, SH, SW, PD, PH, PW, DD, DH, DW,
                        sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, VEC: tl.constexpr, VEC_Y: tl.constexpr, POINTWISE: tl.constexpr,
                        GROUPS_PER_TILE: tl.constexpr, EVEN_K: tl.constexpr, UNIT_STRIDE: tl.constexpr):
    """y[n, o, g, k] = sum over j of x[n, o*S-P+tap(j)*D, g, c(j)] * w[g, k, tap(j), c(j)]: M = pixels, N = K/G."""
    pid = tl.program_id(0)
    g = tl.program_id(1)
    CG = CG // VEC * VEC
    KG = KG // VEC_Y * VEC_Y
    M = N * OD * OH * OW
    J = FZ * FY * FX * CG
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(KG, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = offs_m < M
    in_n = offs_n < KG
    n, od, oh, ow = split_pixel(offs_m, OD, OH, OW)
    sxd_v, sxh_v, sxw_v = sxd // VEC * VEC, sxh // VEC * VEC, sxw // VEC * VEC
    d0 = od * SD - PD
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    x_rows = n.to(tl.int64) * (sxn // VEC * VEC) + d0 * sxd_v + h0 * sxh_v + w0 * sxw_v + g * CG
    w_rows = (g * KG + offs_n).to(tl.int64) * (swk // VEC * VEC)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j0 in range(0, J, BLOCK_K):
        j = j0 + tl.arange(0, BLOCK_K)
        in_j = j < J
        dz, dy, dx, c, w_cols = _filter_columns(j, CG, FY, FX, DD, DH, DW, swz, swy, swx, VEC)
        ok = (in_m[:, None] & in_j[None, :] & inside(d0[:, None] + dz[None, :], D)
              & inside(h0[:, None] + dy[None, :], H) & inside(w0[:, None] + dx[None, :], W))
        x_cols = dz * sxd_v + dy * sxh_v + dx * sxw_v + c
        a = tl.load(x_ptr + x_rows[:, None] + x_cols[None, :], mask=ok, other=0.0)
        b = tl.load(w_ptr + w_rows[None, :] + w_cols[:, None], mask=in_j[:, None] & in_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    store_forward_tile(acc, y_ptr, bias_ptr, res_ptr, offs_m, offs_n, M, KG, g * KG, n, od, oh, ow,
                       syn, syd, syh, syw, srn, srd, srh, srw, VEC_Y, HAS_BIAS, ACTIVATION, HAS_RESIDUAL)


@triton.jit
def conv_bwd_weight_igemm_flat(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                               N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                               SD, SH, SW, PD, PH, PW, DD, DH, DW,
                               sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr,
                               HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                               DOT_PRECISION: tl.constexpr, VEC: tl.constexpr, VEC_Y: tl.constexpr,
                               POINTWISE: tl.constexpr,
                               GROUPS_PER_TILE: tl.constexpr, EVEN_K: tl.constexpr, UNIT_STRIDE: tl.constexpr):
    """dw[g, k, j] = sum over output pixels of dy[n, o, g, k] * x[n, o*S-P+tap(j)*D, g, c(j)]: M = K/G, N = j.

    One program covers every tap its columns hold, so dy is read once per column block
    rather than once per tap. The pixels split over SPLIT_K programs (grid axis 2) as in
    the `igemm` kernel, whose carried pixel walk (`advance_pixel`) this one shares.
    """
    pid = tl.program_id(0)
    g = tl.program_id(1)
    pid_s = tl.program_id(2)
    CG = CG // VEC * VEC
    KG = KG // VEC_Y * VEC_Y
    J = FZ * FY * FX * CG
    grid_n = tl.cdiv(J, BLOCK_N)
    pid_m = pid // grid_n
    pid_n = pid % grid_n

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = offs_m < KG
    in_n = offs_n < J
    sxd_v, sxh_v, sxw_v = sxd // VEC * VEC, sxh // VEC * VEC, sxw // VEC * VEC
    dz, dy, dx, c, w_cols = _filter_columns(offs_n, CG, FY, FX, DD, DH, DW, swz, swy, swx, VEC)
    z_off, y_off, x_off = dz - PD, dy - PH, dx - PW  # each column's input offset from o * S
    x_cols = z_off * sxd_v + y_off * sxh_v + x_off * sxw_v + c

    P = N * OD * OH * OW
    p_tiles = tl.cdiv(P, BLOCK_K)
    per_split = tl.cdiv(p_tiles, SPLIT_K)
    p_first = pid_s * per_split
    p_last = min(p_first + per_split, p_tiles)
    offs_p = p_first * BLOCK_K + tl.arange(0, BLOCK_K)
    n, od, oh, ow = split_pixel(offs_p, OD, OH, OW)
    step_n, step_d, step_h, step_w = split_pixel(tl.full((), BLOCK_K, tl.int32), OD, OH, OW)
    cy = (syn // VEC_Y * VEC_Y, syd // VEC_Y * VEC_Y, syh // VEC_Y * VEC_Y, syw // VEC_Y * VEC_Y)
    cx = (sxn // VEC * VEC, SD * sxd_v, SH * sxh_v, SW * sxw_v)
    dy_row, dy_step, dy_wraps = linear_walk(cy, n, od, oh, ow, step_n, step_d, step_h, step_w, OD, OH, OW)
    x_row, x_step, x_wraps = linear_walk(cx, n, od, oh, ow, step_n, step_d, step_h, step_w, OD, OH, OW)
    dy_row += g * KG
    x_row += g * CG

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(p_first, p_last):
        in_p = offs_p < P
        a = tl.load(y_ptr + offs_m[:, None] + dy_row[None, :], mask=in_m[:, None] & in_p[None, :], other=0.0)
        ok = (in_p[:, None] & in_n[None, :] & inside((od * SD)[:, None] + z_off[None, :], D)
              & inside((oh * SH)[:, None] + y_off[None, :], H) & inside((ow * SW)[:, None] + x_off[None, :], W))
        b = tl.load(x_ptr + x_row[:, None] + x_cols[None, :], mask=ok, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        offs_p += BLOCK_K
        od, oh, ow, wrap_d, wrap_h, wrap_w = advance_pixel(od, oh, ow, step_d, step_h, step_w, OD, OH, OW)
        dy_row = walk(dy_row, dy_step, dy_wraps, wrap_d, wrap_h, wrap_w)
        x_row = walk(x_row, x_step, x_wraps, wrap_d, wrap_h, wrap_w)

    mask = in_m[:, None] & in_n[None, :]
    if SPLIT_K == 1:
        w_rows = (g * KG + offs_m).to(tl.int64) * (swk // VEC * VEC)
        tl.store(w_ptr + w_rows[:, None] + w_cols[None, :], acc.to(w_ptr.dtype.element_ty), mask=mask)
    else:  # the workspace's [K, taps, C/G] rows are [K, J] rows: one "tap" of J columns
        store_weight_partial(ws_ptr, acc, g * KG + offs_m, offs_n, mask, 0, pid_s, G, KG, J, 1, ATOMIC)


@triton.jit
def conv_bwd_data_igemm_flat(x_ptr, w_ptr, y_ptr, bias_ptr, res_ptr, ws_ptr,
                             N, G, CG, KG, D, H, W, OD, OH, OW, FZ, FY, FX,
                             SD, SH, SW, PD, PH, PW, DD, DH, DW,
                             sxn, sxd, sxh, sxw, swk, swz, swy, swx, syn, syd, syh, syw, srn, srd, srh, srw,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr,
                             HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                             DOT_PRECISION: tl.constexpr, VEC: tl.constexpr, VEC_Y: tl.constexpr,
                             POINTWISE: tl.constexpr, GROUPS_PER_TILE: tl.constexpr, EVEN_K: tl.constexpr,
                             UNIT_STRIDE: tl.constexpr):
    """columns[g, j, p] = sum over k of dy[n, o, g, k] * w[g, k, tap(j), c(j)]: M = output pixels, N = j.

    The first stage of the flat backward-data (ws_ptr: fp32 [G, taps x C/G, pixels], pixels
    innermost so that both this store and `conv_col2im`'s loads run along them); x_ptr (dx)
    is `conv_col2im`'s to write.
    """
    pid = tl.program_id(0)
    g = tl.program_id(1)
    CG = CG // VEC * VEC
    KG = KG // VEC_Y * VEC_Y
    P = N * OD * OH * OW
    J = FZ * FY * FX * CG
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(P, BLOCK_M), tl.cdiv(J, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_m = offs_m < P
    in_n = offs_n < J
    n, od, oh, ow = split_pixel(offs_m, OD, OH, OW)
    dy_rows = (n.to(tl.int64) * (syn // VEC_Y * VEC_Y) + od * (syd // VEC_Y * VEC_Y) + oh * (syh // VEC_Y * VEC_Y)
               + ow * (syw // VEC_Y * VEC_Y) + g * KG)
    _dz, _dy, _dx, _c, w_cols = _filter_columns(offs_n, CG, FY, FX, DD, DH, DW, swz, swy, swx, VEC)
    a_ptrs = y_ptr + dy_rows[:, None] + offs_k[None, :]
    b_ptrs = w_ptr + (g * KG + offs_k).to(tl.int64)[:, None] * (swk // VEC * VEC) + w_cols[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KG, BLOCK_K):
        in_k = offs_k < KG - k0
        a = tl.load(a_ptrs, mask=in_m[:, None] & in_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=in_k[:, None] & in_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * (swk // VEC * VEC)

    columns = ws_ptr + (g * J + offs_n).to(tl.int64)[None, :] * P + offs_m[:, None]
    tl.store(columns, acc, mask=in_m[:, None] & in_n[None, :])


@triton.jit
def conv_col2im(ws_ptr, x_ptr, N, G, CG, D, H, W, OD, OH, OW, FZ, FY, FX,
                SD, SH, SW, PD, PH, PW, DD, DH, DW, sxn, sxd, sxh, sxw,
                BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """dx[n, i, g, c] = sum over the taps reaching input pixel i of columns[g, (tap, c), o].

    The flat backward-data's second stage. Grid axis 2 is the stride's phase, as in igemm's
    backward-data: a program's pixels i = i' * S + phase are reached by the taps of one
    residue class only (`phase_taps`), so it visits those and no others, at o = i' + base -
    t * step. The tile is [BLOCK_C, BLOCK_P], pixels fastest: a warp's lanes read one
    column's consecutive output pixels, BLOCK_C channels at a time.
    """
    pid = tl.program_id(0)
    g = tl.program_id(1)
    phase = tl.program_id(2)
    PD_, PH_, PW_ = tl.cdiv(D, SD), tl.cdiv(H, SH), tl.cdiv(W, SW)
    offs = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    n, qd, qh, qw = split_pixel(offs, PD_, PH_, PW_)
    pz, py, px = split_tap(phase, SH, SW)
    idd, ih, iw = qd * SD + pz, qh * SH + py, qw * SW + px
    in_p = (offs < N * PD_ * PH_ * PW_) & (idd < D) & (ih < H) & (iw < W)
    fz0, z_period, nz, bz, z_step = phase_taps(pz, FZ, SD, PD, DD)
    fy0, y_period, ny, by, y_step = phase_taps(py, FY, SH, PH, DH)
    fx0, x_period, nx, bx, x_step = phase_taps(px, FX, SW, PW, DW)
    P = N * OD * OH * OW
    image = n.to(tl.int64) * OD * OH * OW  # the image's first output pixel
    dx = n.to(tl.int64) * sxn + idd * sxd + ih * sxh + iw * sxw + g * CG
    for c0 in range(0, CG, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        in_c = c < CG
        channels = (g * FZ * FY * FX * CG + c).to(tl.int64) * P  # tap 0's column of each channel
        acc = tl.zeros((BLOCK_C, BLOCK_P), dtype=tl.float32)
        for tz in range(nz):
            od = qd + bz - tz * z_step
            fz = fz0 + tz * z_period
            for ty in range(ny):
                oh = qh + by - ty * y_step
                fy = fy0 + ty * y_period
                for tx in range(nx):
                    ow = qw + bx - tx * x_step
                    fx = fx0 + tx * x_period
                    ok = in_p & inside(od, OD) & inside(oh, OH) & inside(ow, OW)
                    tap_column = ((fz * FY + fy) * FX + fx) * CG * P.to(tl.int64)
                    ptrs = ws_ptr + (channels + tap_column)[:, None] + (image + (od * OH + oh) * OW + ow)[None, :]
                    acc += tl.load(ptrs, mask=in_c[:, None] & ok[None, :], other=0.0)
        tl.store(x_ptr + dx[None, :] + c[:, None], acc.to(x_ptr.dtype.element_ty),
                 mask=in_c[:, None] & in_p[None, :])
