"""The copies of a realign plan: a matrix stack into (or out of) a buffer with 16-byte rows.

One program moves BLOCK_R rows x BLOCK_C columns of one matrix, columns being the
contiguous dim of both sides. The unaligned side is read (or written) element by element,
coalesced along the row; the aligned side gets 16-byte vectors where the plan tells the
compiler its rows are multiples of 16 bytes. torch's strided copy moved these at about
1.4 TB/s on the H200 (odd_4095x4097x4093).
"""

import triton
import triton.language as tl


@triton.jit
def copy_rows(src_ptr, dst_ptr, ROWS, COLS, src_batch, src_row, dst_batch, dst_row,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[b, r, c] = src[b, r, c] for r < ROWS, c < COLS; grid (row blocks, column blocks, batch)."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = tl.program_id(2).to(tl.int64)
    mask = (offs_r < ROWS)[:, None] & (offs_c < COLS)[None, :]
    rows = offs_r.to(tl.int64)
    values = tl.load(src_ptr + b * src_batch + rows[:, None] * src_row + offs_c[None, :], mask=mask)
    tl.store(dst_ptr + b * dst_batch + rows[:, None] * dst_row + offs_c[None, :], values, mask=mask)
