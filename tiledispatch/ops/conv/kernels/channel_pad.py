"""Copying a channels-last tensor into one with more channels, zero-filled: the first stage of a
padded igemm-flat plan (ImplicitGemmConfig.pad_channels), for x and forward's w alike.

A row is one (outer, d, h, w) position of a 5-D view (N or K outermost, then the spatial
dims); the source's channels are read with a mask, the destination's written whole.
"""

import triton
import triton.language as tl

from .geometry import split_pixel


@triton.jit
def pad_channels(src_ptr, dst_ptr, ROWS, D, H, W, C, CP, ssn, ssd, ssh, ssw, sdn, sdd, sdh, sdw,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[r, c] = src[r, c] for c < C and 0 for C <= c < CP (CP <= BLOCK_C), over ROWS rows."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    in_r = offs_r < ROWS
    n, d, h, w = split_pixel(offs_r, D, H, W)
    n = n.to(tl.int64)
    src = src_ptr + (n * ssn + d * ssd + h * ssh + w * ssw)[:, None] + offs_c[None, :]
    values = tl.load(src, mask=in_r[:, None] & (offs_c < C)[None, :], other=0.0)
    dst = dst_ptr + (n * sdn + d * sdd + h * sdh + w * sdw)[:, None] + offs_c[None, :]
    tl.store(dst, values, mask=in_r[:, None] & (offs_c < CP)[None, :])
