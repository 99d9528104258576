"""Family `ws-pingpong`: ws-persistent's loader and ring, with each MMA warpgroup on tiles of its own.

In ws-persistent both warpgroups share every tile, so both store it at once and the
tensor cores idle through each epilogue. Here warpgroup w takes the program's tiles
w, w + 2, w + 4, ... whole (BLOCK_M rows each): the loader fills the ring in tile order,
so one warpgroup's K loop runs while the other stores its last tile, and the two take
turns on the tensor cores (CUTLASS's ping-pong schedule). Each buffer of the ring is read
by one warpgroup, so its `empty` barrier takes one arrival; a warpgroup finds its place in
the ring by its tile's number in the program's sequence (every tile has the same K loop).
A warpgroup starts a tile's K loop only once the other has finished the tile before
(`passed`): a barrier's wait checks the parity of its phase only, so a wait for a buffer's
n-th fill would pass on its (n-2)-th if the (n-1)-th, the other warpgroup's, had not
landed yet; in turns, every buffer is filled and released in the ring's order.
Same operands, layout (rcr), epilogue and partition arguments as ws-persistent; `ring`
holds the `passed` barriers besides.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
)

from .ws_persistent import _tile, allocate_ring, flag_buffer, mma_k_loop, store_tile, zero_tile


@gluon.jit
def _loader(a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue):
    """The loader warp: A's and B's blocks of every tile of this program, in tile order."""
    a_bufs, b_bufs, c_bufs, ready, empty, passed, flags = ring
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[2]
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    grid_m = gl.cdiv(M, BLOCK_M)
    grid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    count = 0
    for t in range(gl.program_id(0), grid_m * grid_n * batch, gl.num_programs(0)):
        pid_b, pid_m, pid_n = _tile(t, grid_m, grid_n, group_m)
        a_b = pid_b * a_batch_step
        b_b = pid_b * b_batch_step
        for kt in range(k_tiles):
            s = count % STAGES
            mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)  # a fresh barrier reads as phase 1 done
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(a_desc, [a_b, pid_m * BLOCK_M, kt * BLOCK_K], ready.index(s),
                                            a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [b_b, pid_n * BLOCK_N, kt * BLOCK_K], ready.index(s),
                                            b_bufs.index(s))
            count += 1


@gluon.jit
def _turns(which: gl.constexpr, a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m,
           epilogue):
    """One MMA warpgroup: tiles which, which + 2, ... of this program's sequence, whole."""
    a_bufs, b_bufs, c_bufs, ready, empty, passed, flags = ring
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[2]
    grid_m = gl.cdiv(M, BLOCK_M)
    grid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    c_buf = c_bufs.index(which)
    first = gl.program_id(0)
    step = gl.num_programs(0)
    for t in range(first + which * step, grid_m * grid_n * batch, 2 * step):
        pid_b, pid_m, pid_n = _tile(t, grid_m, grid_n, group_m)
        j = (t - first) // step  # this tile's number in the program's sequence
        if j > 0:  # the other warpgroup's tile j - 1 is its ((j - 1) // 2)-th
            mbarrier.wait(passed.index(1 - which), ((j - 1) // 2) & 1)
        count = j * k_tiles  # this tile's first buffer in the ring's sequence
        acc = zero_tile(BLOCK_M, BLOCK_N, a_desc.dtype.primitive_bitwidth)
        acc, count = mma_k_loop(acc, a_bufs, b_bufs, ready, empty, count, k_tiles, 1, 0)
        mbarrier.arrive(passed.index(which))  # the other's next tile may start
        store_tile(acc, flags, epilogue, c_desc, c_buf, pid_b, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N)
    tma.store_wait(0)


@gluon.jit
def _even_tiles(a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue):
    _turns(0, a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue)


@gluon.jit
def _odd_tiles(a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue):
    _turns(1, a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue)


@gluon.jit
def gemm_ws_pingpong(a_desc, b_desc, c_desc, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
                     M, N, K, batch, a_batch_step, b_batch_step, stride_bias, stride_rb, stride_rm, stride_rn,
                     GROUP_M: gl.constexpr, STAGES: gl.constexpr, SCALED: gl.constexpr,
                     HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """Descriptors: A's block is a tile's rows by BLOCK_K, B's its columns by BLOCK_K, C's one tile."""
    a_bufs, b_bufs, c_bufs, ready, empty = allocate_ring(a_desc, b_desc, c_desc, STAGES, 1, 1)  # one reader a buffer
    passed = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(passed.index(i), count=1)
    flags = flag_buffer(SCALED + 2 * HAS_BIAS + 4 * ACTIVATION + 16 * HAS_RESIDUAL)  # as `finish` reads it
    ring = (a_bufs, b_bufs, c_bufs, ready, empty, passed, flags)
    epilogue = (scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias, res_ptr, stride_rb, stride_rm, stride_rn)
    args = (a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, GROUP_M, epilogue)
    gl.warp_specialize([(_even_tiles, args), (_odd_tiles, args), (_loader, args)], [4, 1], [240, 24])
