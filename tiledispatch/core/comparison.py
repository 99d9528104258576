"""How an output compares with its float64 reference: the record every op's tests, `--validate`
and benchmarks share, and the unit roundoffs their tolerances are built from."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .dtypes import DType

# Unit roundoff of each output type, and of the inputs as tf32 tensor cores see them.
UNIT_ROUNDOFF = {DType.FP32: 6e-8, DType.FP16: 4.9e-4, DType.BF16: 3.9e-3}
TF32_ROUNDOFF = 4.9e-4


@dataclass(frozen=True)
class Comparison:
    max_abs_error: float
    relative_error: float  # Frobenius norm of the error over that of the reference
    tolerance: float
    unwritten: int  # NaN where the reference is finite: elements the kernel never stored

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and math.isfinite(self.relative_error) and self.relative_error <= self.tolerance

    def to_dict(self) -> dict:
        return {"max_abs_error": self.max_abs_error, "relative_error": self.relative_error,
                "tolerance": self.tolerance, "unwritten": self.unwritten, "passed": self.passed}


def relative_comparison(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> Comparison:
    """`out` (any device and dtype, reshaped to `ref`) against the float64 reference `ref`, on
    `ref`'s device (the CPU's, or a sweep's GPU, where a large output would take seconds to copy)."""
    got = out.detach().to(ref.device, torch.float64).reshape(ref.shape)
    unwritten = int((torch.isnan(got) & ~torch.isnan(ref)).sum())
    diff = got - ref
    rel = float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref).clamp_min(1e-300))
    return Comparison(float(diff.abs().max()), rel, tolerance, unwritten)
