"""A conv whose picks are all the vendor's, run as PyTorch runs it: both gradients in one cuDNN
call, and, on an eager call that autograd records, PyTorch's own op.

A training step needs dx and dw of every conv. Each is selected for its own problem (and, for
eager calls, weighed against their host time: core.hostcost); where both picks are the vendor,
computing them apart costs two trips through PyTorch's convolution_backward (and two fast-path
replays, and a stand-in tensor each), where PyTorch's own autograd makes one: on resnet50's
training step that was 97 calls of about 74 us of host time (results/h200/model_train_profile.txt).
One call with both outputs asked runs the same cuDNN kernels, and gives the bias's gradient too.

The decision is made once per signature (the three tensors' metadata and the geometry) and
kept in the dispatcher's memo, like a bound call.

Where the dispatcher's picks for the forward and both gradients are not expected to save the
twin's host time over the vendor's (`core.hostcost.native_for_recorded`; `native_forward`), an
eager recorded call goes one step further: it calls PyTorch's conv, whose autograd records its
own backward, one convolution_backward as above. That is the same cuDNN work as the op's twin
(library.py) and its joint backward, without the twin's Python, which cost a recorded 3x3 conv on
cuDNN's path 76 us of host time on the H200's host against PyTorch's 22
(results/h200/autograd_overhead_profile.txt): the vendor's pick costs what PyTorch's call costs.
fp16 and bf16 only (fp32's TF32 choice is the vendor family's own to make), on operands in the
layout the op takes (channels-last: a converted operand keeps the op's path), with no residual.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.dispatcher import dispatcher_or_default
from ...core.hostcost import capturing, eager_pick, native_for_recorded
from ...core.replay import tensor_meta
from ...core.switches import TF32
from .operands import ConvOperands, channels_last_empty, check_operands
from .problem import Direction
from .signature import Family
from .vendor import tf32_switch

_SEPARATE = object()  # a signature whose gradients are computed apart


class JointVendor:
    """dx, dw (and dbias) of one signature by one aten.convolution_backward call. `weighed`: a
    gradient's pick is the vendor's for eager calls only (core.hostcost), so a graph capture
    computes each gradient by the device's pick."""

    def __init__(self, data: ConvOperands, weighed: bool) -> None:
        self.weighed = weighed
        p = data.problem
        self._args = (list(p.stride), list(p.padding), list(p.dilation), False, [0] * p.spatial_dims, p.groups)
        self._bias_size = [p.k]
        self._tf32 = tf32_switch(p.types)

    def __call__(self, dy, x, w, with_bias: bool) -> tuple:
        with TF32(torch.backends.cudnn, self._tf32):
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
    if joint is _SEPARATE or joint.weighed and capturing():
        return None
    dx, dw, dbias = joint(dy, x, w, with_bias)
    return dx, dw, dbias if with_bias else None


def _geometry(options: tuple) -> dict:
    stride, padding, dilation, groups, allow_tf32 = options
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups, allow_tf32=allow_tf32)


def _gradients(dy, x, w, options: tuple) -> tuple[ConvOperands, ConvOperands]:
    """The checked operands of dx's and dw's convs (backward-data, backward-weight)."""
    geometry = _geometry(options)
    return (check_operands(Direction.BWD_DATA, dy=dy, w=w, input_size=tuple(x.shape), **geometry),
            check_operands(Direction.BWD_WEIGHT, x=x, dy=dy, weight_size=tuple(w.shape), **geometry))


def _decide(dispatcher, dy, x, w, options: tuple):
    """A JointVendor where each direction's pick for eager calls is the vendor on a plain call, else
    _SEPARATE."""
    data, weight = _gradients(dy, x, w, options)
    weighed = False
    for operands in (data, weight):
        if operands.converted or operands.problem.wide_offsets:
            return _SEPARATE
        pick, eager = eager_pick(dispatcher, operands.problem, None)
        if eager.family != Family.VENDOR.value:
            return _SEPARATE
        weighed = weighed or eager is not pick
    return JointVendor(data, weighed)


_NATIVE_DTYPES = (torch.float16, torch.bfloat16)
_CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class NativeVendor:
    """conv(x, w, bias) by PyTorch's own op, for a signature whose three picks are the vendor's.
    `weighed`: one of them is the vendor's for eager calls only (core.hostcost), so a graph
    capture runs the op's twin, which replays the device's picks."""

    def __init__(self, spatial_dims: int, options: tuple, weighed: bool) -> None:
        self._conv = _CONVS[spatial_dims]
        self._options = options[:4]  # stride, padding, dilation, groups
        self.weighed = weighed

    def __call__(self, x, w, bias):
        return self._conv(x, w, bias, *self._options)


def native_forward(x, w, bias, geometry: tuple, dispatcher) -> NativeVendor | None:
    """PyTorch's conv for an eager recorded call whose forward and both gradients the dispatcher
    gives the vendor (see the module's docstring), else None (the op's twin runs it)."""
    return unless_captured(native_decision(x, w, bias, geometry, dispatcher))


def unless_captured(native: NativeVendor | None) -> NativeVendor | None:
    """`native`, but None in a graph capture where its picks were weighed for eager calls."""
    return None if native is None or native.weighed and capturing() else native


def native_decision(x, w, bias, geometry: tuple, dispatcher) -> NativeVendor | None:
    """The signature's NativeVendor whatever captures (its `weighed` says whether a capture may run
    it), or None: decided once, in the dispatcher's memo."""
    if x.dtype not in _NATIVE_DTYPES:
        return None
    key = ("conv-native", tensor_meta(x), tensor_meta(w), None if bias is None else tensor_meta(bias), geometry)
    chosen = dispatcher_or_default(dispatcher, x)
    native = chosen.memo(key, lambda: _decide_native(chosen, x, w, bias, geometry))
    return None if native is _SEPARATE else native


def _decide_native(dispatcher, x, w, bias, options: tuple):
    forward = check_operands(Direction.FORWARD, x=x, w=w, bias=bias, **_geometry(options))
    p = forward.problem
    shaped_x, shaped_w = (channels_last_empty(tuple(t.shape), t.dtype, "meta") for t in (x, w))
    dy = channels_last_empty((p.n, p.k, *p.output_size), x.dtype, "meta")
    data, weight = _gradients(dy, shaped_x, shaped_w, options)
    if any(o.converted or o.problem.wide_offsets for o in (forward, data, weight)):
        return _SEPARATE
    weighed = native_for_recorded(dispatcher, (p, data.problem, weight.problem), x.device)
    return _SEPARATE if weighed is None else NativeVendor(p.spatial_dims, options, weighed)
