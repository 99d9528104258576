"""The copies of a realign plan: a matrix stack into (or out of) a buffer with 16-byte rows.

`copy_dense` serves the common case, a caller's tensor that is one dense run of elements
from a 16-byte aligned base (a contiguous matrix whose rows merely have an odd length):
that side is read (or written) as the run it is, in 16-byte vectors, and each element's
place in the buffer is found by one division by the row length. `copy_rows` serves any
other strides: BLOCK_R rows x BLOCK_C columns a program, element by element on the
caller's side. On the H200 (odd_4095x4097x4093 bf16) reading the odd rows element by
element moved 1.25 TB/s (0.55 in fp8), where writing them moved 2.7.
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


@triton.jit
def _dense_block(src_ptr, dst_ptr, offs, COLS, buffer_row, mask, INTO_BUFFER: tl.constexpr):
    row = offs // COLS
    in_buffer = row * buffer_row + (offs - row * COLS)
    if INTO_BUFFER:
        tl.store(dst_ptr + in_buffer, tl.load(src_ptr + offs, mask=mask), mask=mask)
    else:
        tl.store(dst_ptr + offs, tl.load(src_ptr + in_buffer, mask=mask), mask=mask)


@triton.jit
def copy_dense(src_ptr, dst_ptr, TOTAL, COLS, buffer_row, BLOCK: tl.constexpr, INTO_BUFFER: tl.constexpr):
    """Element i of the caller's dense run is element (i // COLS, i % COLS) of the buffer, whose
    rows are `buffer_row` apart (its matrices are dense stacks of rows too): INTO_BUFFER copies
    run -> buffer, else buffer -> run. Whole blocks go unmasked, so the run side is vectorised."""
    start = tl.program_id(0) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= TOTAL:
        _dense_block(src_ptr, dst_ptr, offs, COLS, buffer_row, None, INTO_BUFFER)
    else:
        _dense_block(src_ptr, dst_ptr, offs, COLS, buffer_row, offs < TOTAL, INTO_BUFFER)
