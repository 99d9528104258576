"""Family `igemm-tma`: implicit GEMM whose operands are boxes moved by Hopper's TMA (sm_90+).

A stride-1 convolution reads, for filter tap (z, y, x) and a tile of TILE_H x TILE_W
consecutive output pixels, a TILE_H x TILE_W box of consecutive input pixels: the
tile's own box shifted by (z*DD - PD, y*DH - PH, x*DW - PW). So the channels-last
activation is read through a 5-D tensor descriptor [N, D, H, W, channels] (1-D and 2-D
convs have unit D and H) with a [1, 1, TILE_H, TILE_W, block] box, and the copy engine
zero-fills every element of a box that lies outside the tensor, negative coordinates
included: exactly the convolution's zero padding. The loop computes no address and no
mask; the epilogue alone masks the tile's pixels past the output's edge.

Channel blocks: an activation box spans `block` channels from the group's first plus
the block's offset; one that runs past the group's channels reads the next group's (or
zeros past the tensor's). That is harmless where those rows or columns of the tile are
masked on the store (forward's output channels, both of backward-weight's channel
blocks), so backward-weight takes any C/G and K/G; forward sums its input-channel
blocks, and its weight rows are [taps x C/G] runs, so `supports` asks C/G to be a
multiple of BLOCK_K.

Pixels past the output's edge: forward computes their rows and masks them on the store;
backward-weight reads zeros from dy there (its descriptor ends at the output's edge),
so they add 0 * x. (An inf or NaN in x that only such a pixel reads would turn this
tap's sum NaN; the reference would not see it.)

wgmma reads its A operand from shared memory only when it is a descriptor load as
loaded (Triton 3.6): forward therefore computes y^T = w @ x^T, the merged pixel box as
B; backward-weight's A is dy^T, from shared memory for one-row boxes and copied to
registers for taller ones (rules.register_a_operand). Taller boxes of fewer than 128 pixels over
three or more stages sum wrong on sm_90 as Triton 3.6 compiles them: the rules refuse them there
(REGISTER_A_PIPELINE).
"""

import triton
import triton.language as tl

from ...gemm.kernels.epilogue import apply_epilogue
from .geometry import next_step, split_tap
from .weight_reduce import store_weight_partial


@triton.jit
def _tile_pixels(pid, OD, OH, OW, TILE_H: tl.constexpr, TILE_W: tl.constexpr):
    """Box `pid` of the output pixels over (N, OD, OH / TILE_H, OW / TILE_W), W fastest: (n, od, oh0, ow0)."""
    tiles_w = tl.cdiv(OW, TILE_W)
    tiles_h = tl.cdiv(OH, TILE_H)
    bw = pid % tiles_w
    rest = pid // tiles_w
    bh = rest % tiles_h
    rest = rest // tiles_h
    return rest // OD, rest % OD, bh * TILE_H, bw * TILE_W


@triton.jit
def _next_box(n, od, oh0, ow0, OD, OH, OW, TILE_H: tl.constexpr, TILE_W: tl.constexpr):
    """The pixel box after (n, od, oh0, ow0), W fastest: carried by compares, not divisions."""
    ow0 += TILE_W
    wrap = ow0 >= OW
    ow0 = tl.where(wrap, 0, ow0)
    oh0 = tl.where(wrap, oh0 + TILE_H, oh0)
    wrap = oh0 >= OH
    oh0 = tl.where(wrap, 0, oh0)
    od = tl.where(wrap, od + 1, od)
    wrap = od >= OD
    od = tl.where(wrap, 0, od)
    n = tl.where(wrap, n + 1, n)
    return n, od, oh0, ow0


@triton.jit
def _tile_rows(oh0, ow0, OH, OW, TILE_H: tl.constexpr, TILE_W: tl.constexpr):
    """Each row of a [TILE_H * TILE_W, ...] tile as its output pixel (oh, ow), and whether it is inside."""
    rows = tl.arange(0, TILE_H * TILE_W)
    oh = oh0 + rows // TILE_W
    ow = ow0 + rows % TILE_W
    return oh, ow, (oh < OH) & (ow < OW)


