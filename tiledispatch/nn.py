"""torch.nn modules whose calls go through tiledispatch: `Conv1d`, `Conv2d`, `Conv3d`, `Linear`, and
`patch(model)`, which turns a model's own modules of those classes into these in place.

Why modules, beside the functions: in an eager model the host is often the bound (a batch-32
resnet50 runs 4.8 ms eager and 2.5 ms replayed from a CUDA graph on the H200), so every
microsecond a call adds over PyTorch's own module shows. A layer sees the same signature call
after call, so each module keeps the last signature it saw and the call bound for it: a call
that matches compares one tuple and runs the bound call, where `tiledispatch.conv` keys the
call and looks it up in the dispatcher's shared memo. Any other call runs the function, as a
direct call would: a new signature (and then it is kept), torch.compile's trace, a CPU tensor,
a call autograd records that the op's twin takes.

The modules read PyTorch's own switches as nn.Conv2d and nn.Linear do: TF32 from
`torch.backends.cudnn.allow_tf32` (convs) and `torch.backends.cuda.matmul.allow_tf32` (linears).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .core.dispatcher import dispatcher_or_default
from .core.hostcost import capturing
from .ops.conv import bound_forward, conv
from .ops.conv.function import recorded_decision as conv_decision
from .ops.gemm import bound_call, gemm
from .ops.gemm.native import recorded_decision as gemm_decision

_KEPT = "_tiledispatch_last"  # a module's (signature, call): dropped when it is copied or pickled


def _signature(grad: bool, x, w, b, dispatcher, options: tuple) -> tuple:
    """Everything the bound call depends on: each tensor's type, shape, strides, dtype, device,
    16-byte alignment and negation bit, w's address (a Linear keeps w's transposed view), the
    options, whether autograd records and the dispatcher that bound it."""
    return (grad, dispatcher, options, type(x), x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15,
            x.is_neg(), type(w), w.shape, w.stride(), w.dtype, w.get_device(), w.data_ptr(), w.is_neg(),
            None if b is None else (type(b), b.shape, b.stride(), b.dtype, b.get_device(), b.data_ptr() & 15,
                                    b.is_neg()))


class _Kept:
    """The mixin: forward runs the kept call where the signature matches, else binds one."""

    def forward(self, x):
        if torch.compiler.is_dynamo_compiling() or type(x) is not torch.Tensor:
            return self._direct(x)  # the function's own path: traced, or checked (it names what is wrong)
        w, b = self.weight, self.bias
        grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b is not None and b.requires_grad)
        signature = _signature(grad, x, w, b, dispatcher_or_default(None, x), self._options())
        kept = self.__dict__.get(_KEPT)
        if kept is None or kept[0] != signature:
            kept = (signature, self._bind(x, w, b, grad) or self._direct_call)
            self.__dict__[_KEPT] = kept  # not Module.__setattr__: neither a parameter, buffer nor module
        return kept[1](x, w, b)

    def _direct_call(self, x, w, b):
        return self._direct(x)

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop(_KEPT, None)  # bound kernels belong to this process
        return state


class _ConvNd(_Kept):
    def _options(self) -> tuple:
        return (self.stride, self.padding, self.dilation, self.groups, self.padding_mode,
                torch.backends.cudnn.allow_tf32)

    def _tf32(self, x) -> bool:
        return torch.backends.cudnn.allow_tf32 and x.dtype is torch.float32

    def _direct(self, x):
        padding = self.padding
        if self.padding_mode != "zeros":  # padded by PyTorch, as nn.Conv2d does
            x, padding = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode), 0
        return conv(x, self.weight, stride=self.stride, padding=padding, dilation=self.dilation, groups=self.groups,
                    bias=self.bias, allow_tf32=self._tf32(x))

    def _bind(self, x, w, b, grad: bool):
        """The call this signature keeps, or None for the function's own path."""
        if self.padding_mode != "zeros":
            return None
        options = (self.stride, self.padding, self.dilation, self.groups, self._tf32(x))
        if not grad:
            bound = bound_forward(x, w, b, *options)
            return None if bound is None else lambda x, w, b: bound((x, w, None, b, None, None))
        native = conv_decision(x, w, b, *options, None)
        if native is None:
            return None
        if not native.weighed:
            return native
        return lambda x, w, b: self._direct(x) if capturing() else native(x, w, b)  # a capture runs the twin


class Conv1d(_ConvNd, nn.Conv1d):
    """nn.Conv1d through `tiledispatch.conv`."""


class Conv2d(_ConvNd, nn.Conv2d):
    """nn.Conv2d through `tiledispatch.conv`."""


class Conv3d(_ConvNd, nn.Conv3d):
    """nn.Conv3d through `tiledispatch.conv`."""


class Linear(_Kept, nn.Linear):
    """nn.Linear through `tiledispatch.gemm`: x (..., in_features) as one (rows, in_features) matrix."""

    def _options(self) -> tuple:
        return (torch.backends.cuda.matmul.allow_tf32,)

    def _tf32(self, x) -> bool:
        return torch.backends.cuda.matmul.allow_tf32 and x.dtype is torch.float32

    def _direct(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__} takes a tensor; got {type(x).__name__}")
        y = gemm(x.reshape(-1, x.shape[-1]), self.weight.t(), bias=self.bias, allow_tf32=self._tf32(x))
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def _bind(self, x, w, b, grad: bool):
        if x.dim() == 0:
            return None
        rows, wt, tf32 = x.reshape(-1, x.shape[-1]), w.t(), self._tf32(x)
        if not grad:
            bound = bound_call(rows, wt, bias=b, allow_tf32=tf32, dispatcher=dispatcher_or_default(None, x))
            out_shape = (*x.shape[:-1], w.shape[0])
            return lambda x, w, b: bound(x.reshape(-1, x.shape[-1]), wt, b, None, None, None, None).view(out_shape)
        decision = gemm_decision(rows, wt, b, tf32, None)
        if decision is None:
            return None
        # PyTorch's own linear computes what the dispatcher's three vendor picks would: it is the call
        native, weighed = decision
        if not weighed:
            return lambda x, w, b: F.linear(x, w, b)
        return lambda x, w, b: self._direct(x) if capturing() else F.linear(x, w, b)


_CLASSES = {nn.Conv1d: Conv1d, nn.Conv2d: Conv2d, nn.Conv3d: Conv3d, nn.Linear: Linear}


def patch(model: nn.Module) -> nn.Module:
    """Turns every module of `model` (itself included) whose class is exactly nn.Conv1d, nn.Conv2d,
    nn.Conv3d or nn.Linear into this module's class of that name, in place: parameters, buffers,
    hooks and names stay, and so does a subclass of those (its forward is its own). Returns `model`."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch takes an nn.Module; got {type(model).__name__}")
    for module in model.modules():
        ours = _CLASSES.get(type(module))
        if ours is not None:
            module.__class__ = ours
    return model


__all__ = ["Conv1d", "Conv2d", "Conv3d", "Linear", "patch"]
