"""The vendor family's call: cuDNN through PyTorch, with the epilogue as separate steps (the family's
config, rules and score: families/vendor.py).

Forward is `torch.nn.functional.conv{1,2,3}d`; the backward directions are
`torch.ops.aten.convolution_backward` with only the wanted gradient. PyTorch picks the
cuDNN algorithm; each epilogue step (activation, residual) is one more pass over y,
and the ranking charges for it. The interpreter target refuses it: it is a GPU library.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.dtypes import DType
from ...core.switches import TF32
from ..gemm import Activation
from .operands import channels_last_empty
from .problem import Direction

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
ACTIVATIONS = {Activation.NONE: None, Activation.RELU: F.relu, Activation.GELU: F.gelu, Activation.SILU: F.silu}


def direct_call(dims: int, stride: tuple, padding: tuple, dilation: tuple, groups: int, bias: bool):
    """PyTorch's conv for a forward call of 16-bit tensors and these options, as call(x, w, bias).

    A dense conv without bias calls cuDNN's entry (`torch.cudnn_convolution`) straight, where
    PyTorch's `conv2d` would choose it among its backends first: 2.6-3.2 us less host time a call on
    the H200's host (results/h200/eager_floor.txt), for the same cuDNN call. It reads PyTorch's
    cuDNN switches on every call, as `conv2d` does, and runs `conv2d` where cuDNN is off."""
    conv = CONV[dims]
    if groups != 1 or bias or dims != 2:
        return lambda x, w, b: conv(x, w, b, stride, padding, dilation, groups)
    cudnn, enabled = torch.cudnn_convolution, torch._C._get_cudnn_enabled
    benchmark, deterministic = torch._C._get_cudnn_benchmark, torch._C._get_cudnn_deterministic
    everywhere = torch.are_deterministic_algorithms_enabled

    def call(x, w, b):
        if not enabled():
            return conv(x, w, b, stride, padding, dilation, groups)
        return cudnn(x, w, padding, stride, dilation, 1, benchmark(), deterministic() or everywhere(), False)
    return call


def run(operands, out: torch.Tensor) -> None:
    """Computes the conv of `operands` (a ConvOperands) into `out`.

    When `out` is the plan's own allocation (the caller passed none), it takes the
    result's storage (`set_`) instead of a copy: nobody else holds it yet, and a copy
    would be one more pass over the output.
    """
    p = operands.problem
    with TF32(torch.backends.cudnn, tf32_switch(p.types)):
        if p.direction is Direction.FORWARD:
            args = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation, "groups": p.groups}
            result = CONV[p.spatial_dims](operands.x, operands.w, operands.bias, **args)
            activation = ACTIVATIONS[p.epilogue.activation]
            if activation is not None:
                result = activation(result)
            if operands.residual is not None:
                result += operands.residual
        else:
            # The operand a direction does not read stands in uninitialised, channels-last as autograd's
            # would be. torch.nn.grad's stand-in, one element expanded to the shape, has no layout, and
            # cuDNN's backward-data then ran 2.2-7x slower (H100, results/h100/conv_vendor_stand_in.txt).
            dy = operands.dy
            x = operands.x if operands.x is not None else channels_last_empty((p.n, p.c, *p.input_size),
                                                                              dy.dtype, dy.device)
            w = operands.w if operands.w is not None else channels_last_empty(
                (p.k, p.c_per_group, *p.filter_size), dy.dtype, dy.device)
            mask = [p.direction is Direction.BWD_DATA, p.direction is Direction.BWD_WEIGHT, False]
            grads = torch.ops.aten.convolution_backward(
                dy, x, w, None, list(p.stride), list(p.padding), list(p.dilation), False,
                [0] * p.spatial_dims, p.groups, mask)
            result = grads[0] if p.direction is Direction.BWD_DATA else grads[1]
    if operands.out is None:
        out.set_(result)
    else:
        out.copy_(result)


def tf32_switch(types) -> bool | None:
    """What cuDNN's TF32 switch must read for a conv of these types (`core.switches.TF32`): the
    problem's own choice for fp32, None (the switch is not read) for any other dtype."""
    return types.allow_tf32 if types.dtype is DType.FP32 else None
