"""What the conv tests share: problems by hand, checked operands, and a run against the float64 reference."""

from __future__ import annotations

import os

from tiledispatch import KernelSpec, OpKind
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.conv import ConvProblem, ConvTypes, Direction, check_operands
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.reference import compare

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
ARCH = current_arch()


def problem(direction, n, c, k, g, size, filt, stride=1, padding=0, dilation=1, dtype="fp16", **kw) -> ConvProblem:
    return ConvProblem(Direction.parse(direction), n, c, k, g, tuple(size), tuple(filt), stride, padding, dilation,
                       ConvTypes.parse(dtype), **kw)


def run_and_check(dispatcher, p: ConvProblem, kernel=None, *, seed=0, channels_last=True):
    """Runs `p` (with `kernel` forced if given) into make_inputs' NaN-poisoned output and checks it.

    Returns (operands, the spec that ran) so that callers can assert on the choice.
    """
    inputs = make_inputs(p, device=DEVICE, seed=seed, channels_last=channels_last)
    ops = check_operands(p.direction, **inputs.kwargs(p))
    assert ops.problem.output_size == p.output_size and ops.problem.key() == ops.problem
    spec = dispatcher.resolve(kernel, ops.problem) if kernel is not None else dispatcher.select(ops.problem)
    result = dispatcher.run(ops, kernel=spec)
    assert result.data_ptr() == inputs.out.data_ptr(), "the result must land in the caller's out"
    cmp = compare(inputs.out, ops)
    assert cmp.passed, f"{spec.name} on {ops.problem.describe()}: {cmp.to_dict()}"
    return ops, spec


def spec_name(config) -> str:
    return KernelSpec(OpKind.CONV, config, ARCH.name).name
