"""The conv reference: PyTorch's CPU convolution in float64, for tests, --validate and benchmarks."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ...core.comparison import TF32_ROUNDOFF, UNIT_ROUNDOFF, Comparison, relative_comparison
from ..gemm import Activation
from .operands import ConvOperands
from .problem import ConvTypes, Direction

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_ACTIVATIONS = {Activation.RELU: F.relu, Activation.GELU: F.gelu, Activation.SILU: F.silu}


def _to_f64(t: torch.Tensor | None, device="cpu") -> torch.Tensor | None:
    return None if t is None else t.detach().to(device, torch.float64)


def reference(ops: ConvOperands, device="cpu") -> torch.Tensor:
    """The float64 result, shaped as the direction's output (y, dx or dw), computed on `device`
    (a sweep's on the GPU: a large conv takes the CPU minutes in float64)."""
    p = ops.problem
    _f64 = functools.partial(_to_f64, device=device)
    args = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation, "groups": p.groups}
    if p.direction is Direction.FORWARD:
        out = _CONV[p.spatial_dims](_f64(ops.x), _f64(ops.w), _f64(ops.bias), **args)
        if p.epilogue.activation in _ACTIVATIONS:
            out = _ACTIVATIONS[p.epilogue.activation](out)
        if ops.residual is not None:
            out = out + _f64(ops.residual)
        return out
    dy = _f64(ops.dy)
    zeros = functools.partial(torch.zeros, dtype=torch.float64, device=device)
    x = _f64(ops.x) if ops.x is not None else zeros(p.n, p.c, *p.input_size)
    w = _f64(ops.w) if ops.w is not None else zeros(p.k, p.c_per_group, *p.filter_size)
    mask = [p.direction is Direction.BWD_DATA, p.direction is Direction.BWD_WEIGHT, False]
    grads = torch.ops.aten.convolution_backward(dy, x, w, None, list(p.stride), list(p.padding), list(p.dilation),
                                                False, [0] * p.spatial_dims, p.groups, mask)
    return grads[0] if p.direction is Direction.BWD_DATA else grads[1]


def tolerance(types: ConvTypes) -> float:
    """Allowed ||out - ref|| / ||ref||: a few roundoffs of the coarsest step (fp32 sums over long reductions)."""
    steps = [UNIT_ROUNDOFF[types.dtype], 2e-6]
    if types.allow_tf32:
        steps.append(TF32_ROUNDOFF)
    return 4 * max(steps)


def compare(out: torch.Tensor, ops: ConvOperands) -> Comparison:
    """Relative Frobenius error against the float64 reference, and elements never written (NaN)."""
    return relative_comparison(out, reference(ops), tolerance(ops.problem.types))
