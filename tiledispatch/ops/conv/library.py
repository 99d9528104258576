"""tiledispatch::conv, conv_backward_data and conv_backward_weight: the custom ops torch.compile
traces, and the forward's eager twin ConvFunction, which autograd records on an eager call (see
tiledispatch/library.py).

Each op's kernel is the direction's fast path (function.py), its fake a channels-last tensor
of the result's shape, and its autograd the other two directions, each selected for its own
problem: y = conv(x, w) gives dx = conv_backward_data(dy, w) and dw = conv_backward_weight(x,
dy); the two backward convs, bilinear in their inputs, differentiate the same way (a double
backward), e.g. d(dx)/d(dy) is the forward conv of dx's gradient with w. The forward op's
autograd differentiates the conv with bias and residual; `conv()` keeps an activation out of
the op while recording (function.py).

Geometry travels as integer lists (stride, padding, dilation, one per spatial dim) and sizes
as full shapes: function.py reads the user's forms ('same', spatial sizes only) before the op.
"""

import functools
from typing import Optional

import torch

from ...core.errors import UnsupportedError
from .. import inductor
from ..library_common import DEFAULT_DISPATCHER, custom_op, dispatcher_of, eager_twin, runs_eagerly
from . import conv as _conv
from .function import eager_run
from .joint import both_gradients
from .operands import channels_last_empty, check_operands, to_channels_last
from .problem import Direction


