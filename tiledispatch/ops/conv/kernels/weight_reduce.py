"""A split backward-weight's workspace: each program's partial sums in, then the second stage
that sums the fp32 slabs in a fixed order, casts, and scatters into dw.

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


@triton.jit
def store_weight_partial(ws_ptr, acc, rows, offs_n, mask, tap, pid_s, G, KG, CG, TAPS, ATOMIC: tl.constexpr):
    """A split program's fp32 tile of dw (weight rows `rows` = g * K/G + k, columns `offs_n` of C/G,
    filter tap `tap`) into the workspace: its own slab `pid_s`, or atomic adds into the one slab."""
    ptrs = ws_ptr + ((rows.to(tl.int64) * TAPS + tap) * CG)[:, None] + offs_n[None, :]
    if ATOMIC:
        tl.atomic_add(ptrs, acc, mask=mask)
    else:
        tl.store(ptrs + pid_s.to(tl.int64) * G * KG * TAPS * CG, acc, mask=mask)
