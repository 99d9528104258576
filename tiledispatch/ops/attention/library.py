"""tiledispatch::attention and tiledispatch::attention_backward: the custom ops torch.compile traces,
and the forward's eager twin AttentionFunction, which autograd records on an eager call (see
tiledispatch/library.py).

The forward op gives (out, lse): out in q's layout (BSHD stays BSHD) with v's head dim, the
natural-log LSE (batch, heads_q, seqlen_q) or, varlen, (heads_q, tokens) in fp32, and an empty
LSE where neither a gradient nor `return_lse` asks for one. Its autograd runs the backward op,
which gives (dq, dk, dv, delta, dbias): delta = rowsum(dO * O) where sinks take a gradient
(else empty), the full fp32 (batch, heads_q, seqlen_q, seqlen_kv) bias gradient where bias
takes one (else empty); the bias's broadcast dims and the sinks' gradient are summed here, as
PyTorch ops. The backward op is differentiated once only.

The options travel as scalars: causal as MaskKind's value, the window as [left, right].
"""

import functools
from typing import Optional

import torch

from ...core.tensors import check_plain
from .. import inductor
from ..library_common import DEFAULT_DISPATCHER, custom_op, dispatcher_of, eager_twin, runs_eagerly
from .function import Call, backward_grads, bound_forward, forward, options_of
from .operands import check_operands
from .plan import like_layout
from .problem import FP8_DTYPES, FP8_OUTPUT
from .vendor import padded_keys

_FP8 = tuple(d.torch for d in FP8_DTYPES)
Tensor = torch.Tensor
OptTensor = Optional[torch.Tensor]


@functools.lru_cache(maxsize=256)
def _layout_strides(shape: tuple, strides: tuple, last: int) -> tuple:
    """The strides of like_layout(t, last) for a t of `shape` and `strides`: computed once on the meta
    device, so that checking a result's layout costs a lookup, not two allocations."""
    return like_layout(torch.empty_strided(shape, strides, device="meta"), last).stride()


