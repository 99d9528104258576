"""The fast path of `conv()` and its two gradients on a GPU: a call signature seen before skips all checks.

The first call with a given signature (the direction; each tensor's shape, strides, dtype, device
and 16-byte alignment; the geometry, epilogue and dtype options) runs every check, selects the
kernel, loads its launchers and plans once. Every later call with the same signature swaps its
tensors into the plan's argument slots, makes the plan's scratch anew and launches: everything the
checks looked at is part of the signature, except aliasing, which is re-checked whenever the
pointers differ from the last call's. A call with a negated or conjugated view has no signature:
the checks copy such an input (its memory does not hold its values) and refuse such an out. The
checked path took 142-326 us of host time a call on the H100's host, the replay 17-74
(benchmarks/conv_host.py; results/h100/conv_host.txt): a depthwise layer's GPU time is 7-30 us.

A plan the swap cannot replay binds nothing, and its signature takes the checked path each time:
one that reads a copy of an operand (a tensor the caller gave in PyTorch's contiguous layout, a
filter copied on the host), which the swap would not refresh.
"""

from __future__ import annotations

import torch

from ...core.dispatcher import stream_getter
from ...core.launch import Plan
from ...core.replay import PLAIN_TENSORS, Binding, BoundPlan, Unbindable, tensor_meta
from ...core.tensors import check_no_alias
from ...core.dtypes import DType
from ...core.hostcost import ByCapture, for_eager
from ..gemm import Activation
from .operands import ConvOperands, channels_last_empty
from .problem import Direction
from .signature import Family
from .vendor import direct_call

# The order of `BoundConv.__call__`'s tensors: ConvOperands' fields after the problem, so that the vendor
# stage's operands are ConvOperands(problem, *tensors).
ROLES = ("x", "w", "dy", "bias", "residual", "out")


def call_key(direction, tensors: tuple, options: tuple) -> tuple | None:
    """The signature of a call (tensors in ROLES order; options as (name, value) pairs, hashable: the
    geometry, epilogue, dtype options and forced kernel), or None where only the checked path can
    handle it."""
    if not replayable(tensors):
        return None
    first = next((t for t in tensors if t is not None), None)
    if first is None or not first.is_cuda:
        return None  # the interpreter reads whole tensors, not just their pointers
    metas = tuple(None if t is None else tensor_meta(t) for t in tensors)
    key = ("conv", direction, metas, typed(options))  # "conv": memos are per dispatcher
    try:
        hash(key)
    except TypeError:  # an unhashable option: the checked path takes it
        return None
    return key


def forward_key(x, w, bias, residual, out, stride, padding, dilation, groups, activation, allow_tf32,
                kernel) -> tuple | None:
    """The signature of a forward call, or None where only the checked path can take it: what
    `call_key` says of a forward call, written flat, since every call of a model's layer pays for it."""
    if type(x) not in PLAIN_TENSORS or type(w) not in PLAIN_TENSORS or not x.is_cuda:
        return None  # the interpreter reads whole tensors, not just their pointers
    if x.is_neg() or x.is_conj() or w.is_neg() or w.is_conj() or (kernel is not None and type(kernel) is not str):
        return None
    optional = None
    if bias is not None or residual is not None or out is not None:
        if not replayable((bias, residual, out)):
            return None
        optional = (None if bias is None else tensor_meta(bias), None if residual is None else tensor_meta(residual),
                    None if out is None else tensor_meta(out))
    options = (stride, padding, dilation, groups, activation, allow_tf32, kernel)
    # the type of each option and of a tuple's items: the checks refuse a float or a bool where an
    # integer is meant, so options equal as numbers (2 and 2.0) are different calls
    key = ("conv-forward", tensor_meta(x), tensor_meta(w), optional, options, tuple(map(type, options)),
           tuple(tuple(map(type, v)) for v in (stride, padding, dilation) if type(v) is tuple))
    try:
        hash(key)
    except TypeError:  # an unhashable option: the checked path takes it
        return None
    return key


