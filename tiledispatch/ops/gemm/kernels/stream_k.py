"""Family `stream-k`: a persistent grid that splits the last wave's K iterations evenly.

A persistent grid of P programs over T output tiles leaves SMs idle in its last wave
when T is not a multiple of P: 96 tiles on 132 SMs use 73 % of the machine. Stream-K
(Osama et al., 2023) deals the K iterations of the T % P leftover tiles out evenly, so
every program does the same work: program p takes iterations [p*S/P, (p+1)*S/P) of the
S = (T % P) * k_tiles that those tiles hold, then whole tiles p, p+P, ... of the rest.

A range shorter than a tile cuts at most two tiles: the one it starts in (its end
segment) and the one it ends in (its start segment). The program that holds a tile's
last K iteration owns it: it adds the other segments' fp32 partial sums, which their
programs store in a workspace slot and flag, then applies the epilogue and stores C.
The owner sums in a fixed order, so the result does not depend on timing.

No program waits for long: each program computes its start segment first and its end
segment last, so an owner reaches its tile's end when the others have just finished
theirs. Every contributor has a lower program id than its owner, so the interpreter,
which runs programs one after another in id order, never waits either. On a GPU all P
programs are resident at once (P is at most the SM count, one program fits an SM).
"""

import triton
import triton.language as tl

from .epilogue import apply_epilogue
from .tma_mainloop import dot_k_range
from .tile_order import grouped_tile


@triton.jit
def _tile_origin(tile, grid_m, grid_n, GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(batch, first row, first column) of output tile `tile`, batches outermost."""
    per_matrix = grid_m * grid_n
    pid_m, pid_n = grouped_tile(tile % per_matrix, grid_m, grid_n, GROUP_M)
    return tile // per_matrix, pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _range_start(program, sk_iters, programs):
    """First stream-K iteration of `program`: an even deal of sk_iters over the programs."""
    return program * sk_iters // programs


@triton.jit
def _slot_tile(ws_ptr, slot, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers to the [BLOCK_M, BLOCK_N] partial sum in workspace slot `slot`: where its
    program stores it and its owner reads it."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return ws_ptr + slot.to(tl.int64) * (BLOCK_M * BLOCK_N) + offs


@triton.jit
def gemm_stream_k(a_desc, b_desc, c_desc, ws_ptr, flags_ptr, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
                  M, N, K, batch, a_batch_step, b_batch_step, sk_tiles,
                  stride_bias, stride_rb, stride_rm, stride_rn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr,
                  SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr):
    """`ws_ptr`: fp32 [programs, 2, BLOCK_M, BLOCK_N], a program's start and end segment partials;
    `flags_ptr`: int32 [programs, 2], zeros, set to 1 once a partial is stored."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    tiles = grid_m * grid_n * batch
    k_tiles = tl.cdiv(K, BLOCK_K)

    # This program's stream-K range, and the (at most two) tiles it cuts.
    sk_iters = sk_tiles.to(tl.int64) * k_tiles
    lo = _range_start(pid, sk_iters, programs)
    hi = _range_start(pid + 1, sk_iters, programs)
    first_tile = lo // k_tiles
    last_tile = (hi - 1) // k_tiles
    segments = tl.where(hi > lo, tl.where(first_tile != last_tile, 2, 1), 0)
    whole_tiles = tl.cdiv(tl.maximum(tiles - sk_tiles - pid, 0), programs)

    for item in range(0, segments + whole_tiles):
        # Item 0 is the start segment of the last tile cut, item 1 the end of the first;
        # then whole tiles, dealt round-robin after the stream-K tiles.
        is_segment = item < segments
        tile = tl.where(is_segment, tl.where(item == segments - 1, first_tile, last_tile),
                        sk_tiles + pid + (item - segments) * programs)
        tile_start = tile * k_tiles
        k_lo = tl.where(is_segment, tl.maximum(lo, tile_start) - tile_start, 0).to(tl.int32)
        k_hi = tl.where(is_segment, tl.minimum(hi, tile_start + k_tiles) - tile_start, k_tiles).to(tl.int32)
        slot = (is_segment & (segments == 2) & (item == 0)).to(tl.int32)

        pid_b, off_m, off_n = _tile_origin(tile.to(tl.int32), grid_m, grid_n, GROUP_M, BLOCK_M, BLOCK_N)
        a_b = pid_b * a_batch_step
        b_b = pid_b * b_batch_step
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
        acc = dot_k_range(acc, a_desc, b_desc, a_b, b_b, off_m, off_n, k_lo, k_hi, BLOCK_M, BLOCK_N, BLOCK_K,
                          A_K_MAJOR, B_K_MAJOR, DOT_PRECISION, ACC_DTYPE)
        acc = acc.to(tl.float32)

        if k_hi < k_tiles:  # not the tile's end: hand the partial sum to its owner
            tl.store(_slot_tile(ws_ptr, pid * 2 + slot, BLOCK_M, BLOCK_N), acc)
            tl.debug_barrier()  # every thread's part is stored before the flag says so
            tl.atomic_xchg(flags_ptr + pid * 2 + slot, 1, sem="release")
        else:
            # The owner: add the partials of the programs before it, nearest first.
            covered = tile_start + k_lo
            q = pid - 1
            while covered > tile_start:
                q_lo = _range_start(q, sk_iters, programs)
                if _range_start(q + 1, sk_iters, programs) > q_lo:
                    q_slot = (q_lo < tile_start).to(tl.int32)
                    while tl.atomic_add(flags_ptr + q * 2 + q_slot, 0, sem="acquire") == 0:
                        pass
                    acc += tl.load(_slot_tile(ws_ptr, q * 2 + q_slot, BLOCK_M, BLOCK_N), cache_modifier=".cg")
                covered = tl.maximum(q_lo, tile_start)
                q -= 1
            offs_m = off_m + tl.arange(0, BLOCK_M)
            offs_n = off_n + tl.arange(0, BLOCK_N)
            acc = apply_epilogue(acc, offs_m, offs_n, M, N, pid_b, scale_a_ptr, scale_b_ptr,
                                 bias_ptr, stride_bias, res_ptr, stride_rb, stride_rm, stride_rn,
                                 SCALED, HAS_BIAS, ACTIVATION, HAS_RESIDUAL)
            c_desc.store([pid_b, off_m, off_n], acc.to(c_desc.dtype).reshape(1, BLOCK_M, BLOCK_N))
