"""A conv call: the fast path or every check, and `conv()` under autograd.

Where an input of `conv()` requires grad, it runs through `ConvFunction`, whose backward
takes dx from the backward-data conv and dw from the backward-weight conv, each selected
for its own problem as a direct call would be; bias's gradient is dy summed over all but
the channels, residual's is dy. An activation's gradient needs its input, so with one the
forward runs the conv with the bias fused and keeps its result z, and the activation and
residual follow as PyTorch ops in fp32: one more pass over the output each way, where an
inference call fuses them into the conv's epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ...core.args import as_kernel_name
from ...core.dtypes import DType
from ...core.errors import InvalidArgumentError, UnsupportedError
from ...core.op import OpKind
from ..gemm.problem import Activation
from . import fastpath
from .operands import ConvOperands, check_operands
from .problem import ConvTypes, Direction
from .vendor import ACTIVATIONS


def run(direction: Direction, dispatcher, kernel, **arguments):
    """A call seen before replays its bound plan (fastpath.py); any other runs every check."""
    from ...core.dispatcher import dispatcher_or_default

    dispatcher = dispatcher_or_default(dispatcher)
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


class ConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, residual, call: ConvCall):
        activation = ACTIVATIONS[call.activation]
        if activation is None:
            y = run(Direction.FORWARD, call.dispatcher, call.kernel, x=x, w=w, bias=bias, residual=residual,
                    **call.options())
            z = None
        else:
            z = run(Direction.FORWARD, call.dispatcher, call.kernel, x=x, w=w, bias=bias, **call.options())
            out = activation(z.float())
            if residual is not None:
                out += residual
            y = out.to(z.dtype)
        ctx.save_for_backward(x, w, z)
        ctx.call = call
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, z = ctx.saved_tensors
        call: ConvCall = ctx.call
        dz = dy
        if z is not None:  # through the activation, at its input z, in fp32
            with torch.enable_grad():
                z32 = z.detach().float().requires_grad_()
                dz = torch.autograd.grad(ACTIVATIONS[call.activation](z32), z32, dy.float())[0].to(dy.dtype)
        dx = dw = dbias = None
        if ctx.needs_input_grad[0]:
            dx = run(Direction.BWD_DATA, call.dispatcher, None, dy=dz, w=w, input_size=tuple(x.shape),
                     **call.options())
        if ctx.needs_input_grad[1]:
            dw = run(Direction.BWD_WEIGHT, call.dispatcher, None, x=x, dy=dz, weight_size=tuple(w.shape),
                     **call.options())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = dz.sum(dim=(0, *range(2, dz.dim())), dtype=torch.float32).to(dz.dtype)
        dresidual = dy if ctx.needs_input_grad[3] else None
        return dx, dw, dbias, dresidual, None
