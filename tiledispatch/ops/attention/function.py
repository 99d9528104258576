"""`attention()`: checks, selection and the forward plan; its autograd backward runs the backward plan.

The forward keeps the log-sum-exp whenever a gradient may follow, and the backward plan
reads it (P is recomputed, never stored). The LSE returned by `return_lse=True` carries
no gradient. Both directions replay a bound call (fastpath.py) on a signature seen before.
A call that autograd records, or that torch.compile traces, goes through the custom op
tiledispatch::attention (library.py), whose registered autograd runs the backward plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...core.args import as_bool, as_kernel_name
from ...core.errors import InvalidArgumentError, UnsupportedError
from ..library_common import dispatcher_token, records_eagerly
from . import fastpath
from .arguments import dropout_probability, parse_causal, parse_window
from .operands import AttentionOperands, AttentionOptions, check_operands
from .plan import AttentionResult
from .problem import FP8_DTYPES, Direction, MaskKind, Window

FP8_TORCH = tuple(d.torch for d in FP8_DTYPES)


@dataclass(frozen=True)
class Call:
    """The non-tensor part of a call, kept for the backward."""

    options: AttentionOptions
    kernel: str | None
    backward_kernel: str | None
    dispatcher: Any
    bound: Any = None  # the forward's bound call (fastpath.py) when its signature has one
    traced: bool = False  # torch.compile traces the call: the forward is the custom op


def _refuse_untracked_grads(mask, alibi_slopes) -> None:
    """A mask or ALiBi slopes that require grad would get none (the kernels differentiate q, k, v,
    bias and sinks only): refused rather than left silently untrained."""
    if not torch.is_grad_enabled():
        return
    for name, t, hint in (("mask", mask, "or bias= for a learned additive term"),
                          ("alibi_slopes", alibi_slopes, "or a learned bias=")):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise InvalidArgumentError(f"[{name.replace('_', '-')}-grad] {name} requires grad, but attention "
                                       f"computes no gradient for it; pass {name}.detach(), {hint}")


def read_call(q, k, v, bias, sinks, mask, alibi_slopes, *, causal, window, scale, softcap, dropout_p, dropout_seed, dropout_offset,
              return_lse, deterministic, kernel, backward_kernel, dispatcher) -> tuple[Call, bool, bool]:
    """attention()'s non-tensor arguments, checked: a Call (without its bound forward yet), whether
    a gradient may follow, and whether the LSE is returned."""
    from ...core.dispatcher import dispatcher_or_default

    _refuse_untracked_grads(mask, alibi_slopes)
    dropout_p = dropout_probability(dropout_p)
    compiling = torch.compiler.is_dynamo_compiling()
    if dropout_p and dropout_seed is None:
        if compiling:
            raise UnsupportedError("[dropout-seed] dropout_p > 0 under torch.compile needs dropout_seed= (drawing "
                                   "one reads a tensor on the host, which breaks the graph): pass an integer seed")
        dropout_seed = int(torch.randint(0, 2**62, (1,)).item())
    if return_lse is not True and return_lse is not False:
        return_lse = as_bool(return_lse, "return_lse")
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (q, k, v, bias, sinks))
    if grad and isinstance(q, torch.Tensor) and q.dtype in FP8_TORCH:
        raise UnsupportedError("[fp8-forward] fp8 attention is forward only (inference): no input may require "
                               "grad (call it under torch.no_grad(), or train in bf16)")
    options = AttentionOptions(
        causal=parse_causal(causal), window=parse_window(window), scale=scale, softcap=softcap,
        dropout_p=dropout_p, dropout_seed=0 if dropout_seed is None else dropout_seed,
        dropout_offset=dropout_offset, needs_lse=return_lse or grad, deterministic=deterministic,
    )
    chosen = None if compiling and dispatcher_token(dispatcher) == 0 else dispatcher_or_default(dispatcher, q)
    call = Call(options, as_kernel_name(kernel, "kernel"), as_kernel_name(backward_kernel, "backward_kernel"), chosen,
                traced=compiling)
    return call, grad, return_lse


def _checked(dispatcher, q, k, v, tensors: dict, options: AttentionOptions, **extra) -> AttentionOperands:
    operands = check_operands(q, k, v, options=options, **tensors, **extra)
    dtype, arch = operands.problem.dtype, dispatcher.arch
    if dtype.value != "fp32" and not arch.supports_dtype(dtype):
        where = "Triton's CPU interpreter (no bf16 tl.dot)" if arch.is_interpreter else arch.name
        raise UnsupportedError(f"[dtype-arch] q is {dtype.value}, which attention cannot run on {where}; "
                               "use fp16 or fp32" + (", or run on a GPU" if arch.is_interpreter else ""))
    return operands


def forward(call: Call, q, k, v, tensors: dict):
    """The forward by the bound call of the signature, or checked, selected and planned; under
    torch.compile, the custom op."""
    if call.traced:
        return AttentionResult(*recorded(q, k, v, tensors["bias"], tensors["sinks"], tensors["mask"],
                                         tensors["alibi_slopes"], tensors["cu_seqlens_q"], tensors["cu_seqlens_k"],
                                         call, (tensors.get("scale_q"), tensors.get("scale_k"),
                                                tensors.get("scale_v"))))
    if call.bound is not None:
        o = call.options
        return call.bound(q, k, v, tensors["bias"], tensors["mask"], tensors["alibi_slopes"], tensors["sinks"],
                          o.dropout_seed, o.dropout_offset, scale_q=tensors.get("scale_q"),
                          scale_k=tensors.get("scale_k"), scale_v=tensors.get("scale_v"))
    operands = _checked(call.dispatcher, q, k, v, tensors, call.options)
    return call.dispatcher.run(operands, kernel=call.kernel)


def bound_forward(dispatcher, q, k, v, tensors: dict, options: AttentionOptions, kernel):
    """The forward's bound call for this signature, or None (varlen, checked-only signatures, a trace:
    no dispatcher)."""
    if dispatcher is None or tensors["cu_seqlens_q"] is not None or tensors["cu_seqlens_k"] is not None:
        return None  # cu_seqlens are read on the host: every call is checked
    key = fastpath.forward_key(q, k, v, (tensors["bias"], tensors["mask"], tensors["alibi_slopes"],
                                         tensors["sinks"]), options, kernel,
                               (tensors["scale_q"], tensors["scale_k"], tensors["scale_v"]))
    if key is None:
        return None
    return fastpath.lookup(dispatcher, key, lambda: _checked(dispatcher, q, k, v, tensors, options), kernel)


def backward_grads(call: Call, q, k, v, out, lse, grad_out, tensors: dict, bias_grad: bool):
    """The backward plan's gradients, by the bound call of the backward's signature where it has one."""
    def checked():
        return _checked(call.dispatcher, q, k, v, tensors, call.options, direction=Direction.BACKWARD,
                        out=out, lse=lse, grad_out=grad_out, bias_grad=bias_grad)

    optional = (tensors["bias"], tensors["mask"], tensors["alibi_slopes"], tensors["sinks"])
    o = call.options
    bound = None
    if tensors["cu_seqlens_q"] is None and tensors["cu_seqlens_k"] is None:
        key = fastpath.backward_key(q, k, v, out, lse, grad_out, optional, o, call.backward_kernel, bias_grad)
        if key is not None:
            bound = fastpath.lookup(call.dispatcher, key, checked, call.backward_kernel)
    if bound is not None:
        return bound(q, k, v, *optional, o.dropout_seed, o.dropout_offset, out, lse, grad_out)
    return call.dispatcher.run(checked(), kernel=call.backward_kernel)


def options_of(causal: str, window, scale, softcap, dropout_p, dropout_seed, dropout_offset, needs_lse,
               deterministic) -> AttentionOptions:
    """The options a custom op's scalars stand for (scalars_of's inverse)."""
    return AttentionOptions(causal=MaskKind(causal), window=None if window is None else Window(*window),
                            scale=scale, softcap=softcap, dropout_p=dropout_p, dropout_seed=dropout_seed,
                            dropout_offset=dropout_offset, needs_lse=needs_lse, deterministic=deterministic)


def scalars_of(options: AttentionOptions) -> tuple:
    """The custom op's scalars of `options`: causal as MaskKind's value, the window as [left, right]."""
    window = None if options.window is None else [options.window.left, options.window.right]
    return (options.causal.value, window, options.scale, options.softcap, options.dropout_p, options.dropout_seed,
            options.dropout_offset, options.needs_lse, options.deterministic)


def recorded(q, k, v, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, call: Call,
             scales: tuple = (None, None, None)):
    """(out, lse) by the custom op tiledispatch::attention (lse None where it is not needed), what
    torch.compile traces, or by its eager twin on an eager call: what autograd records (the op's
    autograd runs the backward plan)."""
    op = torch.ops.tiledispatch.attention.default
    if records_eagerly(q, k, v, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *scales):
        from .library import AttentionFunction
        op = AttentionFunction.apply
    out, lse = op(
        q, k, v, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *scales, *scalars_of(call.options),
        call.kernel, call.backward_kernel, dispatcher_token(call.dispatcher))
    return out, lse if call.options.needs_lse else None

