"""Family `tiled`: pointer loads, grouped tile order, optional split-K. Every arch, every stride.

Program (pid, pid_k, pid_b) computes one BLOCK_M x BLOCK_N tile of batch pid_b over its
share of K. With SPLIT_K == 1 it applies the epilogue and stores C; otherwise it stores
its fp32 partial sum into a workspace [batch, SPLIT_K, M, N] that `splitk_reduce` sums
in a fixed order, so the result is deterministic.
"""

import triton
import triton.language as tl

from .epilogue import apply_epilogue
from .tile_order import grouped_tile


@triton.jit
def gemm_tiled(a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
               M, N, K,
               stride_ab, stride_am, stride_ak,
               stride_bb, stride_bk, stride_bn,
               stride_cb, stride_cm, stride_cn,
               stride_bias, stride_rb, stride_rm, stride_rn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
               SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
               HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_b = tl.program_id(2)

    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Edges are masked, not wrapped (offs % M): a wrapped index hides the contiguity that
    # vector loads need, while a mask against a size known to be a multiple of 16 keeps it.
    in_m = offs_m[:, None] < M
    in_n = offs_n[None, :] < N
    a_base = a_ptr + pid_b.to(tl.int64) * stride_ab + offs_m[:, None] * stride_am
    b_base = b_ptr + pid_b.to(tl.int64) * stride_bb + offs_n[None, :] * stride_bn

    k_tiles = tl.cdiv(K, BLOCK_K)
    k_tiles_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_first = pid_k * k_tiles_per_split
    k_last = min(k_first + k_tiles_per_split, k_tiles)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    for kt in range(k_first, k_last):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.load(a_base + offs_k[None, :] * stride_ak, mask=in_m & (offs_k[None, :] < K), other=0.0)
        b = tl.load(b_base + offs_k[:, None] * stride_bk, mask=(offs_k[:, None] < K) & in_n, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION, out_dtype=ACC_DTYPE)

    mask = in_m & in_n
    acc = acc.to(tl.float32)
    if SPLIT_K == 1:
        acc = apply_epilogue(acc, offs_m, offs_n, M, N, pid_b, scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias,
                             res_ptr, stride_rb, stride_rm, stride_rn, SCALED, HAS_BIAS, ACTIVATION, HAS_RESIDUAL)
        c = c_ptr + pid_b.to(tl.int64) * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        slab = (pid_b.to(tl.int64) * SPLIT_K + pid_k) * M
        ws = c_ptr + (slab + offs_m[:, None]) * N + offs_n[None, :]
        tl.store(ws, acc, mask=mask)