def replayable(tensors: tuple) -> bool:
    """Whether a bound plan may stand in for the checks on these tensors: plain tensors whose memory
    holds their values (the checks copy a negated or conjugated input, and refuse such an out), and
    an out that autograd does not track (the checks refuse one that requires grad, in grad mode)."""
    if any(t is not None and (type(t) not in PLAIN_TENSORS or t.is_neg() or t.is_conj()) for t in tensors):
        return False
    out = tensors[-1]
    return out is None or not out.requires_grad


def typed(options: tuple) -> tuple:
    """The (name, value) options with the type of each value and of a tuple's items: options equal as
    numbers (2 and 2.0, 1 and True) are different calls, since the checks refuse a float or a bool
    where an integer is meant."""
    return tuple((name, type(value), tuple(map(type, value)) if type(value) is tuple else None, value)
                 for name, value in options)


class BoundConv:
    """A checked, selected and planned call, replayable on new tensors of the same signature."""

    def __init__(self, operands: ConvOperands, plan: Plan, launchers: dict) -> None:
        if operands.converted:
            raise Unbindable(f"{', '.join(operands.converted)} copied into channels-last")
        roles = [getattr(operands, role) for role in ROLES]
        self._allocates = operands.out is None
        if self._allocates:
            roles[-1] = plan.output
        # The vendor stage hands over its own result's storage (vendor.run): an allocation of y's size
        # would only be dropped, so it gets an empty tensor to take that storage.
        self._hands_over = self._allocates and any(launch.stage == "vendor" for launch in plan.launches)
        self._run = BoundPlan(plan, launchers, Binding(roles, operands_type=ConvOperands), operands.device).seal().run
        out = plan.output
        self._out = (tuple(out.shape), out.stride(), out.dtype)
        self._problem = operands.problem
        self._device = operands.device
        self._stream = stream_getter(operands.device)
        self._unaliased: tuple | None = None  # the pointers of the last call whose out passed the alias check

    def __call__(self, tensors: tuple) -> torch.Tensor:
        out = tensors[-1]
        if self._hands_over:
            out = torch.empty(0, dtype=self._out[2], device=self._device)
        elif self._allocates:
            shape, stride, dtype = self._out
            out = torch.empty_strided(shape, stride, dtype=dtype, device=self._device)
        else:  # same pointers as a call that passed, and the same shapes (the signature): same answer
            pointers = tuple(None if t is None else t.data_ptr() for t in tensors)
            if pointers != self._unaliased:
                check_no_alias(out, dict(zip(ROLES[:4], tensors[:4])), in_place_ok={"residual": tensors[4]})
                self._unaliased = pointers
        # with the caller's out: None tells the vendor to hand over its own (ROLES are ConvOperands' fields' order)
        self._run((*tensors[:-1], out), self._stream(), operands=lambda: ConvOperands(self._problem, *tensors))
        return out


class DirectConv:
    """The vendor candidate on a plain 2-D forward call (no activation, residual or out; 16-bit,
    so no tf32 switch): PyTorch's conv2d on the caller's own tensors, nothing planned, so the call
    costs what F.conv2d costs plus the signature. Channels-last x and w give a channels-last y."""

    def __init__(self, operands: ConvOperands) -> None:
        p = operands.problem
        self.call = direct_call(2, p.stride, p.padding, p.dilation, p.groups, operands.bias is not None)

    def __call__(self, tensors: tuple) -> torch.Tensor:
        x, w, _, bias, _, _ = tensors
        return self.call(x, w, bias)

    @staticmethod
    def takes(spec, operands: ConvOperands) -> bool:
        p = operands.problem
        return (spec.family == Family.VENDOR.value and p.direction is Direction.FORWARD and p.spatial_dims == 2
                and operands.out is None and operands.residual is None and p.epilogue.activation is Activation.NONE
                and p.types.dtype in (DType.FP16, DType.BF16) and not p.wide_offsets)


