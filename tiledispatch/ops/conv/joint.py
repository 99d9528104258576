"""Both gradients of a conv in one cuDNN call, where the dispatcher picks the vendor for each.

A training step needs dx and dw of every conv. Each is selected for its own problem; where
both selections are the vendor, computing them apart costs two trips through PyTorch's
convolution_backward (and two fast-path replays, and a stand-in tensor each), where PyTorch's
own autograd makes one: on resnet50's training step that was 97 calls of about 74 us of host
time (results/h200/model_train_profile.txt). One call with both outputs asked runs the same
cuDNN kernels, and gives the bias's gradient too.

The decision is made once per signature (the three tensors' metadata and the geometry) and
kept in the dispatcher's memo, like a bound call.
"""

from __future__ import annotations

import contextlib

import torch

from ...core.dispatcher import dispatcher_or_default
from ...core.dtypes import DType
from ...core.replay import tensor_meta
from .operands import ConvOperands, check_operands
from .problem import Direction
from .signature import Family
from .vendor import _tf32

_SEPARATE = object()  # a signature whose gradients are computed apart


class JointVendor:
    """dx, dw (and dbias) of one signature by one aten.convolution_backward call."""

    def __init__(self, data: ConvOperands) -> None:
        p = data.problem
        self._args = (list(p.stride), list(p.padding), list(p.dilation), False, [0] * p.spatial_dims, p.groups)
        self._bias_size = [p.k]
        self._tf32 = p.types.allow_tf32 if p.types.dtype is DType.FP32 else None

    def __call__(self, dy, x, w, with_bias: bool) -> tuple:
        with contextlib.nullcontext() if self._tf32 is None else _tf32(self._tf32):
            return torch.ops.aten.convolution_backward(
                dy, x, w, self._bias_size if with_bias else None, *self._args, [True, True, with_bias])


def both_gradients(dy, x, w, geometry: tuple, dispatcher, with_bias: bool) -> tuple | None:
    """(dx, dw, dbias or None) by one vendor call where both selections are the vendor, else None
    (the caller computes each gradient by its own pick)."""
    stride, padding, dilation, groups, allow_tf32 = geometry
    options = (tuple(stride), tuple(padding), tuple(dilation), groups, allow_tf32)
    key = ("conv-joint-backward", tensor_meta(dy), tensor_meta(x), tensor_meta(w), options)
    chosen = dispatcher_or_default(dispatcher, dy)
    joint = chosen.memo(key, lambda: _decide(chosen, dy, x, w, options))
    if joint is _SEPARATE:
        return None
    dx, dw, dbias = joint(dy, x, w, with_bias)
    return dx, dw, dbias if with_bias else None


def _decide(dispatcher, dy, x, w, options: tuple):
    """A JointVendor where each direction's selection is the vendor on a plain call, else _SEPARATE."""
    stride, padding, dilation, groups, allow_tf32 = options
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, allow_tf32=allow_tf32)
    data = check_operands(Direction.BWD_DATA, dy=dy, w=w, input_size=tuple(x.shape), **geometry)
    weight = check_operands(Direction.BWD_WEIGHT, x=x, dy=dy, weight_size=tuple(w.shape), **geometry)
    for operands in (data, weight):
        if operands.converted or operands.problem.wide_offsets:
            return _SEPARATE
        if dispatcher.select(operands.problem).family != Family.VENDOR.value:
            return _SEPARATE
    return JointVendor(data)
