"""The K loop both TMA families run: tiles of A and B through tensor descriptors into one dot.

Descriptors are 3-D (batch, rows, cols), so each load is a [1, rows, cols] block; a
column-major operand is loaded as its transpose and transposed back in registers.
"""

import triton
import triton.language as tl


@triton.jit
def dot_k_range(acc, a_desc, b_desc, a_b, b_b, off_m, off_n, k_first, k_last,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr, DOT_PRECISION: tl.constexpr,
                ACC_DTYPE: tl.constexpr):
    """acc plus A[off_m tile, K tiles k_first..k_last) @ B[.., off_n tile] of batch (a_b, b_b)."""
    for kt in range(k_first, k_last):
        off_k = kt * BLOCK_K
        if A_K_MAJOR:
            a = a_desc.load([a_b, off_m, off_k]).reshape(BLOCK_M, BLOCK_K)
        else:
            a = a_desc.load([a_b, off_k, off_m]).reshape(BLOCK_K, BLOCK_M).T
        if B_K_MAJOR:
            b = b_desc.load([b_b, off_n, off_k]).reshape(BLOCK_N, BLOCK_K).T
        else:
            b = b_desc.load([b_b, off_k, off_n]).reshape(BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION, out_dtype=ACC_DTYPE)
    return acc
