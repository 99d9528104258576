"""torch.nn modules whose calls go through tiledispatch: `Conv1d`, `Conv2d`, `Conv3d`, `Linear`, and
`patch(model)`, which turns a model's own modules of those classes into these in place.

Why modules, beside the functions: in an eager model the host is often the bound (a batch-32
resnet50 runs 4.8 ms eager and 2.5 ms replayed from a CUDA graph on the H200), so every
microsecond a call adds over PyTorch's own module shows. A layer sees the same signature call
after call, so each module keeps the last signature it saw and the call bound for it: a call
that matches compares a few fields and runs the bound call, where `tiledispatch.conv` keys the
call and looks it up in the dispatcher's shared memo. Any other call binds as the function
would: a new signature (and then it is kept), torch.compile's trace, a call under autocast. A call the ops do not take (fp64, an empty
batch, a conv's unbatched input) runs PyTorch's own op, as the module replaced would.

The modules read PyTorch's own switches as nn.Conv2d and nn.Linear do: TF32 from
`torch.backends.cudnn.allow_tf32` (convs) and `torch.backends.cuda.matmul.allow_tf32` (linears),
and under `torch.autocast` they run in its dtype (the functions take the dtypes they are given).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .core.dispatcher import _BY_DEVICE as _by_device
from .core.dispatcher import _SCOPED, dispatcher_or_default
from .core.hostcost import ByCapture, capturing
from .ops.conv import bound_forward, conv
from .ops.conv.fastpath import DirectConv
from .ops.conv.function import recorded_decision as conv_decision
from .ops.gemm import bound_call, gemm
from .ops.gemm.native import recorded_decision as gemm_decision

_KEPT = "_tiledispatch_last"  # a module's kept call (_Bound): dropped when it is copied or pickled

_compiling = torch.compiler.is_dynamo_compiling
_scoped = _SCOPED.get
_any_autocast = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled


# PyTorch's TF32 switches, which torch.compile reads once, as it reads them for nn.Conv2d and nn.Linear.
@torch._dynamo.assume_constant_result
def _conv_tf32() -> bool:
    return torch._C._get_cudnn_allow_tf32()


@torch._dynamo.assume_constant_result
def _matmul_tf32() -> bool:
    return torch._C._get_cublas_allow_tf32()


def _signature(x, w, b) -> tuple:
    """What a bound call of our kernels depends on beyond the kept call's other fields: each tensor's
    strides, type, negation bit and (x) 16-byte alignment, w's and b's shapes, dtypes and addresses
    (unique across devices; a Linear keeps w's transposed view)."""
    return (x.stride(), x.data_ptr() & 15, x.is_neg(), type(w), w.shape, w.stride(), w.dtype, w.data_ptr(),
            w.is_neg(), None if b is None else (type(b), b.shape, b.stride(), b.dtype, b.data_ptr(), b.is_neg()))


def _autocast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` in autocast's dtype, as autocast casts a conv's or a linear's operands: floating ones
    other than fp64."""
    return t.to(dtype) if t.dtype is not dtype and t.is_floating_point() and t.dtype is not torch.float64 else t


_TAKEN = (torch.float16, torch.bfloat16, torch.float32)


def _takes(x, w) -> bool:
    """Whether tiledispatch's ops take the call: a dtype of theirs, and something to compute. The
    modules give any other (fp64, an empty batch) to PyTorch's op, as the module they replace would."""
    return x.dtype in _TAKEN and w.dtype in _TAKEN and x.numel() > 0 and w.numel() > 0


class _Bound(NamedTuple):
    """A module's kept call: what it was bound for, then what it runs.

    The first seven fields say whether the dispatcher's pick still holds: x's shape, dtype and
    device index, whether autograd records, the dispatcher, the TF32 switch (None where x is not
    fp32) and whether there is no bias. The module's own options (stride, padding, ...) are not
    here: setting any attribute of the module drops its kept call (`_Kept.__setattr__`)."""

    shape: torch.Size
    dtype: torch.dtype
    device: int
    grad: bool
    dispatcher: Any
    tf32: bool | None
    no_bias: bool
    signature: tuple  # _signature: where `call` holds
    call: Callable | None  # our kernels' bound call; None where the vendor's runs in CUDA graph captures too
    vendor: Callable | None  # PyTorch's own op, where the eager pick is the vendor's


class _Kept:
    """The mixin: forward runs the kept call where the call matches it, else keeps a new one.

    `vendor(x, w, b)` (see _Bound) is called straight, the cheapest call there is, and right for any
    tensors (it is what PyTorch's module computes), so the first fields alone say whether it is still
    the pick; the check reads no Python attribute of the module and builds nothing. `call(x, w, b)`,
    the bound call of our kernels, holds for its whole signature only. Under autocast, w's cast is a
    new tensor each call, so a call of our kernels binds again each time (the memo's lookup, not a
    ranking)."""

    def forward(self, x):
        kept = self.__dict__.get(_KEPT)
        if kept is not None and type(x) is torch.Tensor and not _compiling() and not _any_autocast():
            shape, dtype, device, grad, dispatcher, tf32, no_bias, signature, call, vendor = kept
            parameters = self._parameters  # Module.__getattr__ would look there, through a Python frame
            w, b = parameters.get("weight"), parameters.get("bias")  # no weight: a parametrization's
            if (w is not None and x.shape == shape and x.dtype is dtype and (b is None) is no_bias
                    and x.get_device() == device
                    and (_grad_enabled() and (x.requires_grad or w.requires_grad or b is not None and b.requires_grad))
                    is grad and (_scoped() or _by_device.get(x.is_cuda)) is dispatcher
                    and (tf32 is None or tf32 is self._tf32_switch())):
                if vendor is not None and (call is None or not capturing()):
                    return vendor(x, w, b)
                if call is not None and _signature(x, w, b) == signature:
                    return call(x, w, b)
        return self._keep(x)

    def _keep(self, x):
        """A call the kept one does not cover: run as the function would, keeping its bound call."""
        compiling = _compiling()
        if not compiling and type(x) is not torch.Tensor:
            return self._direct(x, self.weight, self.bias)  # the function's checks name what is wrong
        parameters = self._parameters
        w = parameters["weight"] if "weight" in parameters else self.weight  # else: a parametrization's
        b = parameters["bias"] if "bias" in parameters else self.bias
        device = "cuda" if x.is_cuda else x.device.type
        if torch.is_autocast_enabled(device):  # as autocast runs nn.Conv2d and nn.Linear: in its dtype
            dtype = torch.get_autocast_dtype(device)
            x, w, b = _autocast(x, dtype), _autocast(w, dtype), None if b is None else _autocast(b, dtype)
        if compiling:
            return self._direct(x, w, b)  # traced: the custom op
        grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b is not None and b.requires_grad)
        fields = (x.shape, x.dtype, x.get_device(), grad, dispatcher_or_default(None, x),
                  self._tf32_switch() if x.dtype is torch.float32 else None, b is None, _signature(x, w, b))
        kept = self.__dict__.get(_KEPT)
        if kept is None or kept[:8] != fields:
            kept = _Bound(*fields, *self._bind(x, w, b, grad))
            self.__dict__[_KEPT] = kept  # not Module.__setattr__: neither a parameter, buffer nor module
        if kept.vendor is not None and (kept.call is None or not capturing()):
            return kept.vendor(x, w, b)
        return kept.call(x, w, b)

    def _tf32(self, x) -> bool:
        return x.dtype is torch.float32 and self._tf32_switch()

    def _direct_call(self, x, w, b):
        return self._direct(x, w, b)

    def __setattr__(self, name, value):
        self.__dict__.pop(_KEPT, None)  # an option, a parameter or a mode changed: the kept call may not hold
        super().__setattr__(name, value)

    def __delattr__(self, name):
        self.__dict__.pop(_KEPT, None)
        super().__delattr__(name)

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop(_KEPT, None)  # bound kernels belong to this process
        return state


class _ConvNd(_Kept):
    _tf32_switch = staticmethod(_conv_tf32)

    def _direct(self, x, w, b):
        padding, tensor = self.padding, isinstance(x, torch.Tensor)  # conv() names an x that is not a tensor
        if self.padding_mode != "zeros" and tensor:  # padded by PyTorch, as nn.Conv2d does
            x, padding = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode), 0
        return conv(x, w, stride=self.stride, padding=padding, dilation=self.dilation, groups=self.groups,
                    bias=b, allow_tf32=tensor and self._tf32(x))

    def _bind(self, x, w, b, grad: bool) -> tuple:
        """(call, vendor) for this signature (see _Kept)."""
        if not _takes(x, w) or x.dim() != len(self.kernel_size) + 2:
            return None, self._conv_forward  # an unbatched input too: PyTorch's module's own conv
        if self.padding_mode != "zeros":
            return self._direct_call, None
        options = (self.stride, self.padding, self.dilation, self.groups, self._tf32(x))
        if grad:
            native = conv_decision(x, w, b, *options, None)
            if native is None:
                return self._direct_call, None
            return (self._direct_call if native.weighed else None), native  # a capture runs the twin where weighed
        bound = bound_forward(x, w, b, *options)
        if bound is None:
            return self._direct_call, None
        eager, replayed = (bound.eager, bound.replayed) if isinstance(bound, ByCapture) else (bound, None)
        if isinstance(eager, DirectConv):
            return (None if replayed is None else _tensors(replayed)), eager.call
        return _tensors(bound), None


def _tensors(bound):
    """A conv's bound call, called as the modules call: on (x, w, b)."""
    return lambda x, w, b: bound((x, w, None, b, None, None))


class Conv1d(_ConvNd, nn.Conv1d):
    """nn.Conv1d through `tiledispatch.conv`."""


class Conv2d(_ConvNd, nn.Conv2d):
    """nn.Conv2d through `tiledispatch.conv`."""


class Conv3d(_ConvNd, nn.Conv3d):
    """nn.Conv3d through `tiledispatch.conv`."""


class Linear(_Kept, nn.Linear):
    """nn.Linear through `tiledispatch.gemm`: x (..., in_features) as one (rows, in_features) matrix."""

    _tf32_switch = staticmethod(_matmul_tf32)

    def _direct(self, x, w, b):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__} takes a tensor; got {type(x).__name__}")
        y = gemm(x.reshape(-1, x.shape[-1]), w.t(), bias=b, allow_tf32=self._tf32(x))
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def _bind(self, x, w, b, grad: bool) -> tuple:
        """(call, vendor) for this signature (see _Kept): PyTorch's linear where the eager pick is the
        vendor's, as it computes what the vendor's product computes."""
        if not _takes(x, w) or x.dim() == 0:
            return None, F.linear
        rows, wt, tf32 = x.reshape(-1, x.shape[-1]), w.t(), self._tf32(x)
        if grad:
            decision = gemm_decision(rows, wt, b, tf32, None)
            if decision is None:
                return self._direct_call, None
            return (self._direct_call if decision[1] else None), F.linear  # a capture runs the twin where weighed
        bound = bound_call(rows, wt, bias=b, allow_tf32=tf32, dispatcher=dispatcher_or_default(None, x))
        out_shape = (*x.shape[:-1], w.shape[0])

        def call(x, w, b):
            return bound(x.reshape(-1, x.shape[-1]), wt, b, None, None, None, None).view(out_shape)
        eager = bound.eager if isinstance(bound, ByCapture) else bound
        if getattr(eager, "vendor", False):
            return (call if isinstance(bound, ByCapture) else None), F.linear
        return call, None


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