class PointwiseConv:
    """A forward call bound to family `gemm` (pointwise.py: a 1x1 conv as one GEMM) with dense
    channels-last x (and residual) and no out: the GEMM op's own bound call on matrix views of x
    and w, its P x K result viewed as channels-last y. One replay, where the conv's plan around a
    GEMM call would key and check the GEMM call again on every step."""

    def __init__(self, views: dict, y: tuple, gemm) -> None:
        self._a, self._b, self._residual = views["x"], views["w"], views["residual"]
        self._y = y  # y's (shape, strides): channels-last, the P x K product's rows
        self._gemm = gemm

    def __call__(self, tensors: tuple) -> torch.Tensor:
        x, w, _, bias, residual, _ = tensors
        if residual is not None:
            residual = residual.as_strided(*self._residual)
        c = self._gemm(x.as_strided(*self._a), w.as_strided(*self._b), bias, residual, None, None, None)
        return c.as_strided(*self._y)

    @staticmethod
    def make(spec, operands: ConvOperands, dispatcher) -> "PointwiseConv | None":
        """The binding of a call this kind takes (the GEMM's own bound once here), else None."""
        p = operands.problem
        if (spec.family != Family.GEMM.value or p.direction is not Direction.FORWARD or operands.out is not None
                or operands.converted or not _dense_channels_last(operands.x)
                or not (operands.residual is None or _dense_channels_last(operands.residual))):
            return None
        from ..gemm import bound_call
        from .pointwise import gemm_dispatcher
        pixels = operands.x.numel() // p.c
        views = {"x": ((pixels, p.c), (p.c, 1)), "w": ((p.c, p.k), (operands.w.stride(1), operands.w.stride(0))),
                 "residual": ((pixels, p.k), (p.k, 1))}
        residual = None if operands.residual is None else operands.residual.as_strided(*views["residual"])
        gemm = bound_call(operands.x.as_strided(*views["x"]), operands.w.as_strided(*views["w"]),
                          bias=operands.bias, activation=p.epilogue.activation, residual=residual,
                          allow_tf32=p.types.allow_tf32, dispatcher=gemm_dispatcher(dispatcher.arch))
        y_shape = (p.n, p.k, *p.output_size)
        return PointwiseConv(views, (y_shape, channels_last_empty(y_shape, operands.x.dtype, "meta").stride()), gemm)


def _dense_channels_last(t: torch.Tensor) -> bool:
    return t.movedim(1, -1).is_contiguous()


UNBOUND = object()  # a signature whose plan the swap cannot replay: the checked path takes it


def bind(dispatcher, operands: ConvOperands, kernel) -> BoundConv | DirectConv | PointwiseConv | ByCapture | object:
    """Selects (or resolves), loads and plans once: a `BoundConv` to replay, a `DirectConv` for a plain
    call bound to the vendor, a `PointwiseConv` for a 1x1 forward bound to the GEMM, or UNBOUND
    where the plan reads a copy the swap would not refresh. A pick not expected to save an eager
    call's host time over the vendor (core.hostcost) runs the vendor in eager calls and itself in
    graph captures: both bound, in a `ByCapture`."""
    spec, launchers = dispatcher.prepare(operands, kernel=kernel)
    bound = _bind_spec(dispatcher, operands, spec, launchers)
    if kernel is not None or bound is UNBOUND:
        return bound
    cheaper = for_eager(dispatcher, operands.problem, spec)
    if cheaper is spec:
        return bound
    eager = _bind_spec(dispatcher, operands, *dispatcher.prepare(operands, kernel=cheaper))
    return bound if eager is UNBOUND else ByCapture(eager, bound)


def _bind_spec(dispatcher, operands: ConvOperands, spec, launchers: dict):
    if DirectConv.takes(spec, operands) and not operands.converted:
        return DirectConv(operands)
    pointwise = PointwiseConv.make(spec, operands, dispatcher)
    if pointwise is not None:
        return pointwise
    try:
        return BoundConv(operands, spec.definition.plan(spec.config, operands), launchers)
    except Unbindable:
        return UNBOUND