@triton.jit
def conv_fwd_igemm_tma(x_desc, w_desc, y_ptr, bias_ptr, res_ptr,
                       N, G, CG, KG, OD, OH, OW, FZ, FY, FX, PD, PH, PW, DD, DH, DW,
                       syn, syd, syh, syw, srn, srd, srh, srw,
                       TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       TURNED_WEIGHT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """y[n, o, g, k] = sum over taps and c of x[n, o - P + tap*D, g, c] * w[g, k, tap, c] (stride 1).

    A program owns TILE_H x TILE_W output pixels by BLOCK_N output channels of one group
    and steps over (tap, BLOCK_K input channels). It computes the tile transposed,
    y^T = w @ x^T: wgmma takes its A operand from shared memory only when it is a
    descriptor load as loaded (transposed or not), and the x box, [1, 1, TILE_H, TILE_W,
    BLOCK_K] merged into [TILE_H * TILE_W, BLOCK_K], is not; as B it is read where TMA put
    it. A is the weight box [BLOCK_N, BLOCK_K] of the 2-D descriptor [G*K, taps*C/G] at
    (g*K/G + k0, tap*C/G + c0).

    TURNED_WEIGHT runs backward-data as this forward over dy (ConvProblem.data_gradient_as_forward):
    its weight is the conv's own filter turned by 180 degrees with K/G and C/G swapped, which
    the kernel reads in place rather than from a turned copy. Here (CG, KG) are the conv's
    (K/G, C/G), so the descriptor over the conv's filter is [G*CG, taps*KG], and A is its box
    [BLOCK_K, BLOCK_N] at (g*CG + c0, (taps - 1 - tap)*KG + k0), transposed.
    """
    BLOCK_M: tl.constexpr = TILE_H * TILE_W
    pid = tl.program_id(0)
    g = tl.program_id(1)
    tiles_n = tl.cdiv(KG, BLOCK_N)
    pid_n = pid % tiles_n  # output-channel blocks fastest: they share the x boxes of one pixel tile
    n, od, oh0, ow0 = _tile_pixels(pid // tiles_n, OD, OH, OW, TILE_H, TILE_W)
    k0 = pid_n * BLOCK_N
    c_tiles = tl.cdiv(CG, BLOCK_K)
    d_in = od - PD  # the tile's input box at tap 0
    h_in = oh0 - PH
    w_in = ow0 - PW
    c_first = g * CG
    k_row = g * KG + k0

    cb = tl.full((), 0, tl.int32)  # the (channel block, tap) of this step, carried: see next_step
    fz = cb
    fy = cb
    fx = cb
    w_col = cb  # tap * C/G + c0, carried: the channel blocks of a tap, then the next tap's
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    taps = FZ * FY * FX
    for _ in range(taps * c_tiles):
        if TURNED_WEIGHT:
            turned = taps - 1 - (fz * FY + fy) * FX - fx
            a = w_desc.load([g * CG + cb * BLOCK_K, turned * KG + k0]).T
        else:
            a = w_desc.load([k_row, w_col])
        b = x_desc.load([n, d_in + fz * DD, h_in + fy * DH, w_in + fx * DW, c_first + cb * BLOCK_K])
        acc = tl.dot(a, b.reshape(BLOCK_M, BLOCK_K).T, acc, input_precision=DOT_PRECISION)
        cb, fz, fy, fx = next_step(cb, fz, fy, fx, c_tiles, FY, FX)
        w_col += BLOCK_K

    acc = tl.trans(acc)
    oh, ow, in_m = _tile_rows(oh0, ow0, OH, OW, TILE_H, TILE_W)
    offs_n = k0 + tl.arange(0, BLOCK_N)
    in_n = offs_n < KG
    acc = apply_epilogue(acc, tl.arange(0, BLOCK_M), offs_n, BLOCK_M, KG, 0, bias_ptr, bias_ptr,
                         bias_ptr + g * KG, 1, res_ptr, 0, 0, 0, False, HAS_BIAS, ACTIVATION, False)
    mask = in_m[:, None] & in_n[None, :]
    if HAS_RESIDUAL:
        r_row = n.to(tl.int64) * srn + od * srd + oh * srh + ow * srw + g * KG
        acc += tl.load(res_ptr + r_row[:, None] + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    y_row = n.to(tl.int64) * syn + od * syd + oh * syh + ow * syw + g * KG
    tl.store(y_ptr + y_row[:, None] + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def conv_bwd_weight_igemm_tma(x_desc, dy_desc, w_ptr, ws_ptr,
                              N, G, CG, KG, OD, OH, OW, FZ, FY, FX, PD, PH, PW, DD, DH, DW,
                              swk, swz, swy, swx,
                              TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr,
                              DOT_PRECISION: tl.constexpr):
    """dw[g, k, tap, c] = sum over output pixels o of dy[n, o, g, k] * x[n, o - P + tap*D, g, c] (stride 1).

    A program owns one tap, BLOCK_M output channels (M) by BLOCK_N input channels (N),
    and a run of the output's pixel boxes (the reduction, split over SPLIT_K programs
    on grid axis 2 as the igemm kernel does: fp32 slabs [SPLIT_K, K, taps, C/G] summed by
    `conv_weight_reduce`, or ATOMIC adds into one). A step: the dy box [TILE_H*TILE_W,
    BLOCK_M], transposed, times the x box shifted by the tap. A box past the output's
    edge reads zeros from dy (its descriptor ends there), so its x rows add nothing.
    """
    BLOCK_P: tl.constexpr = TILE_H * TILE_W
    pid = tl.program_id(0)
    g = tl.program_id(1)
    pid_s = tl.program_id(2)
    grid_m = tl.cdiv(KG, BLOCK_M)
    grid_n = tl.cdiv(CG, BLOCK_N)
    tiles = grid_m * grid_n
    tap = pid // tiles
    pid_m = (pid % tiles) // grid_n
    pid_n = (pid % tiles) % grid_n
    fz, fy, fx = split_tap(tap, FY, FX)
    z_off = fz * DD - PD  # the tap's input box, relative to the output box
    y_off = fy * DH - PH
    x_off = fx * DW - PW
    k_first = g * KG + pid_m * BLOCK_M
    c_first = g * CG + pid_n * BLOCK_N

    boxes = N * OD * tl.cdiv(OH, TILE_H) * tl.cdiv(OW, TILE_W)
    per_split = tl.cdiv(boxes, SPLIT_K)
    p_first = pid_s * per_split
    p_last = min(p_first + per_split, boxes)
    n, od, oh0, ow0 = _tile_pixels(p_first, OD, OH, OW, TILE_H, TILE_W)  # once: later steps carry it

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(p_first, p_last):
        a = dy_desc.load([n, od, oh0, ow0, k_first])
        b = x_desc.load([n, od + z_off, oh0 + y_off, ow0 + x_off, c_first])
        acc = tl.dot(a.reshape(BLOCK_P, BLOCK_M).T, b.reshape(BLOCK_P, BLOCK_N), acc,
                     input_precision=DOT_PRECISION)
        n, od, oh0, ow0 = _next_box(n, od, oh0, ow0, OD, OH, OW, TILE_H, TILE_W)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < KG)[:, None] & (offs_n < CG)[None, :]
    if SPLIT_K == 1:
        w_rows = (g * KG + offs_m).to(tl.int64) * swk + fz * swz + fy * swy + fx * swx
        tl.store(w_ptr + w_rows[:, None] + offs_n[None, :], acc.to(w_ptr.dtype.element_ty), mask=mask)
    else:
        store_weight_partial(ws_ptr, acc, g * KG + offs_m, offs_n, mask, tap, pid_s, G, KG, CG, FZ * FY * FX, ATOMIC)
