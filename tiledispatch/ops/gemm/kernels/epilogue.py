"""The GEMM epilogue, shared by every family and by the split-K reduction.

Order is fixed: scale (fp8), bias, activation, residual. Constexpr flags drop what a
kernel does not use, so an epilogue-free kernel carries no dead code. Activation codes
are the `ACTIVATION_CODES` of ops/gemm/plan.py.
"""

import triton
import triton.language as tl


@triton.jit
def activate(acc, ACTIVATION: tl.constexpr):
    """acc through the activation of code ACTIVATION (0: none), elementwise in fp32."""
    if ACTIVATION == 1:  # relu
        acc = tl.maximum(acc, 0.0)
    elif ACTIVATION == 2:  # gelu, exact (erf) form
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    elif ACTIVATION == 3:  # silu
        acc = acc / (1.0 + tl.exp(-acc))
    return acc


@triton.jit
def apply_epilogue(acc, offs_m, offs_n, M, N, pid_b, scale_a_ptr, scale_b_ptr, bias_ptr, stride_bias,
                   res_ptr, stride_rb, stride_rm, stride_rn,
                   SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                   HAS_RESIDUAL: tl.constexpr):
    """acc is the fp32 [BLOCK_M, BLOCK_N] tile at rows offs_m, columns offs_n of batch pid_b."""
    if SCALED:
        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    acc = activate(acc, ACTIVATION)
    if HAS_RESIDUAL:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        res = res_ptr + pid_b * stride_rb + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn
        acc = acc + tl.load(res, mask=mask, other=0.0).to(tl.float32)
    return acc
