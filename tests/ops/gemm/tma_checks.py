"""Shared by the tests of the TMA families (tma-persistent, stream-k): a dispatcher of one
family, and one run of a problem checked against float64."""

from __future__ import annotations

import torch

from tiledispatch import Dispatcher, Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import Family, GemmProblem, check_operands
from tiledispatch.ops.gemm.inputs import make_inputs
from tiledispatch.ops.gemm.reference import compare

from ...conftest import on_gpu

ARCH = current_arch()
DEVICE = "cuda" if on_gpu() else "cpu"


def family_dispatcher(family: Family, rule_set: str) -> Dispatcher:
    registry = Registry.from_rule_set("gemm", rule_set, ARCH).filter(lambda s: s.family == family.value)
    return Dispatcher(registry, ARCH)


def run_checked(dispatcher: Dispatcher, family: Family, problem: GemmProblem, *, kernel=None, broadcast_b=False,
                seed=0) -> torch.Tensor:
    """Runs `problem` (16-byte aligned operands, as TMA needs) into a NaN-poisoned out; asserts a
    kernel of `family` ran and the result is right, and returns it."""
    inputs = make_inputs(problem, device=DEVICE, seed=seed)
    b = inputs.b[:1] if broadcast_b else inputs.b
    ops = check_operands(inputs.a, b, activation=problem.epilogue.activation, allow_tf32=problem.types.allow_tf32,
                         **inputs.kwargs())
    assert all((ops.problem.alignment.a, ops.problem.alignment.b, ops.problem.alignment.c))
    spec = dispatcher.resolve(kernel, ops.problem) if kernel else dispatcher.select(ops.problem)
    assert spec.config.family is family
    dispatcher.run(ops, kernel=spec.name)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    result = compare(inputs.out, ops)
    assert result.passed, (spec.name, result.to_dict())
    return inputs.out
