"""Grouped convolution: forward, backward-data and backward-weight, 1-D/2-D/3-D, channels-last."""

from __future__ import annotations

import torch

from ...core.dispatcher import dispatcher_or_default
from ...core.errors import UnsupportedError
from ...core.op import OpDefinition, register
from .config import (
    AnyConvConfig,
    ConvSignature,
    DirectConfig,
    Family,
    ImplicitGemmConfig,
    PointwiseConfig,
    SplitMode,
    TmaConfig,
    ToeplitzConfig,
    VendorConfig,
)
from .function import ConvCall, check_dtype_on_arch, checked_forward, needs_grad, recorded, recorded_native, run
from . import fastpath
from .inputs import check_output, reference_output, tuning_operands
from ..gemm import Activation
from .operands import ConvOperands, check_operands
from .plan import kernel_units, plan
from .problem import (
    KIND,
    ConvEpilogue,
    ConvProblem,
    ConvSpecialization,
    ConvTypes,
    Direction,
    SourceLayout,
)
from .ranking import rule_score
from .rules import ConvRule, auto_correct, support_key, supports, validate
from .rulesets import RULE_SETS, problem_class

OP = register(OpDefinition(
    kind=KIND,
    problem_type=ConvProblem,
    config_type=AnyConvConfig,
    validate=validate,
    auto_correct=auto_correct,
    rule_sets=RULE_SETS,
    supports=supports,
    kernel_units=kernel_units,
    specialization_of=lambda problem: problem.specialization,
    # Built ahead of time: aligned and unaligned data. Pointwise (igemm) and depthwise
    # (direct) variants are compiled into the cache on first use. (igemm-tma takes aligned
    # data only: its unaligned build is never launched.)
    specializations=(ConvSpecialization(), ConvSpecialization(aligned=False)),
    plan=plan,
    rule_score=rule_score,
    family_of=lambda config: config.family.value,
    is_vendor=lambda config: config.family is Family.VENDOR,
    dtype_of=lambda config: config.signature.types.name,
    tuning_operands=tuning_operands,
    problem_class=problem_class,
    reference=reference_output,
    check=check_output,
    # The model ranks every candidate (some 30 a problem): the rules give nearly every conv to cuDNN
    # and place the kernels that win low, out of a shortlist of their best 16. On the H200 sweep's
    # unseen problems autotune reaches 0.989 of the oracle so (P10 0.981), 0.970 (0.815) with the
    # shortlist, for 6 % more first-sight time (docs/selection.md).
    model_shortlist=None,
    support_key=support_key,
))


def conv(x, w, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, activation=None, residual=None,
         out=None, allow_tf32: bool = False, kernel=None, dispatcher=None):
    """``activation(conv(x, w) + bias) + residual``, by the fastest registered kernel.

    x is (N, C, *spatial) and w (K, C/groups, *filter) with 1-3 spatial dims, in
    channels-last memory (a contiguous tensor is copied into it, and `explain` says
    so); bias is (K,), residual shaped as the output. Returns y (N, K, *out spatial),
    channels-last. stride, padding and dilation are an integer or one per spatial dim
    (at most 2**15, 2**20 and 2**15); padding may also be 'valid' or 'same' (stride 1),
    as in torch.nn.functional.conv2d, where 'same' pads both sides alike. `kernel`
    forces a kernel by name; `dispatcher` replaces the default.

    Differentiable where x, w, bias or residual requires grad (function.py): the backward
    runs the backward-data and backward-weight convs through the dispatcher.
    """
    if needs_grad(x, w, bias, residual):
        if out is not None:
            raise UnsupportedError("out= cannot take part in autograd, and an input requires grad: call conv "
                                   "without out, or under torch.no_grad()")
        if activation is None and residual is None and kernel is None:
            native = recorded_native(x, w, bias, stride, padding, dilation, groups, allow_tf32, dispatcher)
            if native is not None:
                return native(x, w, bias)
        call = ConvCall(stride, padding, dilation, groups, Activation.of_argument(activation), allow_tf32, kernel,
                        dispatcher)
        return recorded(x, w, bias, residual, call)
    arguments = lambda: dict(x=x, w=w, stride=stride, padding=padding, dilation=dilation, groups=groups,  # noqa: E731
                             bias=bias, activation=activation, residual=residual, out=out, allow_tf32=allow_tf32)
    key = None if torch.compiler.is_dynamo_compiling() else fastpath.forward_key(
        x, w, bias, residual, out, stride, padding, dilation, groups, activation, allow_tf32, kernel)
    if key is not None:  # a GPU call: bound once per signature, then replayed
        bound = _bound(dispatcher_or_default(dispatcher, x), key, kernel, arguments)
        if bound is not fastpath.UNBOUND:
            return bound((x, w, None, bias, residual, out))
    return run(Direction.FORWARD, dispatcher, kernel, **arguments())