@functools.lru_cache(maxsize=1024)
def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of channels_last_empty(shape): dim 1 innermost, then the last spatial dim, ..., dim 0."""
    strides, step = [0] * len(shape), 1
    for dim in (1, *range(len(shape) - 1, 1, -1), 0):
        strides[dim] = step
        step *= shape[dim]
    return tuple(strides)


def _promised(t: torch.Tensor) -> torch.Tensor:
    """The result in the layout the fake promises (channels-last), copied only where it is not."""
    return t if t.stride() == channels_last_strides(tuple(t.shape)) else to_channels_last(t)


def output_size(size, filt, stride, padding, dilation) -> list:
    return [(i + 2 * p - d * (f - 1) - 1) // s + 1 for i, f, s, p, d in zip(size, filt, stride, padding, dilation)]


def conv_kernel(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
                stride: list[int], padding: list[int], dilation: list[int], groups: int, activation: Optional[str],
                allow_tf32: bool, kernel: Optional[str], dispatcher: int) -> torch.Tensor:
    """activation(conv(x, w) + bias) + residual by `conv()`'s own fast path (its flat signature), which
    the op's autograd (or its twin's) records rather than conv()."""
    with torch.no_grad():
        y = _conv(x, w, stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=groups,
                  bias=bias, residual=residual, activation=activation, allow_tf32=allow_tf32, kernel=kernel,
                  dispatcher=dispatcher_of(dispatcher))
    return _promised(y)


conv_op = custom_op("conv", conv_kernel)


@conv_op.register_fake
def _conv_fake(x, w, bias, residual, stride, padding, dilation, groups, activation, allow_tf32, kernel, dispatcher):
    inductor.register()
    shape = (x.shape[0], w.shape[0], *output_size(x.shape[2:], w.shape[2:], stride, padding, dilation))
    return channels_last_empty(shape, x.dtype, x.device)


def _traced_vendor(direction: Direction, tensors: dict, sizes: dict, geometry: tuple, allow_tf32: bool, kernel,
                   dispatcher: int) -> bool:
    """Whether the default dispatcher picks the vendor for this traced call of `direction` (inductor.py):
    a plain one, channels-last operands of 16 bits and plain integer sizes; a forced kernel, another
    dispatcher, fp32 (TF32 is the vendor family's choice) or symbolic sizes keep the op."""
    first = next(iter(tensors.values()))
    if kernel is not None or dispatcher != DEFAULT_DISPATCHER or first.dtype not in inductor.VENDOR_DTYPES:
        return False
    metas = inductor.static_metas(*tensors.values())
    stride, padding, dilation, groups = geometry
    numbers = (*stride, *padding, *dilation, groups, *(d for size in sizes.values() for d in size))
    if metas is None or not all(type(v) is int for v in numbers):
        return False
    given = dict(stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=groups,
                 allow_tf32=allow_tf32, **{name: tuple(size) for name, size in sizes.items()})

    def problem(made):
        operands = check_operands(direction, **dict(zip(tensors, made)), **given)
        return None if operands.converted or operands.problem.wide_offsets else operands.problem
    return inductor.picks_vendor((direction.value, metas, tuple(given.items())), first, problem,
                                 weigh_host=direction is Direction.FORWARD)


@inductor.decomposes(conv_op)
def _conv_as_aten(x, w, bias, residual, stride, padding, dilation, groups, activation, allow_tf32, kernel,
                  dispatcher):
    """aten.convolution where the default dispatcher picks the vendor for this traced forward (with no
    residual or activation in the op)."""
    if residual is not None or activation is not None or not _traced_vendor(
            Direction.FORWARD, {"x": x, "w": w, "bias": bias}, {}, (stride, padding, dilation, groups), allow_tf32,
            kernel, dispatcher):
        return NotImplemented
    return torch.ops.aten.convolution(x, w, bias, list(stride), list(padding), list(dilation), False,
                                      [0] * len(stride), groups)


def _gradient_as_aten(direction: Direction, dy, read, size, stride, padding, dilation, groups, allow_tf32, kernel,
                      dispatcher):
    """aten.convolution_backward's dx (`read` is w, `size` x's) or dw (`read` is x, `size` w's) where
    the default dispatcher picks the vendor for this traced gradient, as the vendor family calls it
    (vendor.py): the operand the direction does not read stands in uninitialised and channels-last."""
    data = direction is Direction.BWD_DATA
    tensors = {"dy": dy, "w": read} if data else {"x": read, "dy": dy}
    if not _traced_vendor(direction, tensors, {"input_size" if data else "weight_size": size},
                          (stride, padding, dilation, groups), allow_tf32, kernel, dispatcher):
        return NotImplemented
    stand_in = channels_last_empty(tuple(size), dy.dtype, dy.device)
    x, w = (stand_in, read) if data else (read, stand_in)
    grads = torch.ops.aten.convolution_backward(dy, x, w, None, list(stride), list(padding), list(dilation), False,
                                                [0] * len(stride), groups, [data, not data, False])
    return grads[0] if data else grads[1]


def backward_data_kernel(dy: torch.Tensor, w: torch.Tensor, input_size: list[int], stride: list[int],
                          padding: list[int], dilation: list[int], groups: int, allow_tf32: bool,
                          kernel: Optional[str], dispatcher: int) -> torch.Tensor:
    """dx of the forward conv, input_size the full shape of x."""
    return _promised(eager_run(Direction.BWD_DATA, dispatcher_of(dispatcher), kernel, dy=dy, w=w,
                               input_size=input_size, stride=stride, padding=padding, dilation=dilation,
                               groups=groups, allow_tf32=allow_tf32))


conv_backward_data_op = custom_op("conv_backward_data", backward_data_kernel)


@conv_backward_data_op.register_fake
def _data_fake(dy, w, input_size, stride, padding, dilation, groups, allow_tf32, kernel, dispatcher):
    inductor.register()
    return channels_last_empty(tuple(input_size), dy.dtype, dy.device)


@inductor.decomposes(conv_backward_data_op)
def _data_as_aten(dy, w, input_size, stride, padding, dilation, groups, allow_tf32, kernel, dispatcher):
    return _gradient_as_aten(Direction.BWD_DATA, dy, w, input_size, stride, padding, dilation, groups, allow_tf32,
                             kernel, dispatcher)


def backward_weight_kernel(x: torch.Tensor, dy: torch.Tensor, weight_size: list[int], stride: list[int],
                            padding: list[int], dilation: list[int], groups: int, allow_tf32: bool,
                            kernel: Optional[str], dispatcher: int) -> torch.Tensor:
    """dw of the forward conv, weight_size the full shape of w; C/G contiguous."""
    return _promised(eager_run(Direction.BWD_WEIGHT, dispatcher_of(dispatcher), kernel, x=x, dy=dy,
                               weight_size=weight_size, stride=stride, padding=padding, dilation=dilation,
                               groups=groups, allow_tf32=allow_tf32))


conv_backward_weight_op = custom_op("conv_backward_weight", backward_weight_kernel)


@conv_backward_weight_op.register_fake
def _weight_fake(x, dy, weight_size, stride, padding, dilation, groups, allow_tf32, kernel, dispatcher):
    inductor.register()
    return channels_last_empty(tuple(weight_size), x.dtype, x.device)


@inductor.decomposes(conv_backward_weight_op)
def _weight_as_aten(x, dy, weight_size, stride, padding, dilation, groups, allow_tf32, kernel, dispatcher):
    return _gradient_as_aten(Direction.BWD_WEIGHT, dy, x, weight_size, stride, padding, dilation, groups,
                             allow_tf32, kernel, dispatcher)


def forward(x, w, geometry: tuple, token: int) -> torch.Tensor:
    """conv(x, w) with `geometry` (stride, padding, dilation, groups, allow_tf32): the fast path where
    the call is eager (a backward's), else the custom op."""
    stride, padding, dilation, groups, allow_tf32 = geometry
    if runs_eagerly(x, w):
        return eager_run(Direction.FORWARD, dispatcher_of(token), None, x=x, w=w, stride=stride, padding=padding,
                         dilation=dilation, groups=groups, allow_tf32=allow_tf32)
    return conv_op(x, w, None, None, *geometry[:4], None, allow_tf32, None, token)


def backward_data(dy, w, input_size, geometry: tuple, token: int) -> torch.Tensor:
    """dx: the fast path where the call is eager, else the custom op."""
    stride, padding, dilation, groups, allow_tf32 = geometry
    if runs_eagerly(dy, w):
        return eager_run(Direction.BWD_DATA, dispatcher_of(token), None, dy=dy, w=w, input_size=tuple(input_size),
                         stride=stride, padding=padding, dilation=dilation, groups=groups, allow_tf32=allow_tf32)
    return conv_backward_data_op(dy, w, list(input_size), *geometry, None, token)


def backward_weight(x, dy, weight_size, geometry: tuple, token: int) -> torch.Tensor:
    """dw: the fast path where the call is eager, else the custom op."""
    stride, padding, dilation, groups, allow_tf32 = geometry
    if runs_eagerly(x, dy):
        return eager_run(Direction.BWD_WEIGHT, dispatcher_of(token), None, x=x, dy=dy,
                         weight_size=tuple(weight_size), stride=stride, padding=padding, dilation=dilation,
                         groups=groups, allow_tf32=allow_tf32)
    return conv_backward_weight_op(x, dy, list(weight_size), *geometry, None, token)


def _keep(ctx, first, second, geometry, token) -> None:
    ctx.save_for_backward(first, second)
    ctx.geometry = geometry
    ctx.token = token


def _conv_setup(ctx, inputs, output) -> None:
    x, w, bias, residual, stride, padding, dilation, groups, activation, allow_tf32, _, token = inputs
    _keep(ctx, x, w, (stride, padding, dilation, groups, allow_tf32), token)
    ctx.activation = activation
    ctx.has_bias = bias is not None


def _conv_backward(ctx, dy):
    """dx, dw, dbias (dy summed over all but the channels) and dresidual (dy)."""
    if ctx.activation not in (None, "none"):
        raise UnsupportedError(f"activation={ctx.activation!r}: tiledispatch::conv differentiates the conv, bias and "
                               "residual only; call tiledispatch.conv, which applies the activation outside the "
                               "op when autograd records it")
    x, w = ctx.saved_tensors
    needs = ctx.needs_input_grad
    bias_grad = ctx.has_bias and needs[2]
    both = None
    if needs[0] and needs[1] and runs_eagerly(dy, x, w):  # one vendor call where both picks are the vendor's
        both = both_gradients(dy, x, w, ctx.geometry, dispatcher_of(ctx.token), bias_grad)
    if both is not None:
        dx, dw, dbias = both
    else:
        dx = backward_data(dy, w, x.shape, ctx.geometry, ctx.token) if needs[0] else None
        dw = backward_weight(x, dy, w.shape, ctx.geometry, ctx.token) if needs[1] else None
        dbias = dy.sum(dim=(0, *range(2, dy.dim())), dtype=torch.float32).to(dy.dtype) if bias_grad else None
    return dx, dw, dbias, dy if needs[3] else None, *(None,) * 8


def _data_setup(ctx, inputs, output) -> None:
    dy, w, input_size, stride, padding, dilation, groups, allow_tf32, _, token = inputs
    _keep(ctx, dy, w, (stride, padding, dilation, groups, allow_tf32), token)


def _data_backward(ctx, grad):
    """dx = B(dy, w) is the adjoint of the forward conv in dy: d/d(dy) = conv(grad, w), d/dw = W(grad, dy)."""
    dy, w = ctx.saved_tensors
    needs = ctx.needs_input_grad
    d_dy = forward(grad, w, ctx.geometry, ctx.token) if needs[0] else None
    d_w = backward_weight(grad, dy, w.shape, ctx.geometry, ctx.token) if needs[1] else None
    return d_dy, d_w, *(None,) * 8


def _weight_setup(ctx, inputs, output) -> None:
    x, dy, weight_size, stride, padding, dilation, groups, allow_tf32, _, token = inputs
    _keep(ctx, x, dy, (stride, padding, dilation, groups, allow_tf32), token)


def _weight_backward(ctx, grad):
    """dw = W(x, dy) with <conv(x, w), dy> = <w, W(x, dy)>: d/dx = B(dy, grad), d/d(dy) = conv(x, grad)."""
    x, dy = ctx.saved_tensors
    needs = ctx.needs_input_grad
    d_x = backward_data(dy, grad, x.shape, ctx.geometry, ctx.token) if needs[0] else None
    d_dy = forward(x, grad, ctx.geometry, ctx.token) if needs[1] else None
    return d_x, d_dy, *(None,) * 8


conv_op.register_autograd(_conv_backward, setup_context=_conv_setup)
conv_backward_data_op.register_autograd(_data_backward, setup_context=_data_setup)
conv_backward_weight_op.register_autograd(_weight_backward, setup_context=_weight_setup)
ConvFunction = eager_twin("ConvFunction", conv_kernel, _conv_setup, _conv_backward)
