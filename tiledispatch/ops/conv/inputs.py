"""Random operands for a ConvProblem, channels-last (or contiguous, to test the conversion).

Values are fresh normal draws (never zeros, which hide unwritten outputs), scaled so
that each output sums to about 1 whatever the reduction length; the output is
poisoned with NaN so that an element the kernel never writes fails validation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .operands import channels_last_empty
from .problem import ConvProblem, Direction


@dataclass(frozen=True)
class ConvInputs:
    x: torch.Tensor | None
    w: torch.Tensor | None
    dy: torch.Tensor | None
    bias: torch.Tensor | None
    residual: torch.Tensor | None
    out: torch.Tensor

    def kwargs(self, problem: ConvProblem) -> dict:
        """Keyword arguments of `check_operands` for this problem."""
        p = problem
        sizes = {"input_size": (p.n, p.c, *p.input_size)} if p.direction is Direction.BWD_DATA else (
            {"weight_size": (p.k, p.c_per_group, *p.filter_size)} if p.direction is Direction.BWD_WEIGHT else {})
        return dict(x=self.x, w=self.w, dy=self.dy, stride=p.stride, padding=p.padding, dilation=p.dilation,
                    groups=p.groups, bias=self.bias, activation=p.epilogue.activation, residual=self.residual,
                    out=self.out, allow_tf32=p.types.allow_tf32, **sizes)


def _tensor(shape, dtype, device, generator, scale: float, channels_last: bool) -> torch.Tensor:
    values = torch.randn(*shape, generator=generator, device=generator.device) * scale
    if not channels_last:
        return values.to(device=device, dtype=dtype)
    out = channels_last_empty(tuple(shape), dtype, device)
    out.copy_(values)
    return out


def make_inputs(problem: ConvProblem, device="cpu", seed: int = 0, channels_last: bool = True) -> ConvInputs:
    # Drawn where they will live: a CPU draw of a benchmark-sized tensor takes longer than the conv.
    g = torch.Generator(device=device).manual_seed(seed)
    p = problem
    dtype = p.types.dtype.torch
    taps = math.prod(p.filter_size)
    reduction = {Direction.FORWARD: p.c_per_group * taps, Direction.BWD_DATA: p.k_per_group * taps,
                 Direction.BWD_WEIGHT: p.n * math.prod(p.output_size)}[p.direction]
    spread = 1.0 / max(reduction, 1) ** 0.25

    def make(shape, scale=spread):
        return _tensor(shape, dtype, device, g, scale, channels_last)

    x_shape, w_shape = (p.n, p.c, *p.input_size), (p.k, p.c_per_group, *p.filter_size)
    y_shape = (p.n, p.k, *p.output_size)
    x = make(x_shape) if p.direction is not Direction.BWD_DATA else None
    w = make(w_shape) if p.direction is not Direction.BWD_WEIGHT else None
    dy = make(y_shape) if p.direction is not Direction.FORWARD else None
    bias = (torch.randn(p.k, generator=g, device=g.device) * 0.5).to(dtype) if p.epilogue.bias else None
    residual = make(y_shape, 1.0) if p.epilogue.residual else None
    out_shape = {Direction.FORWARD: y_shape, Direction.BWD_DATA: x_shape, Direction.BWD_WEIGHT: w_shape}[p.direction]
    out = channels_last_empty(out_shape, dtype, device).fill_(float("nan"))
    return ConvInputs(x, w, dy, bias, residual, out)


def tuning_operands(problem: ConvProblem, device, seed: int = 0):
    """Fresh checked operands of exactly this problem (for `autotune` and sweeps), or None where fresh
    channels-last tensors do not reproduce it.

    With no `out`, as a user's call has none: the vendor's call then takes its result's storage
    (vendor.run), where a given `out` costs it a copy, one more pass over the output that the
    kernels writing in place do not pay. Timed with an `out`, cuDNN read up to 2.3x its own time
    (a 1x1 conv of 32x64x56x56 to 256 channels: 44.2 us in the sweep, 19 us as F.conv2d)."""
    from .operands import check_operands

    inputs = make_inputs(problem, device=device, seed=seed)
    operands = check_operands(problem.direction, **{**inputs.kwargs(problem), "out": None})
    return operands if operands.problem == problem else None


def reference_output(operands):
    """The float64 result the sweep checks each kernel against (`reference.reference`), computed on
    the operands' device."""
    from .reference import reference

    return reference(operands, device=next(t for t in (operands.x, operands.dy, operands.w) if t is not None).device)


def check_output(output, expected, operands):
    """A kernel's output against `expected` (`reference_output`), under the types' tolerance."""
    from ...core.comparison import relative_comparison
    from .reference import tolerance

    return relative_comparison(output, expected, tolerance(operands.problem.types))