def bound_forward(x, w, bias, stride, padding, dilation, groups, allow_tf32: bool):
    """The call `conv()` replays for this plain forward signature (no activation, residual, out or
    forced kernel, nothing recorded), called as bound((x, w, None, bias, None, None)) on tensors
    of the signature; None where only the checked path takes the call. For a caller that keeps it
    (tiledispatch.nn's modules) rather than key each call."""
    key = fastpath.forward_key(x, w, bias, None, None, stride, padding, dilation, groups, None, allow_tf32, None)
    if key is None:
        return None
    arguments = lambda: dict(x=x, w=w, stride=stride, padding=padding, dilation=dilation,  # noqa: E731
                             groups=groups, bias=bias, allow_tf32=allow_tf32)
    bound = _bound(dispatcher_or_default(None, x), key, None, arguments)
    return None if bound is fastpath.UNBOUND else bound


def _bound(chosen, key: tuple, kernel, arguments):
    """The signature's bound call, made once in the dispatcher's memo (`arguments()` gives the checks' keywords)."""
    return chosen.memo(key, lambda: fastpath.bind(chosen, checked_forward(chosen, kernel, arguments()), kernel))


def conv_backward_data(dy, w, input_size, *, stride=1, padding=0, dilation=1, groups: int = 1, out=None,
                       allow_tf32: bool = False, kernel=None, dispatcher=None):
    """dx, the gradient of the forward conv's input: dy (N, K, *out spatial), w (K, C/groups, *filter).

    `input_size` is x's shape (N, C, *spatial), or its spatial sizes: with stride > 1
    several input sizes give one output size. Returns dx channels-last.
    """
    return run(Direction.BWD_DATA, dispatcher, kernel, dy=dy, w=w, input_size=input_size, stride=stride,
               padding=padding, dilation=dilation, groups=groups, out=out, allow_tf32=allow_tf32)


def conv_backward_weight(x, dy, weight_size, *, stride=1, padding=0, dilation=1, groups: int = 1, out=None,
                         allow_tf32: bool = False, kernel=None, dispatcher=None):
    """dw, the gradient of the forward conv's weight: x (N, C, *spatial), dy (N, K, *out spatial).

    `weight_size` is w's shape (K, C/groups, *filter), or the filter sizes. Returns dw
    with its C/G dim contiguous (GKZYXC).
    """
    return run(Direction.BWD_WEIGHT, dispatcher, kernel, x=x, dy=dy, weight_size=weight_size, stride=stride,
               padding=padding, dilation=dilation, groups=groups, out=out, allow_tf32=allow_tf32)


__all__ = [
    "OP",
    "ConvEpilogue",
    "ConvOperands",
    "ConvProblem",
    "ConvRule",
    "ConvSignature",
    "ConvSpecialization",
    "ConvTypes",
    "DirectConfig",
    "Direction",
    "Family",
    "ImplicitGemmConfig",
    "PointwiseConfig",
    "SourceLayout",
    "SplitMode",
    "TmaConfig",
    "ToeplitzConfig",
    "VendorConfig",
    "auto_correct",
    "bound_forward",
    "check_dtype_on_arch",
    "check_operands",
    "conv",
    "conv_backward_data",
    "conv_backward_weight",
    "supports",
    "validate",
]
