"""Family `tma-persistent`: Hopper tensor descriptors and one program per SM.

Operands and output move through TMA (the tensor memory accelerator): a descriptor
holds each matrix's shape and strides, so the copy engine clips the edges and no
thread computes an address or a mask. The grid is the number of SMs; each program
walks output tiles in grouped order, so the next tile's loads start while this one's
epilogue stores. Descriptors are 3-D (batch, rows, cols) with a block of one matrix,
so a tile never reads across a batch boundary.

Only operands whose last dim is contiguous fit a descriptor: A is read K-major
(layout r) or M-major (layout c, loaded as its transpose), B likewise, C is row-major.

With SPLIT_K > 1 a work unit is one tile's share of K, so a few output tiles over a deep K
still fill every SM. `c_desc` then stands for the fp32 workspace [batch * SPLIT_K, M, N]:
each unit stores its partial sum in its own slab, and `splitk_reduce` adds the slabs in a
fixed order and applies the epilogue (deterministic, as the tiled family's split-K).
"""

import triton
import triton.language as tl

from .epilogue import apply_epilogue
from .tma_mainloop import dot_k_range


@triton.jit
def gemm_tma_persistent(a_desc, b_desc, c_desc, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
                        M, N, K, batch, a_batch_step, b_batch_step,
                        stride_bias, stride_rb, stride_rm, stride_rn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr,
                        EPILOGUE_SPLIT: tl.constexpr, FLATTEN: tl.constexpr, SPLIT_K: tl.constexpr,
                        SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                        HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr):
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_matrix = grid_m * grid_n
    tiles_per_group = GROUP_M * grid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    units = tiles_per_matrix * batch * SPLIT_K
    for unit in tl.range(tl.program_id(0), units, tl.num_programs(0), flatten=FLATTEN):
        tile = unit // SPLIT_K
        pid_k = unit % SPLIT_K
        pid_b = tile // tiles_per_matrix
        pid = tile % tiles_per_matrix
        first_m = (pid // tiles_per_group) * GROUP_M
        group_rows = min(grid_m - first_m, GROUP_M)
        off_m = (first_m + (pid % tiles_per_group) % group_rows) * BLOCK_M
        off_n = ((pid % tiles_per_group) // group_rows) * BLOCK_N

        a_b = pid_b * a_batch_step
        b_b = pid_b * b_batch_step
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
        k_first = pid_k * k_tiles_per_split
        acc = dot_k_range(acc, a_desc, b_desc, a_b, b_b, off_m, off_n, k_first,
                          min(k_first + k_tiles_per_split, k_tiles), BLOCK_M, BLOCK_N, BLOCK_K,
                          A_K_MAJOR, B_K_MAJOR, DOT_PRECISION, ACC_DTYPE)

        acc = acc.to(tl.float32)
        slab = pid_b
        if SPLIT_K == 1:
            offs_m = off_m + tl.arange(0, BLOCK_M)
            offs_n = off_n + tl.arange(0, BLOCK_N)
            acc = apply_epilogue(acc, offs_m, offs_n, M, N, pid_b, scale_a_ptr, scale_b_ptr,
                                 bias_ptr, stride_bias, res_ptr, stride_rb, stride_rm, stride_rn,
                                 SCALED, HAS_BIAS, ACTIVATION, HAS_RESIDUAL)
        else:
            slab = pid_b * SPLIT_K + pid_k
        c = acc.to(c_desc.dtype)
        # Storing the tile in halves frees half the staging buffer (and its registers)
        # for the next tile's loads.
        if EPILOGUE_SPLIT == 2:
            left, right = c.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
            c_desc.store([slab, off_m, off_n], left.reshape(1, BLOCK_M, BLOCK_N // 2))
            c_desc.store([slab, off_m, off_n + BLOCK_N // 2], right.reshape(1, BLOCK_M, BLOCK_N // 2))
        else:
            c_desc.store([slab, off_m, off_n], c.reshape(1, BLOCK_M, BLOCK_N))
