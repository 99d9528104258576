"""Family `im2col`: a dense conv of few input channels as its window matrix times the weight.

Stage `im2col` (kernels/im2col.py) writes cols, the pixels x JP matrix of x's windows
(J = taps x C pairs, zero-padded to JP for 16-byte rows); stage `gemm` (here) hands it to
the GEMM op: forward y = cols @ w^T with the epilogue fused, backward-weight
dw = dy^T @ cols. The weight side is a JP-wide copy, padded with zeros (forward) or cut
back to J columns (backward-weight): a few KB for a stem.
"""

from __future__ import annotations

import math

import torch

from ...core.runtime import current_arch
from ..gemm import gemm
from ..gemm.problem import GemmLayout, GemmProblem, GemmTypes, Layout
from .pointwise import gemm_dispatcher, matrix
from .problem import ConvProblem, Direction

ROW_ALIGNMENT = 8  # cols' rows and the weight copy's are padded to a multiple of this many elements (16 B)


def widths(p: ConvProblem) -> tuple[int, int]:
    """(J, JP): the window's (tap, channel) pairs, and the row length cols and the weight copy are padded to."""
    j = math.prod(p.filter_size) * p.c_per_group
    return j, -(-j // ROW_ALIGNMENT) * ROW_ALIGNMENT


def weight_matrix(w: torch.Tensor) -> torch.Tensor:
    """The weight (K, C, *filter) as K x (taps x C) in GKZYXC order: a view of a channels-last weight."""
    return w.movedim(1, -1).reshape(w.shape[0], -1)


def run(cols, w, dy, bias, residual, out, weight_columns, problem: ConvProblem) -> None:
    """The gemm stage: cols (pixels x JP) times the weight, or dy^T times cols, into `out`."""
    p = problem
    j, _ = widths(p)
    dispatcher = gemm_dispatcher(current_arch())
    if p.direction is Direction.FORWARD:
        weight_columns[:, :j].copy_(weight_matrix(w))
        weight_columns[:, j:].zero_()
        target = matrix(out)
        result = gemm(cols, weight_columns.t(), bias=bias, activation=p.epilogue.activation,
                      residual=matrix(residual) if residual is not None else None, out=target,
                      allow_tf32=p.types.allow_tf32, dispatcher=dispatcher)
        if target.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
            out.movedim(1, -1).copy_(result.reshape(out.movedim(1, -1).shape))
    else:
        gemm(matrix(dy).t(), cols, out=weight_columns, allow_tf32=p.types.allow_tf32, dispatcher=dispatcher)
        out.movedim(1, -1).copy_(weight_columns[:, :j].reshape(out.movedim(1, -1).shape))


def gemm_problem(p: ConvProblem) -> GemmProblem:
    """The GEMM stage's problem, for the ranking."""
    pixels = p.n * math.prod(p.output_size)
    _, jp = widths(p)
    types = GemmTypes(p.types.dtype, p.types.dtype, p.types.dtype, allow_tf32=p.types.allow_tf32)
    if p.direction is Direction.FORWARD:
        return GemmProblem(pixels, p.k, jp, types=types, layout=GemmLayout(Layout.ROW, Layout.COL, Layout.ROW),
                           epilogue=p.epilogue)
    return GemmProblem(p.k, jp, pixels, types=types, layout=GemmLayout(Layout.COL, Layout.ROW, Layout.ROW))
