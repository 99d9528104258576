"""Family `gemm`'s call: a 1x1, stride-1, unpadded dense conv as one call of the GEMM op (the family's
config, rules and score: families/pointwise.py).

Channels-last, each tensor of such a conv is a matrix of pixels x channels (x: P x C,
dy and y: P x K) and the weight is K x C, so every direction is a plain product:
forward y = x @ w^T (with the epilogue: the GEMM op fuses bias, activation and residual),
backward-data dx = dy @ w, backward-weight dw = dy^T @ x. The GEMM op's own ranking
picks the tile among its Triton kernels only (cuDNN is the conv's vendor candidate; cuBLAS
is not this family's), and its fast path replays the call.
"""

from __future__ import annotations

import math

import torch

from ...core.dispatcher import Dispatcher
from ...core.memo import LruTable
from ...core.op import RuleSet
from ...core.registry import Registry
from ...core.tensors import shares_storage
from ..gemm import OP as GEMM_OP
from ..gemm import GemmLayout, GemmProblem, GemmTypes, Layout, gemm
from .problem import ConvProblem, Direction

_DISPATCHERS = LruTable(None)  # one per arch, made once even when threads ask together


def gemm_dispatcher(arch) -> Dispatcher:
    """The GEMM op's default kernels for `arch` without its vendor path (the family runs Triton), one per arch.

    Its registry is lazy, as the default dispatcher's: a GEMM problem's first sight generates and
    ranks its own class of kernels, not the whole rule set (90 ms a new 1x1 conv on the CPU machine)."""
    def make() -> Dispatcher:
        registry = Registry.from_rule_sets([GEMM_OP.kind], RuleSet.DEFAULT, arch,
                                           keep=lambda spec: not spec.is_vendor)
        return Dispatcher(registry, arch)
    return _DISPATCHERS.get_or_make(arch.name, make)


def gemm_op_dispatcher(arch) -> Dispatcher:
    """The GEMM op's default kernels for `arch`, its vendor path among them, ranked as
    `tiledispatch.gemm` ranks them there (`default_strategy`): what the op would run a product on."""
    from ...core.dispatcher import default_strategy

    def make() -> Dispatcher:
        registry = Registry.from_rule_sets([GEMM_OP.kind], RuleSet.DEFAULT, arch)
        return Dispatcher(registry, arch, strategy=default_strategy(arch))
    return _DISPATCHERS.get_or_make(("with the vendor", arch.name), make)


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """(A, B, *spatial) channels-last as the (A * pixels) x B matrix: a view where its strides allow."""
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def run(operands, out: torch.Tensor, dispatcher: Dispatcher) -> None:
    """Computes the conv of `operands` (a ConvOperands) into `out` as one GEMM by `dispatcher`
    (`gemm_dispatcher`, resolved when the conv is planned: a replay does not look it up again)."""
    p = operands.problem
    if p.direction is Direction.FORWARD:
        residual = _matrix(operands.residual) if operands.residual is not None else None
        a, b = _matrix(operands.x), operands.w.reshape(p.k, p.c).t()
        kwargs = {"bias": operands.bias, "activation": p.epilogue.activation, "residual": residual}
    elif p.direction is Direction.BWD_DATA:
        a, b, kwargs = _matrix(operands.dy), operands.w.reshape(p.k, p.c), {}
    else:
        a, b, kwargs = _matrix(operands.dy).t(), _matrix(operands.x), {}
    target = out.reshape(p.k, p.c) if p.direction is Direction.BWD_WEIGHT else _matrix(out)
    # The conv decides what autograd records (function.py); the GEMM inside one is no op of the caller's.
    with torch.no_grad():
        result = gemm(a, b, out=target, allow_tf32=p.types.allow_tf32, dispatcher=dispatcher, **kwargs)
    if not shares_storage(target, out):  # reshape gave a copy, not a view
        _write_back(result, out, p)


def _write_back(result: torch.Tensor, out: torch.Tensor, p: ConvProblem) -> None:
    """The product into an `out` whose strides no 2-D view has (a copy was computed instead)."""
    if p.direction is Direction.BWD_WEIGHT:
        out.copy_(result.reshape(out.shape))
    else:
        out.movedim(1, -1).copy_(result.reshape(out.movedim(1, -1).shape))


def gemm_problem(p: ConvProblem) -> GemmProblem:
    """The GEMM a pointwise conv is, for the ranking (operands dense and channels-last)."""
    pixels = p.n * math.prod(p.output_size)
    types = GemmTypes(p.types.dtype, p.types.dtype, p.types.dtype, allow_tf32=p.types.allow_tf32)
    if p.direction is Direction.FORWARD:  # the conv's epilogue is the GEMM op's own
        return GemmProblem(pixels, p.k, p.c, types=types, layout=GemmLayout(Layout.ROW, Layout.COL, Layout.ROW),
                           epilogue=p.epilogue)
    if p.direction is Direction.BWD_DATA:
        return GemmProblem(pixels, p.c, p.k, types=types)
    return GemmProblem(p.k, p.c, pixels, types=types, layout=GemmLayout(Layout.COL, Layout.ROW, Layout.ROW))
