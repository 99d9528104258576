"""Second stage of a split backward-weight: sum the fp32 slabs in a fixed order, cast, scatter into dw.

The workspace is [SPLIT_K, K, taps, C/G] (one slab after atomic adds); dw has the
weight's strides (GKZYXC with any K and tap strides).
"""

import triton
import triton.language as tl

from .geometry import split_tap


@triton.jit
def conv_weight_reduce(ws_ptr, w_ptr, TOTAL, CG, TAPS, FY, FX, swk, swz, swy, swx,
                       BLOCK: tl.constexpr, SPLIT_K: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < TOTAL
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * TOTAL + offs, mask=mask, other=0.0)
    c = offs % CG
    rest = offs // CG
    tap = rest % TAPS
    k = rest // TAPS
    fz, fy, fx = split_tap(tap, FY, FX)
    tl.store(w_ptr + k * swk + fz * swz + fy * swy + fx * swx + c, acc.to(w_ptr.dtype.element_ty), mask=mask)
