"""A split backward-weight's workspace: each program's partial sums in, then the second stage
that sums the fp32 slabs in a fixed order, casts, and scatters into dw; or (SplitMode.LAST)
that sum done by the tile's last program to finish, in the same kernel.

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
def _slab_tile(ws_ptr, rows, offs_n, tap, TAPS, CG):
    """The pointers of a tile of dw (weight rows `rows` = g * K/G + k, columns `offs_n` of C/G, filter
    tap `tap`) in the workspace's first slab."""
    return ws_ptr + ((rows.to(tl.int64) * TAPS + tap) * CG)[:, None] + offs_n[None, :]


@triton.jit
def store_weight_partial(ws_ptr, acc, rows, offs_n, mask, tap, pid_s, G, KG, CG, TAPS, ATOMIC: tl.constexpr):
    """A split program's fp32 tile of dw into the workspace: its own slab `pid_s`, or atomic adds
    into the one slab."""
    ptrs = _slab_tile(ws_ptr, rows, offs_n, tap, TAPS, CG)
    if ATOMIC:
        tl.atomic_add(ptrs, acc, mask=mask)
    else:
        tl.store(ptrs + pid_s.to(tl.int64) * G * KG * TAPS * CG, acc, mask=mask)


@triton.jit
def store_weight_tile(w_ptr, acc, rows, offs_n, mask, fz, fy, fx, swk, swz, swy, swx):
    """A tile of dw of one tap (fz, fy, fx), cast and stored at the weight's strides."""
    w_rows = rows.to(tl.int64) * swk + fz * swz + fy * swy + fx * swx
    tl.store(w_ptr + w_rows[:, None] + offs_n[None, :], acc.to(w_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sum_slabs_if_last(ws_ptr, count_ptr, w_ptr, rows, offs_n, mask, tap, G, KG, CG, TAPS, fz, fy, fx,
                      swk, swz, swy, swx, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """SplitMode.LAST, once this program's slab is stored: the tile's program that arrives last at its
    count (an int32 of its own, zeroed before the launch) sums the SPLIT_K slabs and stores dw.

    In slab order, whichever program is last, so the sum is the same from run to run. One launch
    less than `conv_weight_reduce`, and the sums of early tiles run while later tiles compute.
    """
    tl.debug_barrier()  # every thread's part of the slab is stored before the count says so
    if tl.atomic_add(count_ptr, 1, sem="acq_rel") == SPLIT_K - 1:
        ptrs = _slab_tile(ws_ptr, rows, offs_n, tap, TAPS, CG)
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in tl.static_range(SPLIT_K):
            total += tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")  # from L2: other SMs wrote them
            ptrs += G * KG * TAPS * CG
        store_weight_tile(w_ptr, total, rows, offs_n, mask, fz, fy, fx, swk, swz, swy, swx)
