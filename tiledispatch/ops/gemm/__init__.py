"""GEMM: C = epilogue(A @ B), batched or not, in fp16, bf16, fp32/tf32 and fp8."""

from __future__ import annotations

import torch

from ...core.args import as_kernel_name
from ...core.dispatcher import dispatcher_or_default
from ...core.dtypes import DType
from ...core.errors import UnsupportedError
from ...core.op import OpDefinition, register
from .config import AnyGemmConfig, Family, GemmConfig, VendorConfig
from . import families  # noqa: F401  (each family module registers itself in family.FAMILIES)
from . import fastpath
from .inputs import check_output, reference_output, tuning_operands
from .native import native_forward, recorded_native
from ..library_common import dispatcher_token, records_eagerly
from .operands import GemmOperands, _asked_dtype, _scale, check_operands
from .plan import ACTIVATION_CODES, kernel_units, plan
from .problem import (KIND, Activation, Align, Alignment, Epilogue, GemmLayout, GemmProblem, GemmTypes, Layout,
                      ranking_problem)
from .ranking import rule_score
from .rules import GemmRule, auto_correct, support_key, supports, validate
from .rulesets import RULE_SETS, problem_class
from .score_batch import GemmScoreBatch
from .spaces import SPACES
from .vendor import ACTIVATIONS

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

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
    is_vendor=lambda config: config.family is Family.VENDOR,
    dtype_of=lambda config: config.types.name,
    tuning_operands=tuning_operands,
    problem_class=problem_class,
    reference=reference_output,
    check=check_output,
    spaces=SPACES,
    support_key=support_key,
    score_batch=GemmScoreBatch,
    ranking_problem=ranking_problem,
))


def gemm(a, b, *, bias=None, activation=None, residual=None, out=None, out_dtype=None,
         allow_tf32: bool = False, scale_a=None, scale_b=None, kernel=None, dispatcher=None):
    """``activation(scale_a * scale_b * (a @ b) + bias) + residual``, by the fastest registered kernel.

    a is (M, K) or (batch, M, K), b is (K, N) or (batch, K, N); bias is (N,), residual
    (M, N) or (batch, M, N), both in the output dtype. fp8 inputs take per-tensor float32
    scales and give bf16 unless `out_dtype` says otherwise. `kernel` forces a kernel by
    name; `dispatcher` replaces the default one (its registry, strategy and cache).

    Differentiable where a, b, bias or residual requires grad (fp16, bf16, fp32): dA and dB
    are GEMMs selected for their own problems (library.py). Under torch.compile the call is
    the custom op tiledispatch::gemm, with the default dispatcher.
    """
    # Written flat: it runs on every call, and grad mode is on by default (None has no requires_grad).
    if torch.compiler.is_dynamo_compiling() or torch.is_grad_enabled() and (
            getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)
            or getattr(out, "requires_grad", False) or getattr(bias, "requires_grad", False)
            or getattr(residual, "requires_grad", False) or getattr(scale_a, "requires_grad", False)
            or getattr(scale_b, "requires_grad", False)):
        if (activation is None and residual is None and out is None and out_dtype is None and scale_a is None
                and scale_b is None and kernel is None and not torch.compiler.is_dynamo_compiling()):
            native = recorded_native(a, b, bias, allow_tf32, dispatcher)
            if native is not None:
                return native(a, b, bias)
        return _recorded(a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b, kernel,
                         dispatcher)
    dispatcher = dispatcher_or_default(dispatcher, a)
    key = fastpath.call_key(a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b, kernel)
    if key is not None:  # a GPU call: bound once per signature, then replayed
        bound = dispatcher.memo(key, lambda: fastpath.bind(
            dispatcher, _checked(dispatcher, a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a,
                                 scale_b), kernel, result_2d=a.dim() == 2 and b.dim() == 2))
        return bound(a, b, bias, residual, out, scale_a, scale_b)
    operands = _checked(dispatcher, a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b)
    result = dispatcher.run(operands, kernel=kernel)
    return result.reshape(out.shape) if out is not None else result.reshape(_result_shape(a, b, operands))


