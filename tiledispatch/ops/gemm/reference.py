"""The GEMM reference: the same function in float64 (on the CPU by default), for tests, --validate
and sweeps. A sweep computes it on the GPU, whose float64 tensor cores take a large GEMM in a
fraction of a second where the CPU takes minutes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.comparison import TF32_ROUNDOFF, UNIT_ROUNDOFF, Comparison, relative_comparison
from ...core.dtypes import DType
from .operands import GemmOperands
from .problem import Activation, GemmTypes


def reference(ops: GemmOperands, device="cpu") -> torch.Tensor:
    """float64 result of shape (batch, M, N), computed by PyTorch on `device`."""
    a = ops.a.detach().to(device, torch.float64)
    b = ops.b.detach().to(device, torch.float64)
    out = torch.matmul(a, b)
    if ops.scale_a is not None:
        out = out * float(ops.scale_a) * float(ops.scale_b)
    if ops.bias is not None:
        out = out + ops.bias.detach().to(device, torch.float64)
    activation = ops.problem.epilogue.activation
    if activation is Activation.RELU:
        out = F.relu(out)
    elif activation is Activation.GELU:
        out = F.gelu(out)
    elif activation is Activation.SILU:
        out = F.silu(out)
    if ops.residual is not None:
        out = out + ops.residual.detach().to(device, torch.float64)
    return out.expand(ops.problem.batch, ops.problem.m, ops.problem.n)


def tolerance(types: GemmTypes) -> float:
    """Allowed ||out - ref|| / ||ref|| for these types: a few roundoffs of the coarsest step."""
    steps = [UNIT_ROUNDOFF[types.c], 2e-6]  # fp32 accumulation over long K
    if types.allow_tf32:
        steps.append(TF32_ROUNDOFF)
    if types.acc is DType.FP16:
        steps.append(UNIT_ROUNDOFF[DType.FP16] * 4)
    return 4 * max(steps)


def compare(out: torch.Tensor, ops: GemmOperands) -> Comparison:
    return relative_comparison(out, reference(ops), tolerance(ops.problem.types))
