"""A device-to-device copy by a kernel: the bandwidth a memory-bound kernel is held to.

Why not ``dst.copy_(src)``: PyTorch sends a contiguous copy of one dtype to
cudaMemcpyAsync, which on the H200 moved 1.4-1.55x fewer bytes a second than a copy
kernel of the same sizes (17, 38 and 537 MB read + written: 2.12, 2.44 and 2.73 TB/s
against 2.93, 3.49 and 4.23; PyTorch's own elementwise kernel, ``torch.add(src, 0,
out=dst)``, matched this one within 1 %). A kernel is what a convolution's kernel
competes with, and the large copy reaches the 4.25 TB/s of ANCHORS.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.runtime import interpreting

BLOCK = 1024  # elements a program; with 4 warps the fastest of 1024-8192 at 17-537 MB
WARPS = 4
# Triton vectorizes the masked loads and stores only where it can prove the element count a multiple
# of 16: a count that is not (a conv's bytes with its filter's) copied at 1-2 TB/s on the H200 where
# its neighbours ran 3.1-3.9 (58 MB in 56 us against 15.8; benchmarks/results/h200, 2026-11-26).
EVEN_ELEMENTS = 16


def copy_elements(moved: int, itemsize: int) -> int:
    """Elements of a copy that moves about `moved` bytes, half read and half written: rounded down
    to EVEN_ELEMENTS (under 32 elements off), so that the copy runs at the speed of its size."""
    return moved // (2 * itemsize) // EVEN_ELEMENTS * EVEN_ELEMENTS


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=inside), mask=inside)


def kernel_copy(src, dst) -> None:
    """dst <- src for two contiguous tensors of one dtype and size, by a Triton kernel."""
    if src.dtype != dst.dtype or src.numel() != dst.numel() or not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError(f"kernel_copy takes two contiguous tensors of one dtype and size; got {src.dtype} "
                         f"{tuple(src.shape)} and {dst.dtype} {tuple(dst.shape)}")
    n = src.numel()
    with interpreting():  # the interpreter runs one kernel at a time
        _copy[(triton.cdiv(n, BLOCK),)](src, dst, n, BLOCK=BLOCK, num_warps=WARPS)