def _in_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t in the layout the fake promises (like_layout of `like`), copied only where it is not."""
    if t.stride() == _layout_strides(tuple(like.shape), like.stride(), t.shape[-1]):
        return t
    return like_layout(like, t.shape[-1], dtype=t.dtype).copy_(t)


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,), dtype=torch.float32)


def attention_kernel(q: Tensor, k: Tensor, v: Tensor, bias: OptTensor, sinks: OptTensor, mask: OptTensor,
                     alibi_slopes: OptTensor, cu_seqlens_q: OptTensor, cu_seqlens_k: OptTensor, scale_q: OptTensor,
                     scale_k: OptTensor, scale_v: OptTensor, causal: str, window: Optional[list[int]],
                     scale: Optional[float], softcap: Optional[float], dropout_p: float, dropout_seed: int,
                     dropout_offset: int, needs_lse: bool, deterministic: bool, kernel: Optional[str],
                     backward_kernel: Optional[str], dispatcher: int) -> tuple[Tensor, Tensor]:
    """The forward by its fast path: (out, lse), lse empty where it is not needed."""
    from ...core.dispatcher import dispatcher_or_default

    options = options_of(causal, window, scale, softcap, dropout_p, dropout_seed, dropout_offset, needs_lse,
                         deterministic)
    chosen = dispatcher_or_default(dispatcher_of(dispatcher), q)
    tensors = {"bias": bias, "sinks": sinks, "mask": mask, "alibi_slopes": alibi_slopes, "cu_seqlens_q": cu_seqlens_q,
               "cu_seqlens_k": cu_seqlens_k, "scale_q": scale_q, "scale_k": scale_k, "scale_v": scale_v}
    call = Call(options, kernel, backward_kernel, chosen,
                bound_forward(chosen, q, k, v, tensors, options, kernel))
    result = forward(call, q, k, v, tensors)
    lse = result.lse if needs_lse else None
    return _in_layout(result.out, q), _empty(q) if lse is None else lse.contiguous()


attention_op = custom_op("attention", attention_kernel)


@attention_op.register_fake
def _attention_fake(q, k, v, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale_q, scale_k, scale_v,
                    causal, window, scale, softcap, dropout_p, dropout_seed, dropout_offset, needs_lse, deterministic,
                    kernel, backward_kernel, dispatcher):
    inductor.register()
    out = like_layout(q, v.shape[-1], dtype=FP8_OUTPUT.torch if q.dtype in _FP8 else None)
    if not needs_lse:
        return out, _empty(q)
    shape = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[1], q.shape[2])
    return out, q.new_empty(shape, dtype=torch.float32)


@inductor.decomposes(attention_op)
def _attention_as_aten(q, k, v, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale_q, scale_k,
                       scale_v, causal, window, scale, softcap, dropout_p, dropout_seed, dropout_offset, needs_lse,
                       deterministic, kernel, backward_kernel, dispatcher):
    """PyTorch's attention where the default dispatcher gives the vendor this traced forward
    (inductor.py): a plain one, SDPA's own (16-bit dense tensors, no bias, sinks, window, soft-cap,
    dropout or scales, no LSE asked for, causal top-left or with Sq = Skv), becomes
    aten.scaled_dot_product_attention; one with a mask tensor, cuDNN's op with the mask as its bias,
    as the vendor runs it eagerly (vendor.mask_bias)."""
    plain = (all(t is None for t in (bias, sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale_q, scale_k,
                                     scale_v))
             and window is None and softcap is None and not dropout_p and not needs_lse and kernel is None
             and backward_kernel is None and dispatcher == DEFAULT_DISPATCHER and q.dim() == 4
             and q.dtype in inductor.VENDOR_DTYPES and k.dtype == v.dtype == q.dtype)
    is_causal = causal == "causal" or causal == "causal-br" and q.shape[2] == k.shape[2]
    if not plain or causal not in ("none", "causal", "causal-br") or causal != "none" and not is_causal:
        return NotImplemented
    if mask is not None and mask.dtype not in (torch.bool, q.dtype):
        return NotImplemented
    metas = inductor.static_metas(q, k, v, mask)
    options = options_of(causal, None, scale, None, 0.0, 0, 0, False, deterministic)
    if metas is None or not inductor.picks_vendor(
            ("attention", metas, causal, scale, deterministic), q,
            lambda made: check_operands(*made[:3], options=options, mask=made[3]).problem):
        return NotImplemented
    if mask is None:
        out = torch.ops.aten.scaled_dot_product_attention(q, k, v, None, 0.0, is_causal, scale=scale,
                                                          enable_gqa=q.shape[1] != k.shape[1])
        return out, _empty(q)
    bias = mask if mask.dtype == q.dtype else torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
        ~mask, float("-inf"))
    keys = k.shape[2]
    if padded_keys(keys) != keys:  # rows of 16 bytes, as PyTorch's own SDPA pads a bias for cuDNN
        bias = torch.nn.functional.pad(bias, (0, padded_keys(keys) - keys))[..., :keys]
    else:  # a caller's additive mask may be a strided view: cuDNN takes dense rows
        bias = bias.contiguous()
    bias = bias.expand(*q.shape[:3], keys)
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False, 0.0, is_causal, False,
                                                             scale=scale)[0]
    return out, _empty(q)


def backward_kernel(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                          bias: OptTensor, sinks: OptTensor, mask: OptTensor, alibi_slopes: OptTensor,
                          cu_seqlens_q: OptTensor, cu_seqlens_k: OptTensor, causal: str, window: Optional[list[int]],
                          scale: Optional[float], softcap: Optional[float], dropout_p: float, dropout_seed: int,
                          dropout_offset: int, deterministic: bool, backward_kernel: Optional[str], bias_grad: bool,
                          dispatcher: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The backward plan's (dq, dk, dv, delta, dbias), by its fast path: the kernel of
    tiledispatch::attention_backward, which an eager backward calls directly."""
    from ...core.dispatcher import dispatcher_or_default

    options = options_of(causal, window, scale, softcap, dropout_p, dropout_seed, dropout_offset, True, deterministic)
    call = Call(options, None, backward_kernel, dispatcher_or_default(dispatcher_of(dispatcher), q))
    tensors = {"bias": bias, "sinks": sinks, "mask": mask, "alibi_slopes": alibi_slopes,
               "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}
    grad_out = check_plain(grad_out, "grad_out")  # a negated view's memory does not hold its values
    grads = backward_grads(call, q, k, v, out, lse, grad_out, tensors, bias_grad)
    delta = grads.delta.contiguous() if sinks is not None else _empty(q)
    dbias = grads.dbias.contiguous() if bias_grad else _empty(q)
    return _in_layout(grads.dq, q), _in_layout(grads.dk, k), _in_layout(grads.dv, v), delta, dbias


attention_backward_op = custom_op("attention_backward", backward_kernel)


@attention_backward_op.register_fake
def _backward_fake(grad_out, q, k, v, out, lse, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, causal,
                   window, scale, softcap, dropout_p, dropout_seed, dropout_offset, deterministic, backward_kernel,
                   bias_grad, dispatcher):
    delta = lse.new_empty(lse.shape) if sinks is not None else _empty(q)
    dbias = (q.new_empty((q.shape[0], q.shape[1], q.shape[2], k.shape[2]), dtype=torch.float32) if bias_grad
             else _empty(q))
    return (like_layout(q, q.shape[-1]), like_layout(k, k.shape[-1]), like_layout(v, v.shape[-1]), delta, dbias)


def _setup(ctx, inputs, output) -> None:
    q, k, v, bias, sinks, mask, alibi_slopes, cu_q, cu_k = inputs[:9]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bias, sinks, mask, alibi_slopes, cu_q, cu_k)
    ctx.scalars = inputs[12:21]  # causal ... deterministic, options_of's order
    ctx.backward_kernel, ctx.dispatcher = inputs[22], inputs[23]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, grad_lse):
    """dq, dk, dv from the backward plan; dbias summed to the bias's shape; dsinks from delta."""
    q, k, v, out, lse, bias, sinks, mask, alibi_slopes, cu_q, cu_k = ctx.saved_tensors
    needs = ctx.needs_input_grad
    bias_grad = bias is not None and needs[3]
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    causal, window, scale, softcap, dropout_p, seed, offset, _, deterministic = ctx.scalars
    arguments = (grad_out, q, k, v, out, lse, bias, sinks, mask, alibi_slopes, cu_q, cu_k, causal, window, scale,
                 softcap, dropout_p, seed, offset, deterministic, ctx.backward_kernel, bias_grad, ctx.dispatcher)
    run = backward_kernel if runs_eagerly(grad_out, q, k, v, out, lse, bias, sinks) else attention_backward_op
    dq, dk, dv, delta, dbias_full = run(*arguments)
    dbias = _reduce_to(dbias_full, bias) if bias_grad else None
    dsinks = _sinks_grad(sinks, lse, delta, cu_q is not None) if sinks is not None and needs[4] else None
    return (dq, dk, dv, dbias, dsinks, *(None,) * 19)


