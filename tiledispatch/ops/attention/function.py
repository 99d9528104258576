"""`attention()`: checks, selection and the forward plan; its autograd backward runs the backward plan.

The forward keeps the log-sum-exp whenever a gradient may follow, and the backward plan
reads it (P is recomputed, never stored). The LSE returned by `return_lse=True` carries
no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...core.errors import InvalidProblemError, UnsupportedError
from .operands import AttentionOperands, AttentionOptions, check_operands
from .problem import Direction, MaskKind, Window

_CAUSAL = {False: MaskKind.NONE, None: MaskKind.NONE, True: MaskKind.CAUSAL_TOP_LEFT,
           "top_left": MaskKind.CAUSAL_TOP_LEFT, "bottom_right": MaskKind.CAUSAL_BOTTOM_RIGHT}


def parse_causal(causal: Any) -> MaskKind:
    """False, True (top-left, as torch SDPA), "top_left" or "bottom_right" (as FlashAttention)."""
    if isinstance(causal, MaskKind) and causal in (MaskKind.NONE, MaskKind.CAUSAL_TOP_LEFT,
                                                   MaskKind.CAUSAL_BOTTOM_RIGHT):
        return causal
    try:
        return _CAUSAL[causal]
    except (KeyError, TypeError):
        raise UnsupportedError(f"causal={causal!r}: use False, True (top-left), 'top_left' or 'bottom_right'") from None


def parse_window(window: Any) -> Window | None:
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise InvalidProblemError(f"[window] window={window!r} must be (left, right); -1 is unbounded") from None
    return Window(int(left), int(right))


@dataclass(frozen=True)
class Call:
    """The non-tensor part of a call, kept for the backward."""

    options: AttentionOptions
    kernel: str | None
    backward_kernel: str | None
    dispatcher: Any


def _checked(dispatcher, q, k, v, tensors: dict, options: AttentionOptions, **extra) -> AttentionOperands:
    operands = check_operands(q, k, v, options=options, **tensors, **extra)
    dtype, arch = operands.problem.dtype, dispatcher.arch
    if dtype.value != "fp32" and not arch.supports_dtype(dtype):
        where = "Triton's CPU interpreter (no bf16 tl.dot)" if arch.is_interpreter else arch.name
        raise UnsupportedError(f"[dtype-arch] q is {dtype.value}, which attention cannot run on {where}; "
                               "use fp16 or fp32" + (", or run on a GPU" if arch.is_interpreter else ""))
    return operands


def forward(call: Call, q, k, v, tensors: dict):
    operands = _checked(call.dispatcher, q, k, v, tensors, call.options)
    return call.dispatcher.run(operands, kernel=call.kernel)


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, call: Call):
        tensors = {"bias": bias, "sinks": sinks, "mask": mask, "alibi_slopes": alibi_slopes,
                   "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}
        result = forward(call, q, k, v, tensors)
        ctx.save_for_backward(q, k, v, result.out, result.lse, bias, sinks, mask, alibi_slopes,
                              cu_seqlens_q, cu_seqlens_k)
        ctx.call = call
        ctx.mark_non_differentiable(result.lse)
        return result.out, result.lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, bias, sinks, mask, alibi_slopes, cu_q, cu_k = ctx.saved_tensors
        call: Call = ctx.call
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        tensors = {"bias": bias, "sinks": sinks, "mask": mask, "alibi_slopes": alibi_slopes,
                   "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
        operands = _checked(call.dispatcher, q, k, v, tensors, call.options, direction=Direction.BACKWARD,
                            out=out, lse=lse, grad_out=grad_out, bias_grad=bias_grad)
        grads = call.dispatcher.run(operands, kernel=call.backward_kernel)
        dbias = _reduce_to(grads.dbias, bias) if bias_grad else None
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[4]:
            # d loss / d sink_h = -sum over rows of P(sink) * delta, with P(sink) = exp(sink - lse).
            heads_axis = 0 if operands.problem.variant.varlen else 1
            shape = [1] * lse.dim()
            shape[heads_axis] = -1
            p_sink = torch.exp(sinks.float().reshape(shape) - lse)
            dims = [d for d in range(lse.dim()) if d != heads_axis]
            dsinks = (-(p_sink * grads.delta).sum(dim=dims)).to(sinks.dtype)
        return grads.dq, grads.dk, grads.dv, dbias, dsinks, None, None, None, None, None


def _reduce_to(full: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The (batch, heads, Sq, Skv) gradient summed over the dims the bias broadcast along."""
    lead = full.dim() - bias.dim()
    grad = full.sum(dim=tuple(range(lead))) if lead else full
    dims = tuple(i for i, n in enumerate(bias.shape) if n == 1 and grad.shape[i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.to(bias.dtype)
