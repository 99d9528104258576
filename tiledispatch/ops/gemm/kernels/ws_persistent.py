"""Family `ws-persistent`: the Hopper GEMM with its warps specialised, written in Gluon.

tma-persistent leaves the software pipeline to Triton's compiler: every warp issues the
copies, waits on them and runs the MMAs, and on the large aligned suite rows it ran
0.92-0.99x cuBLAS on the H100. Triton 3.6 does not specialise warps on Hopper by itself,
so this family states it by hand, as CUTLASS's cooperative kernels do:
  - a loader warp walks the same tiles as the MMA warps and keeps a ring of STAGES
    buffers full through TMA, each with a `ready` barrier (its copies landed) and an
    `empty` one (both warpgroups' MMAs that read it are done);
  - two MMA warpgroups share each output tile, one half of its rows each, and keep one
    wgmma in flight: a buffer is released as soon as the MMA after it is issued;
  - the loader runs ahead across tiles, so the next tile's first blocks land while the
    warpgroups store this one; each stores its half through its own staging buffer.
The grid is one program per SM over tiles in grouped order (tile_order's GROUP_M rows of
tiles at a time, so B's columns stay in L2). Both operands are read K-major (layout rcr, as
an nn.Linear weight is stored). The epilogue is every family's (`epilogue.apply_epilogue`)
in the accumulator's registers before the staging store: fp8 scales, bias and activation.
A residual's addresses beside the accumulator spilled, so the rules leave it to
tma-persistent.

The partitions take the same arguments (warp_specialize asks it of the workers): the
descriptors, `ring` (the shared buffers and their barriers), the sizes, and `epilogue`
(its pointers and strides), each using its share. warp_specialize hands them values, not
constants; the epilogue's flags reach them as the length of a buffer (`flag_buffer`).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .epilogue import apply_epilogue

_apply_epilogue = gluon.jit(apply_epilogue.fn)  # every family's epilogue, compiled by Gluon


@gluon.jit
def _tile(t, grid_m, grid_n, group_m):
    """(batch, tile row, tile column) of tile t: batches in turn, each in grouped order."""
    per_matrix = grid_m * grid_n
    pid_b = t // per_matrix
    pid = t % per_matrix
    per_group = group_m * grid_n
    first_m = (pid // per_group) * group_m
    rows = gl.minimum(grid_m - first_m, group_m)
    return pid_b, first_m + (pid % per_group) % rows, (pid % per_group) // rows


@gluon.jit
def flag_buffer(CODE: gl.constexpr):
    """A few bytes of shared memory 1 + CODE long. warp_specialize hands its partitions values,
    not constants, and an epilogue flag must be a constant to leave out the code it does not
    use; the length of a buffer is part of its type, which the partitions keep."""
    return gl.allocate_shared_memory(gl.int8, [1 + CODE], gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.jit
def finish(acc, flags, rows, cols, M, N, pid_b, epilogue):
    """The GEMM epilogue on a tile at `rows` x `cols` (slices of the accumulator's layout)."""
    CODE: gl.constexpr = flags.type.shape[0] - 1
    scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias, res_ptr, stride_rb, stride_rm, stride_rn = epilogue
    return _apply_epilogue(acc, rows, cols, M, N, pid_b, scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias, res_ptr,
                           stride_rb, stride_rm, stride_rn, CODE % 2, CODE // 2 % 2, CODE // 4 % 4, CODE // 16)


@gluon.jit
def allocate_ring(a_desc, b_desc, c_desc, STAGES: gl.constexpr, A_BLOCKS: gl.constexpr, READERS: gl.constexpr):
    """The ring's buffers (A_BLOCKS of A's block and one of B's a stage), two C staging buffers, and
    each stage's `ready` (one arrival: the loader's expect) and `empty` (READERS arrivals) barriers."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [A_BLOCKS * STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=READERS)
    return a_bufs, b_bufs, c_bufs, ready, empty


@gluon.jit
def zero_tile(ROWS: gl.constexpr, COLS: gl.constexpr, BITS: gl.constexpr):
    """A warpgroup's fp32 accumulator in wgmma's register layout (a K step of 256 bits of BITS-bit operands)."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, COLS, 256 // BITS])
    return gl.zeros([ROWS, COLS], gl.float32, layout)


@gluon.jit
def mma_k_loop(acc, a_bufs, b_bufs, ready, empty, count, k_tiles, A_STEP: gl.constexpr, A_FIRST: gl.constexpr):
    """acc plus one tile's K loop from the ring's buffers count, count + 1, ...: A's block of
    buffer s is a_bufs[A_STEP * s + A_FIRST]. One wgmma stays in flight; each buffer is
    released once the MMA after it is issued. Returns the sum and the next buffer's number."""
    HALF_M: gl.constexpr = a_bufs.type.shape[2]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[3]
    BLOCK_N: gl.constexpr = b_bufs.type.shape[2]
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    for kt in range(k_tiles):
        s = count % STAGES
        mbarrier.wait(ready.index(s), (count // STAGES) & 1)
        a = a_bufs.index(A_STEP * s + A_FIRST).reshape([HALF_M, BLOCK_K])
        b = b_bufs.index(s).reshape([BLOCK_N, BLOCK_K]).permute((1, 0))
        acc = warpgroup_mma(a, b, acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=[acc])  # the MMA before this one is done: release its buffer
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=kt > 0)
        count += 1
    acc = warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
    return acc, count


@gluon.jit
def store_tile(acc, flags, epilogue, c_desc, c_buf, pid_b, row, col, M, N):
    """The epilogue on a warpgroup's tile at (row, col), then its store through `c_buf` by TMA,
    once the warpgroup's previous store has read that buffer."""
    ROWS: gl.constexpr = acc.type.shape[0]
    COLS: gl.constexpr = acc.type.shape[1]
    rows = row + gl.arange(0, ROWS, gl.SliceLayout(1, acc.type.layout))
    cols = col + gl.arange(0, COLS, gl.SliceLayout(0, acc.type.layout))
    acc = finish(acc, flags, rows, cols, M, N, pid_b, epilogue)
    tma.store_wait(0)
    c_buf.reshape([ROWS, COLS]).store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [pid_b, row, col], c_buf)


@gluon.jit
def _loader(a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue):
    """The loader warp: both halves of A's block and B's block, tile after tile, stage after stage."""
    a_bufs, b_bufs, c_bufs, ready, empty, flags = ring
    HALF_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[2]
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    grid_m = gl.cdiv(M, 2 * HALF_M)
    grid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    nbytes: gl.constexpr = 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes
    count = 0
    for t in range(gl.program_id(0), grid_m * grid_n * batch, gl.num_programs(0)):
        pid_b, pid_m, pid_n = _tile(t, grid_m, grid_n, group_m)
        off_m = pid_m * 2 * HALF_M
        off_n = pid_n * BLOCK_N
        a_b = pid_b * a_batch_step
        b_b = pid_b * b_batch_step
        for kt in range(k_tiles):
            s = count % STAGES
            mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)  # a fresh barrier reads as phase 1 done
            mbarrier.expect(ready.index(s), nbytes)
            off_k = kt * BLOCK_K
            tma.async_copy_global_to_shared(a_desc, [a_b, off_m, off_k], ready.index(s), a_bufs.index(2 * s))
            tma.async_copy_global_to_shared(a_desc, [a_b, off_m + HALF_M, off_k], ready.index(s),
                                            a_bufs.index(2 * s + 1))
            tma.async_copy_global_to_shared(b_desc, [b_b, off_n, off_k], ready.index(s), b_bufs.index(s))
            count += 1


@gluon.jit
def _half(which: gl.constexpr, a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m,
          epilogue):
    """One MMA warpgroup: rows [which * HALF_M, (which + 1) * HALF_M) of every tile of this program."""
    a_bufs, b_bufs, c_bufs, ready, empty, flags = ring
    HALF_M: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[2]
    grid_m = gl.cdiv(M, 2 * HALF_M)
    grid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    c_buf = c_bufs.index(which)
    count = 0
    for t in range(gl.program_id(0), grid_m * grid_n * batch, gl.num_programs(0)):
        pid_b, pid_m, pid_n = _tile(t, grid_m, grid_n, group_m)
        acc = zero_tile(HALF_M, BLOCK_N, a_desc.dtype.primitive_bitwidth)
        acc, count = mma_k_loop(acc, a_bufs, b_bufs, ready, empty, count, k_tiles, 2, which)
        store_tile(acc, flags, epilogue, c_desc, c_buf, pid_b, pid_m * 2 * HALF_M + which * HALF_M, pid_n * BLOCK_N,
                   M, N)
    tma.store_wait(0)


@gluon.jit
def _first_half(a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue):
    _half(0, a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue)


@gluon.jit
def _second_half(a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue):
    _half(1, a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, group_m, epilogue)


@gluon.jit
def gemm_ws_persistent(a_desc, b_desc, c_desc, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
                       M, N, K, batch, a_batch_step, b_batch_step, stride_bias, stride_rb, stride_rm, stride_rn,
                       GROUP_M: gl.constexpr, STAGES: gl.constexpr, SCALED: gl.constexpr,
                       HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """Descriptors: A's block is half a tile's rows ([1, BLOCK_M / 2, BLOCK_K]), B's one tile's
    columns by BLOCK_K, C's half a tile ([1, BLOCK_M / 2, BLOCK_N])."""
    # Two A blocks a stage (a warpgroup's half each); both warpgroups release each buffer.
    a_bufs, b_bufs, c_bufs, ready, empty = allocate_ring(a_desc, b_desc, c_desc, STAGES, 2, 2)
    flags = flag_buffer(SCALED + 2 * HAS_BIAS + 4 * ACTIVATION + 16 * HAS_RESIDUAL)  # as `finish` reads it
    ring = (a_bufs, b_bufs, c_bufs, ready, empty, flags)
    epilogue = (scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias, res_ptr, stride_rb, stride_rm, stride_rn)
    args = (a_desc, b_desc, c_desc, ring, M, N, K, batch, a_batch_step, b_batch_step, GROUP_M, epilogue)
    # The warpgroups are partitions of their own, so neither waits on the other's barriers.
    gl.warp_specialize([(_first_half, args), (_second_half, args), (_loader, args)], [4, 1], [240, 24])