def _sinks_grad(sinks, lse, delta, varlen: bool) -> torch.Tensor:
    """d loss / d sink_h = -sum over rows of P(sink) * delta, with P(sink) = exp(sink - lse)."""
    heads_axis = 0 if varlen else 1  # varlen: (heads, tokens)
    shape = [1] * lse.dim()
    shape[heads_axis] = -1
    p_sink = torch.exp(sinks.float().reshape(shape) - lse)
    dims = [d for d in range(lse.dim()) if d != heads_axis]
    return (-(p_sink * delta).sum(dim=dims)).to(sinks.dtype)


def _reduce_to(full: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The (batch, heads, Sq, Skv) gradient summed over the dims the bias broadcast along."""
    lead = full.dim() - bias.dim()
    grad = full.sum(dim=tuple(range(lead))) if lead else full
    dims = tuple(i for i, n in enumerate(bias.shape) if n == 1 and grad.shape[i] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.to(bias.dtype)


def _refuse_twice(ctx, *grads):
    raise RuntimeError("tiledispatch::attention_backward cannot differentiate twice: attention has no second "
                       "derivative here; take the gradient once (create_graph=False)")


attention_op.register_autograd(_backward, setup_context=_setup)
attention_backward_op.register_autograd(_refuse_twice, setup_context=lambda ctx, inputs, output: None)
AttentionFunction = eager_twin("AttentionFunction", attention_kernel, _setup, _backward)
