"""The roofline every op's `rules` ranking stands on: a machine's rates and a problem's ideal time.

An op's time model divides its work by these rates and stretches it by its own kernels'
terms; the ideal time (the larger of FLOPs at peak and bytes at DRAM bandwidth) is what each
score is measured against. The rates come from the arch facts only (``arch.peak_tflops``,
``arch.memory_bandwidth_gbs``, ``arch.calibration``), so that every op ranks one machine alike.
"""

from __future__ import annotations

import functools
import operator
from typing import Callable, TypeVar

from ..core.dtypes import DType

T = TypeVar("T")


def dram_bytes_per_s(arch) -> float:
    """DRAM bandwidth in bytes a second."""
    return arch.memory_bandwidth_gbs * 1e9


def tensor_flops(arch, dtype: DType) -> float:
    """Dense tensor-core FLOP/s for `dtype`; a dtype without tensor cores here is read as fp16."""
    dtype = dtype if arch.supports_dtype(dtype) else DType.FP16
    return arch.peak_tflops.get(dtype, max(arch.peak_tflops.values())) * 1e12


def fma_flops(arch) -> float:
    """The CUDA cores' fp32 FMA FLOP/s (the arch's fp32 peak is tf32 on tensor cores)."""
    return arch.peak_tflops[DType.FP32] * 1e12 * arch.calibration.fma_share_of_tf32


def ideal_seconds(flops: float, bytes_moved: float, peak_flops: float, arch) -> float:
    """The larger of the work at `peak_flops` and the bytes at DRAM bandwidth."""
    return max(flops / peak_flops, bytes_moved / dram_bytes_per_s(arch))


def soft_max(first: float, second: float, power: int = 3) -> float:
    """The bound that dominates sets the time; the other still separates near-ties."""
    return (first**power + second**power) ** (1 / power)


def per_problem(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` of a problem (and the arch), kept for the last arguments it was called with.

    A problem's ranking scores each accepted candidate in turn, and every score reads the same
    facts of the problem (its peak, its ideal time, its GEMM view): some 30 calls a problem with
    the same arguments, each as costly as a small score's own arithmetic. The arguments are
    compared by identity (problems and archs are frozen, and the entry holds them, so an id is
    not reused while kept); the entry is replaced whole, so threads share it safely.
    """
    last: tuple[tuple, T] | None = None

    @functools.wraps(fn)
    def kept(*args):
        nonlocal last
        entry = last
        if entry is not None and len(entry[0]) == len(args) and all(map(operator.is_, entry[0], args)):
            return entry[1]
        value = fn(*args)
        last = (args, value)
        return value

    return kept
