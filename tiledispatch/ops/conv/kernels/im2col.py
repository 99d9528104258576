"""The im2col family's first stage: a few-channel conv's input as the matrix of its windows.

Row p of `cols` is output pixel p's receptive field, flattened as the filter's (tap,
channel) pairs j = tap * C + c (GKZYXC order, so the weight is the matching K x J matrix),
zero where the window leaves x; columns J..JP are zeros too, so that JP keeps every row
16-byte aligned for the GEMM op's TMA kernels.
"""

import triton
import triton.language as tl

from .geometry import inside, split_pixel, split_tap


@triton.jit
def conv_im2col(x_ptr, cols_ptr, N, C, D, H, W, OD, OH, OW, FY, FX, SD, SH, SW, PD, PH, PW, DD, DH, DW,
                sxn, sxd, sxh, sxw, J, JP, BLOCK_P: tl.constexpr, BLOCK_J: tl.constexpr):
    """cols[p, j] = x[n, o * S - P + tap(j) * D, c(j)] for j < J (0 outside x), 0 for J <= j < JP."""
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    in_p = offs_p < N * OD * OH * OW
    n, od, oh, ow = split_pixel(offs_p, OD, OH, OW)
    c = offs_j % C
    fz, fy, fx = split_tap(offs_j // C, FY, FX)
    d = (od * SD - PD)[:, None] + (fz * DD)[None, :]
    h = (oh * SH - PH)[:, None] + (fy * DH)[None, :]
    w = (ow * SW - PW)[:, None] + (fx * DW)[None, :]
    ok = in_p[:, None] & (offs_j < J)[None, :] & inside(d, D) & inside(h, H) & inside(w, W)
    src = x_ptr + n.to(tl.int64)[:, None] * sxn + d * sxd + h * sxh + w * sxw + c[None, :]
    values = tl.load(src, mask=ok, other=0.0)
    dst = cols_ptr + offs_p.to(tl.int64)[:, None] * JP + offs_j[None, :]
    tl.store(dst, values, mask=in_p[:, None] & (offs_j < JP)[None, :])
