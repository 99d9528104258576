"""Fused multi-head attention, forward and backward, in fp16, bf16 and fp32.

Q (batch, heads_q, seqlen_q, d_qk), K (batch, heads_kv, seqlen_kv, d_qk), V (..., d_v),
any strides with a contiguous head dim (BHSD or BSHD), or packed (tokens, heads, d) with
cumulative sequence offsets (varlen). Masks (causal top-left or bottom-right, sliding
window, a boolean or additive tensor), bias, ALiBi, soft-capping, sinks and dropout.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ...core.dispatcher import dispatcher_or_default
from ...core.hostcost import capturing
from ...core.op import OpDefinition, register
from .config import AnyAttentionConfig, AttentionConfig, Family, VendorConfig
from . import families  # noqa: F401  (registers the kernel families)
from . import fastpath
from .arguments import parse_causal, parse_window
from .function import bound_forward, forward, read_call, recorded
from .inputs import check_output, reference_output, tuning_operands
from .native import native_decision, native_forward
from .operands import AttentionOperands, AttentionOptions, check_operands
from .plan import AttentionGrads, AttentionResult, kernel_units, plan
from .problem import (
    KIND,
    AttentionProblem,
    AttentionVariant,
    Direction,
    Layout,
    MaskKind,
    UserMask,
    Window,
    ranking_problem,
)
from .ranking import rule_score
from .rules import AttentionRule, auto_correct, support_key, supports, validate
from .rulesets import RULE_SETS, problem_class

OP = register(OpDefinition(
    kind=KIND,
    problem_type=AttentionProblem,
    config_type=AnyAttentionConfig,
    validate=validate,
    auto_correct=auto_correct,
    rule_sets=RULE_SETS,
    supports=supports,
    kernel_units=kernel_units,
    specialization_of=lambda problem: problem.variant,
    # Built ahead of time: plain and causal attention, with aligned operands.
    specializations=(AttentionVariant(), AttentionVariant(band=True)),
    plan=plan,
    rule_score=rule_score,
    family_of=lambda config: config.family.value,
    is_vendor=lambda config: config.family.is_vendor,
    dtype_of=lambda config: config.dtype.value,
    tuning_operands=tuning_operands,
    problem_class=problem_class,
    reference=reference_output,
    check=check_output,
    support_key=support_key,
    ranking_problem=ranking_problem,
))


def attention(q, k, v, *, causal=False, window=None, mask=None, bias=None, alibi_slopes=None, softcap=None,
              sinks=None, dropout_p: float = 0.0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
              return_lse: bool = False, deterministic: bool = False, dropout_seed: int | None = None,
              dropout_offset: int = 0, kernel: str | None = None, backward_kernel: str | None = None,
              dispatcher=None, scale_q=None, scale_k=None, scale_v=None):
    """softmax(mask(scale * q k^T + bias)) v by the fastest registered kernels, differentiable.

    causal: False, True (top-left, as torch SDPA), "top_left" or "bottom_right" (the last
    query on the last key, as FlashAttention). window: (left, right) keys beside the
    bottom-right diagonal, -1 unbounded. mask: bool (True attends) or additive, and bias
    (differentiable), both broadcastable to (batch, heads_q, seqlen_q, seqlen_kv).
    alibi_slopes: (heads_q,) or (batch, heads_q). softcap: cap * tanh(s / cap). sinks:
    (heads_q,) logits that take part in the softmax (differentiable). dropout_p with
    `dropout_seed` (the Philox key, an integer in [0, 2**63 - 1]; default: drawn from torch's
    generator, so torch.manual_seed repeats it) and `dropout_offset` (its first counter).
    Sequences of up to problem.MAX_SEQLEN (2**30 - 1024) positions; negated views are read
    by value.
    Varlen: q (tokens, heads_q, d) with cu_seqlens_q/k (batch + 1,) int32.
    Returns out, or (out, lse) with the natural-log LSE (batch, heads_q, seqlen_q) or
    (heads_q, tokens). `kernel`/`backward_kernel` force kernels by name; `dispatcher`
    replaces the default one. `deterministic` makes the backward bit-reproducible.
    fp8 (torch.float8_e4m3fn) q, k, v: inference only, with per-tensor dequantization scales
    `scale_q/k/v` (one-element float32 tensors, default 1; q's values are q * scale_q); the
    output is bf16. Masks and windows, soft-cap, sinks and GQA; no mask or bias tensor,
    ALiBi, dropout or varlen.
    """
    plain = None
    if (type(dropout_p) in (float, int) and dropout_p == 0 and return_lse is False and dropout_seed is None
            and type(dropout_offset) is int and dropout_offset == 0 and cu_seqlens_q is None and cu_seqlens_k is None
            and scale_q is None and scale_k is None and scale_v is None and not torch.compiler.is_dynamo_compiling()):
        plain = fastpath.plain_key(q, k, v, (bias, mask, alibi_slopes, sinks), causal, window, scale, softcap,
                                   deterministic, kernel, backward_kernel)
    if plain is not None:  # a plain call: its bound forward or cuDNN's own op, found under the raw options
        records = plain[1]  # autograd records the call
        found = dispatcher_or_default(dispatcher, q).memo(plain, lambda: _plain(
            q, k, v, bias, sinks, mask, alibi_slopes, causal, window, scale, softcap, deterministic, kernel,
            backward_kernel, dispatcher, records))
        if records:
            if found is not None and not (found.weighed and capturing()):
                return found(q, k, v)
        elif found is not None:
            return found(q, k, v, bias, mask, alibi_slopes, sinks, 0, 0).out
    call, grad, with_lse = read_call(
        q, k, v, bias, sinks, mask, alibi_slopes, causal=causal, window=window, scale=scale, softcap=softcap, dropout_p=dropout_p,
        dropout_seed=dropout_seed, dropout_offset=dropout_offset, return_lse=return_lse,
        deterministic=deterministic, kernel=kernel, backward_kernel=backward_kernel, dispatcher=dispatcher)
    tensors = {"bias": bias, "sinks": sinks, "mask": mask, "alibi_slopes": alibi_slopes,
               "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
               "scale_q": scale_q, "scale_k": scale_k, "scale_v": scale_v}
    if grad:  # the op's kernel binds its own call, unless cuDNN's own op takes it (native.py)
        native = None
        if (not with_lse and bias is None and mask is None and alibi_slopes is None and sinks is None
                and cu_seqlens_q is None and cu_seqlens_k is None and scale_q is None and scale_k is None
                and scale_v is None):
            native = native_forward(q, k, v, call)
        if native is not None:
            return native(q, k, v)
        out, lse = recorded(q, k, v, bias, sinks, mask, alibi_slopes, cu_seqlens_q, cu_seqlens_k, call)
    else:
        call = replace(call, bound=bound_forward(call.dispatcher, q, k, v, tensors, call.options, call.kernel))
        result = forward(call, q, k, v, tensors)
        out, lse = result.out, result.lse
    return (out, lse) if with_lse else out


def _plain(q, k, v, bias, sinks, mask, alibi_slopes, causal, window, scale, softcap, deterministic, kernel,
           backward_kernel, dispatcher, records: bool):
    """What a plain call runs, every option read and checked as `attention()` reads them (the backward
    kernel too, unused as it may be); None where the checked path takes it. Recorded (no bias,
    mask, ALiBi or sinks): cuDNN's own op, whether a capture runs the twin instead asked on each
    call (`CudnnAttention.weighed`). Inference: the signature's bound forward."""
    call, _, _ = read_call(q, k, v, bias, sinks, mask, alibi_slopes, causal=causal, window=window, scale=scale,
                           softcap=softcap, dropout_p=0.0, dropout_seed=None, dropout_offset=0, return_lse=False,
                           deterministic=deterministic, kernel=kernel, backward_kernel=backward_kernel,
                           dispatcher=dispatcher)
    if records:
        return native_decision(q, k, v, call)
    tensors = {"bias": bias, "sinks": sinks, "mask": mask, "alibi_slopes": alibi_slopes, "cu_seqlens_q": None,
               "cu_seqlens_k": None, "scale_q": None, "scale_k": None, "scale_v": None}
    return bound_forward(call.dispatcher, q, k, v, tensors, call.options, call.kernel)


__all__ = [
    "OP",
    "AttentionConfig",
    "AttentionGrads",
    "AttentionOperands",
    "AttentionOptions",
    "AttentionProblem",
    "AttentionResult",
    "AttentionRule",
    "AttentionVariant",
    "Direction",
    "Family",
    "Layout",
    "MaskKind",
    "UserMask",
    "VendorConfig",
    "Window",
    "attention",
    "auto_correct",
    "check_operands",
    "supports",
    "validate",
]
