"""The attention reference: the same function in float64 on the CPU, written plainly.

Scores are materialised, each feature applied in the kernels' order (scale, soft-cap,
bias, additive mask, ALiBi, boolean mask, position mask), then softmax with the sink as
one more logit, then dropout with a given keep mask. Its autograd gradients are what the
backward plan is checked against.
"""

from __future__ import annotations

import math

import torch

from ...core.comparison import UNIT_ROUNDOFF, Comparison
from ...core.dtypes import DType
from .operands import AttentionOperands
from .problem import FP8_DTYPES, FP8_OUTPUT, AttentionProblem, UserMask


def _allowed(problem: AttentionProblem, sq: int, skv: int) -> torch.Tensor:
    """(sq, skv) bool: the position mask (causal, window) of one sequence."""
    offset, left, right = problem.band(sq, skv)
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + offset - left
    if right >= 0:
        keep &= j <= i + offset + right
    return keep


def attend(q, k, v, problem: AttentionProblem, *, scale: float, softcap: float = 0.0, bias=None, mask=None,
           slopes=None, sinks=None, keep=None, dropout_p: float = 0.0):
    """One fixed-length batch in float64: q (B, Hq, Sq, D), k/v (B, Hkv, Skv, D) -> (out, lse).

    bias and mask broadcast to (B, Hq, Sq, Skv); slopes is (B, Hq); sinks (Hq,); keep a
    (B, Hq, Sq, Skv) bool dropout mask. Rows that see no key give 0 and LSE -inf.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    sq, skv = q.shape[2], k.shape[2]
    x = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    if bias is not None:
        x = x + bias
    if mask is not None and mask.dtype != torch.bool:
        x = x + mask
    if slopes is not None:
        distance = (torch.arange(sq).unsqueeze(1) + skv - sq - torch.arange(skv).unsqueeze(0)).abs()
        x = x - slopes[:, :, None, None] * distance.to(x.dtype)
    if mask is not None and mask.dtype == torch.bool:
        x = x.masked_fill(~mask, -math.inf)
    x = x.masked_fill(~_allowed(problem, sq, skv), -math.inf)
    if sinks is not None:
        x = torch.cat([x, sinks.to(x.dtype)[None, :, None, None].expand(*x.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(x, dim=-1)
    weights = torch.exp(x - lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(-1))
    weights = torch.where(torch.isinf(lse).unsqueeze(-1), torch.zeros_like(weights), weights)
    if sinks is not None:
        weights = weights[..., :-1]
    if keep is not None:
        weights = weights * keep / (1.0 - dropout_p)
    return torch.matmul(weights, v), lse


def _f64(t):
    return None if t is None else t.detach().to("cpu", torch.float64)


def reference_from(q, k, v, problem: AttentionProblem, *, scale: float, softcap: float = 0.0, bias=None, mask=None,
                   slopes=None, sinks=None, keep=None, dropout_p: float = 0.0, cu_seqlens_q=None, cu_seqlens_k=None):
    """(out, lse) of tensors as given (float64 leaves give autograd gradients), in the kernels' shapes.

    Varlen: q (tokens, heads, d) and cu_seqlens; each sequence is attended on its own
    (out (tokens, heads, d_v), lse (heads, tokens)). `keep` is (batch, heads_q, Sq, Skv).
    """
    common = {"scale": scale, "softcap": softcap, "dropout_p": dropout_p, "sinks": sinks}
    if cu_seqlens_q is None:
        return attend(q, k, v, problem, bias=bias, mask=mask, slopes=slopes, keep=keep, **common)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qs = q[cu_q[b]:cu_q[b + 1]].transpose(0, 1).unsqueeze(0)
        ks = k[cu_k[b]:cu_k[b + 1]].transpose(0, 1).unsqueeze(0)
        vs = v[cu_k[b]:cu_k[b + 1]].transpose(0, 1).unsqueeze(0)
        kb = None if keep is None else keep[b:b + 1, :, :qs.shape[2], :ks.shape[2]]
        out, lse = attend(qs, ks, vs, problem, slopes=None if slopes is None else slopes[b:b + 1], keep=kb, **common)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def reference(ops: AttentionOperands, keep: torch.Tensor | None = None):
    """float64 (out, lse) on the CPU for checked operands."""
    mask = ops.mask
    if mask is not None:
        mask = mask.cpu().bool() if ops.problem.variant.user_mask is UserMask.BOOLEAN else _f64(mask)
    return reference_from(
        _f64(ops.q), _f64(ops.k), _f64(ops.v), ops.problem, scale=ops.scale, softcap=ops.softcap,
        bias=_f64(ops.bias), mask=mask, slopes=_f64(ops.alibi_slopes), sinks=_f64(ops.sinks),
        keep=None if keep is None else keep.cpu().bool(), dropout_p=ops.dropout_p,
        cu_seqlens_q=None if ops.cu_seqlens_q is None else ops.cu_seqlens_q.cpu(),
        cu_seqlens_k=None if ops.cu_seqlens_k is None else ops.cu_seqlens_k.cpu())


RMS_FLOOR = 1e-3


def tolerance(dtype: DType, gradient: bool = False) -> float:
    """Allowed ||got - ref|| / ||ref||: a few roundoffs (P is rounded to the input dtype before P V)."""
    if dtype in FP8_DTYPES:  # the fp8 inputs are exact in the reference: what rounds is the bf16 output
        dtype = FP8_OUTPUT
    base = 8 * max(UNIT_ROUNDOFF[dtype], 1e-6)
    return base * (4 if gradient else 1)


def compare_tensors(got: torch.Tensor, ref: torch.Tensor, tol: float) -> Comparison:
    ref = ref.detach().to("cpu", torch.float64)
    got = got.detach().to("cpu", torch.float64).reshape(ref.shape)
    finite = torch.isfinite(ref)
    unwritten = int((torch.isnan(got) & ~torch.isnan(ref)).sum())
    same_inf = (got == ref) & ~finite
    diff = torch.where(finite, got - ref, torch.where(same_inf, 0.0, math.inf))
    # An RMS floor of 1e-3: a gradient that is 0 in exact arithmetic (one visible key per
    # row) is compared absolutely, not against its own roundoff.
    scale = torch.linalg.vector_norm(torch.where(finite, ref, 0.0)).clamp_min(RMS_FLOOR * ref.numel() ** 0.5)
    rel = float(torch.linalg.vector_norm(diff) / scale) if diff.numel() else 0.0
    return Comparison(float(diff.abs().max()) if diff.numel() else 0.0, rel, tol, unwritten)


def compare(out: torch.Tensor, ops: AttentionOperands, keep: torch.Tensor | None = None) -> Comparison:
    ref, _ = reference(ops, keep)
    return compare_tensors(out, ref, tolerance(ops.problem.dtype))
