"""Family `igemm-flat`: implicit GEMM whose reduction (forward) or whose N (backward-weight) walks the
filter's (tap, channel) pairs as one flat index j = tap * C/G + c.

For few channels a group (the C=3 stem of an image model) the `igemm` kernels pad each
tap's C/G channels to a whole block: 3 channels in a block of 16 make 5 in 6 of the MMAs
and loads zeros, and backward-weight runs one program per tap over all the pixels, each
re-reading dy. Flat, a block of 32 holds ten taps of 3 channels: a 7x7x3 filter is 5
steps of 32 instead of 49 steps of 16. The price is a gather: the (pixel, j) element of
the im2col matrix has its own address and border mask, built per step from per-column
(tap, channel) vectors, where `igemm` adds one scalar offset a step. Backward-data keeps
the `igemm` kernel (its reduction is over K/G, which is not the small side).

Arguments and constexprs are the `igemm` family's (kernels/implicit_gemm.py); the split
workspace of backward-weight is the same [SPLIT_K, K, taps, C/G] as flat [K, taps x C/G].
"""

import triton
import triton.language as tl

from ...gemm.kernels.tile_order import grouped_tile
from .geometry import advance_pixel, inside, linear_walk, split_pixel, split_tap, walk
from .implicit_gemm import store_forward_tile
from .weight_reduce import store_weight_partial


@triton.jit
def _filter_columns(j, CG, FY, FX, DD, DH, DW):
    """Flat (tap, channel) index -> the tap's dilated offsets along (D, H, W) and the channel."""
    c = j % CG
    fz, fy, fx = split_tap(j // CG, FY, FX)
    return fz * DD, fy * DH, fx * DW, c, fz, fy, fx


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
        dz, dy, dx, c, fz, fy, fx = _filter_columns(j, CG, FY, FX, DD, DH, DW)
        ok = (in_m[:, None] & in_j[None, :] & inside(d0[:, None] + dz[None, :], D)
              & inside(h0[:, None] + dy[None, :], H) & inside(w0[:, None] + dx[None, :], W))
        x_cols = dz * sxd_v + dy * sxh_v + dx * sxw_v + c
        a = tl.load(x_ptr + x_rows[:, None] + x_cols[None, :], mask=ok, other=0.0)
        w_cols = fz * (swz // VEC * VEC) + fy * (swy // VEC * VEC) + fx * (swx // VEC * VEC) + c
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
    dz, dy, dx, c, fz, fy, fx = _filter_columns(offs_n, CG, FY, FX, DD, DH, DW)
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
        w_cols = fz * (swz // VEC * VEC) + fy * (swy // VEC * VEC) + fx * (swx // VEC * VEC) + c
        w_rows = (g * KG + offs_m).to(tl.int64) * (swk // VEC * VEC)
        tl.store(w_ptr + w_rows[:, None] + w_cols[None, :], acc.to(w_ptr.dtype.element_ty), mask=mask)
    else:  # the workspace's [K, taps, C/G] rows are [K, J] rows: one "tap" of J columns
        store_weight_partial(ws_ptr, acc, g * KG + offs_m, offs_n, mask, 0, pid_s, G, KG, J, 1, ATOMIC)
