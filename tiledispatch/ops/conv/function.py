"""A conv call: the fast path or every check, and `conv()` where autograd records it or
torch.compile traces it.

An eager call that autograd does not record runs `eager_run`: the fast path, or every check.
Where torch.compile traces a call it goes through the custom ops (library.py); where an input of
an eager `conv()` requires grad, through the forward op's eager twin, whose autograd is the op's:
it takes dx from the backward-data conv and dw from the backward-weight conv, each selected for
its own problem as a direct call would be (one cuDNN call for both where each pick is cuDNN); bias's
gradient is dy summed over all but the channels, residual's is dy. An activation's gradient
needs its input, so while recording, the op runs the conv with the bias fused and gives its
result z, and the activation and residual follow as PyTorch ops in fp32 (their autograd takes
their derivatives): one more pass over the output each way, where an inference call fuses
them into the conv's epilogue.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ...core.args import as_kernel_name
from ...core.dispatcher import dispatcher_or_default
from ...core.dtypes import DType
from ...core.errors import InvalidArgumentError, UnsupportedError
from ...core.op import OpKind
from ..gemm import Activation
from ..library_common import dispatcher_token, records_eagerly
from . import fastpath
from .joint import native_decision, native_forward, unless_captured
from .operands import ConvOperands, _padding, check_operands
from .problem import MAX_DILATION, MAX_STRIDE, ConvTypes, Direction, spatial_tuple
from .vendor import ACTIVATIONS


def run(direction: Direction, dispatcher, kernel, **arguments):
    """A call: through the custom op where torch.compile traces it or autograd records a backward
    direction (the forward's recording is `conv()`'s, by `recorded`), else the fast path."""
    if torch.compiler.is_dynamo_compiling() or direction is not Direction.FORWARD and needs_grad(
            arguments.get("x"), arguments.get("w"), arguments.get("dy")):
        return traced(direction, dispatcher, kernel, arguments)
    return _eager(direction, dispatcher, kernel, arguments)


def eager_run(direction: Direction, dispatcher, kernel, **arguments):
    """The fast path, or every check: what an eager call that records nothing runs (the custom ops' kernels).

    The custom ops' schemas hand their int[] arguments over as lists, which no signature can hold
    (a list is unhashable, so every such call took the checked path): they go on as the tuples
    the checks read alike."""
    for name, value in arguments.items():
        if type(value) is list:
            arguments[name] = tuple(value)
    return _eager(direction, dispatcher, kernel, arguments)


def _eager(direction: Direction, dispatcher, kernel, arguments: dict):
    """A call seen before replays its bound plan (fastpath.py); any other runs every check."""
    dispatcher = dispatcher_or_default(dispatcher, arguments.get("x", arguments.get("dy")))
    tensors = tuple(arguments.get(role) for role in fastpath.ROLES)
    key = None
    if kernel is None or type(kernel) is str:
        options = (*(item for item in arguments.items() if item[0] not in fastpath.ROLES), ("kernel", kernel))
        key = fastpath.call_key(direction, tensors, options)
    if key is not None:
        bound = dispatcher.memo(key, lambda: fastpath.bind(
            dispatcher, _checked(direction, dispatcher, kernel, arguments), kernel))
        if bound is not fastpath.UNBOUND:
            return bound(tensors)
    return dispatcher.run(_checked(direction, dispatcher, kernel, arguments), kernel=kernel)


def _checked(direction: Direction, dispatcher, kernel, arguments: dict) -> ConvOperands:
    check_kernel(kernel, direction, dispatcher)
    operands = check_operands(direction, **arguments)
    check_dtype_on_arch(operands.problem.types, dispatcher.arch)
    return operands


def checked_forward(dispatcher, kernel, arguments: dict) -> ConvOperands:
    """Every check of a forward call: what `conv()`'s own fast path binds on first sight."""
    return _checked(Direction.FORWARD, dispatcher, kernel, arguments)


def check_kernel(kernel, direction: Direction, dispatcher) -> None:
    """A forced kernel must be a registered conv kernel of this call's direction: another op's kernel
    or another direction's says so, naming the argument, before any support check reads the problem."""
    name = as_kernel_name(kernel, "kernel")
    if name is None:
        return
    spec = dispatcher.registry.get(name)
    if spec.op is not OpKind.CONV:
        raise InvalidArgumentError(
            f"kernel={name!r} is a {spec.op.value} kernel; conv takes a conv kernel of its direction "
            f"(`tiledispatch registry list --op conv`), or kernel=None to select one")
    built = spec.config.signature.direction
    if built is not direction:
        raise UnsupportedError(
            f"kernel={name!r} computes the {built.value} conv, and this call is {direction.value} (built for "
            f"{built.value}, the problem is {direction.value}): pass a conv_{direction.short}_* kernel, or "
            "kernel=None to select one")


def check_dtype_on_arch(types: ConvTypes, arch) -> None:
    """The DTYPE_ARCH rule, said about the call: no kernel of this arch can take this dtype."""
    dtype = types.dtype
    if dtype is not DType.FP32 and not arch.supports_dtype(dtype):
        where = ("Triton's CPU interpreter (TRITON_INTERPRET=1), which has no " + dtype.value + " tl.dot"
                 if arch.is_interpreter else arch.name)
        raise UnsupportedError(f"the tensors are {dtype.value}, but {dtype.value} convolution cannot run on "
                               f"{where}; use fp16 or fp32" + (", or run on a GPU" if arch.is_interpreter else ""))


def needs_grad(*tensors) -> bool:
    """Whether autograd records this call: grad mode on and a tensor that requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


@dataclass(frozen=True)
class ConvCall:
    """The arguments of a differentiable forward call other than its tensors; the backward convs
    take its options and dispatcher (`kernel` names the forward's kernel only)."""

    stride: Any
    padding: Any
    dilation: Any
    groups: int
    activation: Activation
    allow_tf32: bool
    kernel: Any
    dispatcher: Any

    def options(self) -> dict:
        """The keywords every direction's call takes."""
        return {"stride": self.stride, "padding": self.padding, "dilation": self.dilation, "groups": self.groups,
                "allow_tf32": self.allow_tf32}


def geometry(x, filter_size, stride, padding, dilation, groups, allow_tf32) -> tuple:
    """(stride, padding, dilation, groups, allow_tf32) as the custom ops take them: an integer tuple a
    spatial dim each, 'same' and 'valid' read against the filter; the checks are the ops'. Options of
    plain types (every model's) are read once per combination: the reading costs more than a
    replayed call's whole budget."""
    options = (stride, padding, dilation, groups, allow_tf32)
    if not torch.compiler.is_dynamo_compiling() and all(
            type(v) in _PLAIN or type(v) is tuple and all(type(i) is int for i in v) for v in options):
        return _read_geometry(x.dim() - 2, tuple(filter_size), *options)
    return _read_geometry.__wrapped__(x.dim() - 2, tuple(filter_size), *options)  # Dynamo warns of a cache


_PLAIN = (int, str, bool)  # options of these types (tuples of int) key one reading; typed: True is not 1


@functools.lru_cache(maxsize=1024, typed=True)
def _read_geometry(dims, filter_size, stride, padding, dilation, groups, allow_tf32) -> tuple:
    stride = spatial_tuple(stride, dims, "stride", 1, MAX_STRIDE)
    dilation = spatial_tuple(dilation, dims, "dilation", 1, MAX_DILATION)
    padding = _padding(padding, filter_size[-dims:], stride, dilation, Direction.FORWARD)
    return tuple(stride), tuple(padding), tuple(dilation), groups, allow_tf32


def recorded_native(x, w, bias, stride, padding, dilation, groups, allow_tf32, dispatcher):
    """`joint.native_forward` for a plain recorded call on the GPU (no activation, residual, out or
    forced kernel), keyed on the call's own arguments as the fast path keys them: a training step's
    every conv asks, and this skips reading its geometry and making its `ConvCall`. None where the
    op's twin runs the call, or where the call has no signature (the full path decides)."""
    if torch.compiler.is_dynamo_compiling():
        return None
    return unless_captured(recorded_decision(x, w, bias, stride, padding, dilation, groups, allow_tf32, dispatcher))


def recorded_decision(x, w, bias, stride, padding, dilation, groups, allow_tf32, dispatcher):
    """The `joint.NativeVendor` of a plain recorded call whatever captures (its `weighed` says
    whether a capture may run it), or None: `recorded_native` before the capture's say."""
    key = fastpath.forward_key(x, w, bias, None, None, stride, padding, dilation, groups, None, allow_tf32, None)
    if key is None:
        return None
    chosen = dispatcher_or_default(dispatcher, x)
    return chosen.memo(("recorded", key), lambda: native_decision(
        x, w, bias, geometry(x, w.shape[2:], stride, padding, dilation, groups, allow_tf32), chosen))


def traced(direction: Direction, dispatcher, kernel, arguments: dict):
    """A call of any direction as its custom op (torch.compile's trace, or a recorded backward direction)."""
    ops = torch.ops.tiledispatch
    args = dict(arguments)
    out = args.pop("out", None)
    if out is not None and needs_grad(args.get("x"), args.get("w"), args.get("dy")):
        raise UnsupportedError("out= cannot take part in autograd, and an input requires grad: call without out, "
                               "or under torch.no_grad()")
    token, kernel = dispatcher_token(dispatcher), as_kernel_name(kernel, "kernel")
    options = [args.pop(name, default) for name, default in
               (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1), ("allow_tf32", False))]
    x, w, dy = args.pop("x", None), args.pop("w", None), args.pop("dy", None)
    if direction is Direction.FORWARD:
        activation = args.pop("activation", None)
        if activation is not None and not isinstance(activation, str):
            activation = Activation.of_argument(activation).value
        geo = geometry(x, w.shape[2:], *options)
        y = ops.conv.default(x, w, args.pop("bias", None), args.pop("residual", None), *geo[:4], activation,
                             geo[4], kernel, token)
    elif direction is Direction.BWD_DATA:
        size = list(args.pop("input_size"))
        size = size if len(size) == dy.dim() else [dy.shape[0], w.shape[1] * options[3], *size]
        y = ops.conv_backward_data.default(dy, w, size, *geometry(dy, w.shape[2:], *options), kernel, token)
    else:
        size = list(args.pop("weight_size"))
        size = size if len(size) == x.dim() else [dy.shape[1], x.shape[1] // options[3], *size]
        y = ops.conv_backward_weight.default(x, dy, size, *geometry(x, size[2:], *options), kernel, token)
    if args:
        raise InvalidArgumentError(f"{direction.value} takes no {', '.join(sorted(args))}")
    if out is None:
        return y
    out.copy_(y)
    return out


def recorded(x, w, bias, residual, call: ConvCall):
    """conv() where autograd records it: the custom op tiledispatch::conv, or on an eager call its
    twin (library.py), whose backward runs the two backward convs, or PyTorch's own conv where the
    vendor is picked for all three (joint.native_forward); an activation and its residual follow
    the op as PyTorch ops."""
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        check_operands(Direction.FORWARD, x=x, w=w)  # raises the error naming the argument that is not a tensor
    geo = geometry(x, w.shape[2:], call.stride, call.padding, call.dilation, call.groups, call.allow_tf32)
    activation = ACTIVATIONS[call.activation]
    if records_eagerly(x, w, bias, residual):
        native = None
        if call.kernel is None and (residual is None or activation is not None):
            native = native_forward(x, w, bias, geo, call.dispatcher)
        if native is not None:
            z = native(x, w, bias)
            return z if activation is None else _after(activation, z, residual)
        from .library import ConvFunction
        conv_op = ConvFunction.apply
    else:
        conv_op = torch.ops.tiledispatch.conv.default
    token, kernel = dispatcher_token(call.dispatcher), as_kernel_name(call.kernel, "kernel")
    if activation is None:
        return conv_op(x, w, bias, residual, *geo[:4], None, geo[4], kernel, token)
    return _after(activation, conv_op(x, w, bias, None, *geo[:4], None, geo[4], kernel, token), residual)


def _after(activation, z, residual):
    """The epilogue as PyTorch ops, in fp32, whose autograd takes its derivative."""
    y = activation(z.float())
    if residual is not None:
        y = y + residual
    return y.to(z.dtype)

