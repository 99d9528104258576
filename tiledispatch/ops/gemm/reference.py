"""The GEMM reference: the same function in float64 on the CPU, for tests and --validate."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...core.dtypes import DType
from .operands import GemmOperands
from .problem import Activation, GemmTypes


def reference(ops: GemmOperands) -> torch.Tensor:
    """float64 result of shape (batch, M, N), computed by PyTorch on the CPU."""
    a = ops.a.detach().to("cpu", torch.float64)
    b = ops.b.detach().to("cpu", torch.float64)
    out = torch.matmul(a, b)
    if ops.scale_a is not None:
        out = out * float(ops.scale_a) * float(ops.scale_b)
    if ops.bias is not None:
        out = out + ops.bias.detach().to("cpu", torch.float64)
    activation = ops.problem.epilogue.activation
    if activation is Activation.RELU:
        out = F.relu(out)
    elif activation is Activation.GELU:
        out = F.gelu(out)
    elif activation is Activation.SILU:
        out = F.silu(out)
    if ops.residual is not None:
        out = out + ops.residual.detach().to("cpu", torch.float64)
    return out.expand(ops.problem.batch, ops.problem.m, ops.problem.n)


# Unit roundoff of each output type, and of the inputs as the tensor cores see them.
_ROUNDOFF = {DType.FP32: 6e-8, DType.FP16: 4.9e-4, DType.BF16: 3.9e-3}
_TF32_ROUNDOFF = 4.9e-4


def tolerance(types: GemmTypes) -> float:
    """Allowed ||out - ref|| / ||ref|| for these types: a few roundoffs of the coarsest step."""
    steps = [_ROUNDOFF[types.c], 2e-6]  # fp32 accumulation over long K
    if types.allow_tf32:
        steps.append(_TF32_ROUNDOFF)
    if types.acc is DType.FP16:
        steps.append(_ROUNDOFF[DType.FP16] * 4)
    return 4 * max(steps)


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


def compare(out: torch.Tensor, ops: GemmOperands) -> Comparison:
    ref = reference(ops)
    got = out.detach().to("cpu", torch.float64).reshape(ref.shape)
    unwritten = int((torch.isnan(got) & ~torch.isnan(ref)).sum())
    diff = got - ref
    rel = float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref).clamp_min(1e-300))
    return Comparison(float(diff.abs().max()), rel, tolerance(ops.problem.types), unwritten)
