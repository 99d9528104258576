"""GEMM: C = epilogue(A @ B), batched or not, in fp16, bf16, fp32/tf32 and fp8."""

from __future__ import annotations

import torch

from ...core.dispatcher import dispatcher_or_default
from ...core.dtypes import DType
from ...core.errors import UnsupportedError
from ...core.op import OpDefinition, register
from .config import AnyGemmConfig, Family, GemmConfig, VendorConfig
from . import fastpath
from .inputs import tuning_operands
from .operands import GemmOperands, check_operands
from .plan import kernel_units, plan
from .problem import KIND, Activation, Align, Alignment, Epilogue, GemmLayout, GemmProblem, GemmTypes, Layout
from .ranking import rule_score
from .rules import GemmRule, auto_correct, supports, validate
from .rulesets import RULE_SETS

OP = register(OpDefinition(
    kind=KIND,
    problem_type=GemmProblem,
    config_type=AnyGemmConfig,
    validate=validate,
    auto_correct=auto_correct,
    rule_sets=RULE_SETS,
    supports=supports,
    kernel_units=kernel_units,
    specialization_of=lambda problem: problem.alignment,
    specializations=(Alignment(), Alignment(*[False] * 6)),
    plan=plan,
    rule_score=rule_score,
    family_of=lambda config: config.family.value,
    dtype_of=lambda config: config.types.name,
    tuning_operands=tuning_operands,
))


def gemm(a, b, *, bias=None, activation=None, residual=None, out=None, out_dtype=None,
         allow_tf32: bool = False, scale_a=None, scale_b=None, kernel=None, dispatcher=None):
    """``activation(scale_a * scale_b * (a @ b) + bias) + residual``, by the fastest registered kernel.

    a is (M, K) or (batch, M, K), b is (K, N) or (batch, K, N); bias is (N,), residual
    (M, N) or (batch, M, N), both in the output dtype. fp8 inputs take per-tensor float32
    scales and give bf16 unless `out_dtype` says otherwise. `kernel` forces a kernel by
    name; `dispatcher` replaces the default one (its registry, strategy and cache).
    """
    dispatcher = dispatcher_or_default(dispatcher)
    # Written flat: it runs on every call, and grad mode is on by default (None has no requires_grad).
    if torch.is_grad_enabled() and (
            getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)
            or getattr(out, "requires_grad", False) or getattr(bias, "requires_grad", False)
            or getattr(residual, "requires_grad", False) or getattr(scale_a, "requires_grad", False)
            or getattr(scale_b, "requires_grad", False)):
        raise UnsupportedError(NOT_DIFFERENTIABLE)
    key = fastpath.call_key(a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b, kernel)
    if key is not None:  # a GPU call: bound once per signature, then replayed
        bound = dispatcher.memo(key, lambda: fastpath.bind(
            dispatcher, _checked(dispatcher, a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a,
                                 scale_b), kernel, result_2d=a.dim() == 2 and b.dim() == 2))
        return bound(a, b, bias, residual, out, scale_a, scale_b)
    operands = _checked(dispatcher, a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b)
    result = dispatcher.run(operands, kernel=kernel)
    return result.reshape(out.shape) if out is not None else result.reshape(_result_shape(a, b, operands))


# No backward is defined, so a result computed from tensors that require grad would silently
# have no gradient: refused rather than detached behind the caller's back.
NOT_DIFFERENTIABLE = ("gemm is not differentiable yet: call it under torch.no_grad() or on detached tensors, "
                      "or use torch.matmul (a tensor argument of this call requires grad)")


def _checked(dispatcher, a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b) -> GemmOperands:
    """Every check of a call: the operands, and the dtypes against the dispatcher's arch."""
    operands = check_operands(a, b, bias=bias, activation=activation, residual=residual, out=out,
                              out_dtype=out_dtype, allow_tf32=allow_tf32, scale_a=scale_a, scale_b=scale_b)
    _check_dtypes_on_arch(operands.problem.types, dispatcher.arch)
    return operands


def _check_dtypes_on_arch(types: GemmTypes, arch) -> None:
    """The DTYPE_ARCH rule, said about the call: no kernel of this arch can take these inputs."""
    for role, dtype in (("a", types.a), ("b", types.b)):
        if dtype is not DType.FP32 and not arch.supports_dtype(dtype):
            where = ("Triton's CPU interpreter (TRITON_INTERPRET=1), which has no " + dtype.value + " tl.dot"
                     if arch.is_interpreter else arch.name)
            raise UnsupportedError(
                f"{role} is {dtype.value}, but {dtype.value} GEMM cannot run on {where}; "
                f"use fp16 or fp32 inputs" + (", or run on a GPU" if arch.is_interpreter else ", or a newer GPU")
            )


def _result_shape(a, b, operands: GemmOperands) -> tuple[int, ...]:
    p = operands.problem
    return (p.m, p.n) if a.dim() == 2 and b.dim() == 2 else (p.batch, p.m, p.n)


__all__ = [
    "OP", "gemm", "GemmProblem", "GemmConfig", "GemmTypes", "GemmLayout", "Layout", "Epilogue", "Activation",
    "Align", "Alignment", "Family", "VendorConfig", "GemmRule", "GemmOperands", "check_operands", "validate", "auto_correct", "supports",
]
