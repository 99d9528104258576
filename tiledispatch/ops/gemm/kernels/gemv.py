"""Family `gemv`: one row of A (M = 1, a language model's decode step), on the CUDA cores.

With one row a tensor-core tile computes 15 padding rows of its 16 and stages B through
shared memory for nothing: the call is a stream of B at memory speed. Program (pid_n, _,
pid_b) reduces BLOCK_N columns of B over the whole of K, BLOCK_K elements a step, into an
fp32 [BLOCK_N, BLOCK_K] accumulator summed once at the end. Narrow column tiles give every
SM many programs, so K is never split: one launch, no workspace, a fixed summation order.

STEPS K steps are loaded before any of them is used (the config's `num_stages`; Triton's own
pipeliner is off): the bytes a thread has in flight grow with STEPS while the accumulator
stays one step wide. On the H100 (benchmarks/results/h100/gemm_sweep_gemv_steps.csv) fp8 1x2x512
over 2 warps ran 0.86-1.03x torch._scaled_mm one step at a time and 1.03-1.17x four at a time.

On the H100 (benchmarks/results/h100/gemm_decode.csv, llama3_8b_o_T1 in bf16: 4096 x 4096)
it ran 12.5 us where cuBLAS took 15.4 and the best tensor-core tile (tiled 16x32x512) 14.5;
over the six T = 1 Llama projections, 1.05-1.24x cuBLAS.
"""

import triton
import triton.language as tl

from .epilogue import apply_epilogue


@triton.jit
def gemm_gemv(a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
              M, N, K,
              stride_ab, stride_am, stride_ak,
              stride_bb, stride_bk, stride_bn,
              stride_cb, stride_cm, stride_cn,
              stride_bias, stride_rb, stride_rm, stride_rn,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STEPS: tl.constexpr,
              SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = offs_n < N
    a_row = a_ptr + pid_b.to(tl.int64) * stride_ab
    b_base = b_ptr + pid_b.to(tl.int64) * stride_bb + offs_n[:, None] * stride_bn

    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K * STEPS):
        a_steps = ()
        b_steps = ()
        for i in tl.static_range(STEPS):  # every load of the STEPS steps issued before the first FMA
            offs_k = k0 + i * BLOCK_K + tl.arange(0, BLOCK_K)
            in_k = offs_k < K
            a_steps = a_steps + (tl.load(a_row + offs_k * stride_ak, mask=in_k, other=0.0),)
            b_steps = b_steps + (tl.load(b_base + offs_k[None, :] * stride_bk, mask=in_n[:, None] & in_k[None, :],
                                         other=0.0),)
        for i in tl.static_range(STEPS):
            acc += b_steps[i].to(tl.float32) * a_steps[i].to(tl.float32)[None, :]

    row = tl.sum(acc, axis=1)[None, :]  # the [1, BLOCK_N] tile of C the epilogue takes
    offs_m = tl.arange(0, 1)
    row = apply_epilogue(row, offs_m, offs_n, M, N, pid_b, scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias,
                         res_ptr, stride_rb, stride_rm, stride_rn, SCALED, HAS_BIAS, ACTIVATION, HAS_RESIDUAL)
    c = c_ptr + pid_b.to(tl.int64) * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c, row.to(c_ptr.dtype.element_ty), mask=in_n[None, :])
