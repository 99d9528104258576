"""Random operands for a GemmProblem, laid out as it says: for the CLI, tests and benchmarks.

Values are fresh normal draws (never zeros, which hide unwritten outputs), scaled so
that the sum over K stays near 1 and no dtype overflows; the output is poisoned with
NaN so that an element the kernel never writes fails validation. On the "meta" device no
values are drawn: the tensors carry shapes, strides and alignment only (for `explain`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .problem import GemmProblem, Layout


@dataclass(frozen=True)
class GemmInputs:
    a: torch.Tensor
    b: torch.Tensor
    bias: torch.Tensor | None
    residual: torch.Tensor | None
    out: torch.Tensor
    scale_a: torch.Tensor | None
    scale_b: torch.Tensor | None

    def kwargs(self) -> dict:
        return {"bias": self.bias, "residual": self.residual, "out": self.out,
                "scale_a": self.scale_a, "scale_b": self.scale_b}


def _draw(shape, generator: torch.Generator, scale: float, dtype: torch.dtype, device) -> torch.Tensor:
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    return (torch.randn(shape, generator=generator) * scale).to(device=device, dtype=dtype)


def _matrix(batch: int, rows: int, cols: int, layout: Layout, dtype: torch.dtype, device,
            generator: torch.Generator, scale: float) -> torch.Tensor:
    """A batch x rows x cols tensor whose matrices have `layout` (``s``: every other column)."""
    shape = {Layout.ROW: (batch, rows, cols), Layout.COL: (batch, cols, rows)}.get(layout, (batch, rows, 2 * cols + 1))
    base = _draw(shape, generator, scale, dtype, device)
    if layout is Layout.ROW:
        return base
    return base.transpose(1, 2) if layout is Layout.COL else base[:, :, 1::2]


def make_inputs(problem: GemmProblem, device="cpu", seed: int = 0, activation=None) -> GemmInputs:
    g = torch.Generator().manual_seed(seed)
    t, lay, p = problem.types, problem.layout, problem
    spread = 1.0 / max(p.k, 1) ** 0.25  # a @ b then has entries of about 1
    a = _matrix(p.batch, p.m, p.k, lay.a, t.a.torch, device, g, 1.0 if t.a.is_fp8 else spread)
    b = _matrix(p.batch, p.k, p.n, lay.b, t.b.torch, device, g, 1.0 if t.b.is_fp8 else spread)
    if p.batch == 1:
        a, b = a[0], b[0]
    c_dtype = t.c.torch
    bias = _draw((p.n,), g, 0.5, c_dtype, device) if p.epilogue.bias else None
    residual = None
    if p.epilogue.residual:
        residual = _draw((p.batch, p.m, p.n), g, 1.0, c_dtype, device)
        residual = residual[0] if p.batch == 1 else residual
    out = _matrix(p.batch, p.m, p.n, lay.c, c_dtype, device, g, 1.0).fill_(float("nan"))
    out = out[0] if p.batch == 1 else out
    scales = [None, None]
    if t.scaled:
        fp8_scale = (1.0 / max(p.k, 1)) ** 0.5
        scales = [torch.tensor(fp8_scale, dtype=torch.float32, device=device),
                  torch.tensor(1.0, dtype=torch.float32, device=device)]
    return GemmInputs(a, b, bias, residual, out, *scales)


def tuning_operands(problem: GemmProblem, device, seed: int = 0):
    """Fresh checked operands of exactly this problem (for `autotune`), or None: a problem whose
    alignment fresh tensors do not reproduce (an operand starting off a 16-byte boundary)."""
    from .operands import check_operands

    inputs = make_inputs(problem, device=device, seed=seed)
    operands = check_operands(inputs.a, inputs.b, allow_tf32=problem.types.allow_tf32,
                              activation=problem.epilogue.activation, **inputs.kwargs())
    return operands if operands.problem == problem else None


def reference_output(operands):
    """The float64 result the sweep checks each kernel against (`reference.reference`), computed on
    the operands' device."""
    from .reference import reference

    return reference(operands, device=operands.a.device)


def check_output(output, expected, operands):
    """A kernel's output against `expected` (`reference_output`), under the types' tolerance."""
    from ...core.comparison import relative_comparison
    from .reference import tolerance

    return relative_comparison(output, expected, tolerance(operands.problem.types))