def bound_call(a, b, *, bias=None, activation=None, residual=None, allow_tf32: bool = False, dispatcher):
    """The callable `gemm()` replays for this signature, bound on first sight: for a caller that
    makes one call on every step of its own replay (conv's 1x1 family), which keeps it rather than
    key each call. It is called as bound(a, b, bias, residual, out, scale_a, scale_b) on tensors of
    this signature; where the call has no fast path (the interpreter's), it runs every check."""
    key = fastpath.call_key(a, b, bias, activation, residual, None, None, allow_tf32, None, None, None)
    if key is None:
        def checked(a, b, bias, residual, out, scale_a, scale_b):
            return gemm(a, b, bias=bias, activation=activation, residual=residual, out=out, allow_tf32=allow_tf32,
                        scale_a=scale_a, scale_b=scale_b, dispatcher=dispatcher)
        return checked
    return dispatcher.memo(key, lambda: fastpath.bind(
        dispatcher, _checked(dispatcher, a, b, bias, activation, residual, None, None, allow_tf32, None, None),
        None, result_2d=a.dim() == 2 and b.dim() == 2))


def _recorded(a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b, kernel, dispatcher):
    """gemm() as the custom op tiledispatch::gemm where torch.compile traces it, or as its eager twin
    where autograd records an eager call.

    While autograd records, an activation stays out of the op: the op gives its input z and
    the activation and residual follow as PyTorch ops in fp32, whose autograd takes their
    derivatives (one more pass over C each way; an inference call fuses them).
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        check_operands(a, b)  # raises the error naming the argument that is not a tensor
    token = dispatcher_token(dispatcher)
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (a, b, bias, residual, out, scale_a, scale_b))
    if grad:
        _check_differentiable(a, b, bias, residual, out, scale_a, scale_b)
    if activation is not None and not isinstance(activation, str):
        activation = Activation.of_argument(activation).value
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        out_dtype = _asked_dtype(out_dtype).torch
    if scale_a is not None and not isinstance(scale_a, torch.Tensor):
        scale_a = _scale(scale_a, a.device, "scale_a")  # a number as the op's one-element tensor, checked
    if scale_b is not None and not isinstance(scale_b, torch.Tensor):
        scale_b = _scale(scale_b, a.device, "scale_b")
    kernel = as_kernel_name(kernel, "kernel")
    op = torch.ops.tiledispatch.gemm.default
    separate = grad and activation is not None and activation != Activation.NONE.value  # the epilogue apart
    if grad and records_eagerly(a, b, bias, residual, scale_a, scale_b):
        op = _eager_op(a, b, bias, residual if not separate else None, out_dtype, scale_a, scale_b, kernel,
                       dispatcher)
    if separate:
        z = op(a, b, bias, None, None, out_dtype, allow_tf32, scale_a, scale_b, kernel, token)
        y = ACTIVATIONS[Activation.of_argument(activation)](z.float())
        if residual is not None:
            y = y + residual
        return y.to(z.dtype)
    c = op(a, b, bias, activation, residual, out_dtype, allow_tf32, scale_a, scale_b, kernel, token)
    if out is None:
        return c
    out.copy_(c.reshape(out.shape))
    return out


def _eager_op(a, b, bias, residual, out_dtype, scale_a, scale_b, kernel, dispatcher):
    """What an eager recorded call runs: PyTorch's own product where the vendor is picked for it
    and both its gradients (native.py), else the op's twin (library.py); called as the op is."""
    if kernel is None and residual is None and out_dtype is None and scale_a is None and scale_b is None:
        native = native_forward(a, b, bias, dispatcher)
        if native is not None:
            return lambda a, b, bias, *_: native(a, b, bias)
    from .library import GemmFunction

    return GemmFunction.apply


def _check_differentiable(a, b, bias, residual, out, scale_a, scale_b) -> None:
    """A recorded call: no out= (autograd cannot follow a write into it), no fp8 (forward only)."""
    given = {"a": a, "b": b, "bias": bias, "residual": residual, "out": out, "scale_a": scale_a, "scale_b": scale_b}
    name = next(n for n, t in given.items() if isinstance(t, torch.Tensor) and t.requires_grad)
    if out is not None:
        raise UnsupportedError(f"out= cannot take part in autograd, and {name} requires grad: call gemm without "
                               "out, or under torch.no_grad()")
    for role, t in (("a", a), ("b", b)):
        if isinstance(t, torch.Tensor) and t.dtype in FP8:
            raise UnsupportedError(
                f"{role} is {t.dtype} and {name} requires grad: fp8 gemm is forward only (inference); call it "
                f"under torch.no_grad() or on {name}.detach(), or train in bf16 or fp16")


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
    "ACTIVATION_CODES",
]
