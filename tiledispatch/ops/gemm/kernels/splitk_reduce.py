"""Second stage of split-K: sum the fp32 partials in a fixed order, then the epilogue."""

import triton
import triton.language as tl

from .epilogue import apply_epilogue


@triton.jit
def splitk_reduce(ws_ptr, c_ptr, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
                  M, N,
                  stride_cb, stride_cm, stride_cn,
                  stride_bias, stride_rb, stride_rm, stride_rn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                  SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        slab = (pid_b.to(tl.int64) * SPLIT_K + s) * M
        acc += tl.load(ws_ptr + (slab + offs_m[:, None]) * N + offs_n[None, :], mask=mask, other=0.0)
    acc = apply_epilogue(acc, offs_m, offs_n, M, N, pid_b, scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias,
                         res_ptr, stride_rb, stride_rm, stride_rn, SCALED, HAS_BIAS, ACTIVATION, HAS_RESIDUAL)
    c = c_ptr + pid_b.to(tl.int64) * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask)
