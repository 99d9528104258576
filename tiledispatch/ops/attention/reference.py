"""The attention reference: the same function in float64, written plainly.

Scores are materialised, each feature applied in the kernels' order (scale, soft-cap,
bias, additive mask, ALiBi, boolean mask, position mask), then softmax with the sink as
one more logit, then dropout with a given keep mask. Its autograd gradients are what the
backward plan is checked against. A long problem is attended a few heads at a time
(`head_chunks`), so its scores never outgrow MAX_SCORES elements: a 16k-token training
problem's at once would take 70 GB.
"""

from __future__ import annotations

import math

import torch

from ...core.comparison import UNIT_ROUNDOFF, Comparison
from ...core.dtypes import DType
from .operands import AttentionOperands
from .problem import FP8_DTYPES, FP8_OUTPUT, AttentionProblem, UserMask


# The most score elements one chunk of the reference materialises (float64: 2 GiB, and a few
# temporaries of that size beside it).
MAX_SCORES = 1 << 28


def _allowed(problem: AttentionProblem, sq: int, skv: int, device=None) -> torch.Tensor:
    """(sq, skv) bool: the position mask (causal, window) of one sequence."""
    offset, left, right = problem.band(sq, skv)
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(skv, device=device).unsqueeze(0)
    keep = torch.ones(sq, skv, dtype=torch.bool, device=device)
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
    batch, heads_q, sq, _ = q.shape
    heads_kv, skv = k.shape[1], k.shape[2]
    # Query head h reads key head h // group: each key head's group of query heads is one matrix of
    # group x Sq rows, so K and V are never copied per query head (a decode of 64 query heads over
    # 8 key heads of 32k tokens would copy 64 GiB of float64).
    grouped = (batch, heads_kv, heads_q // heads_kv * sq)
    x = torch.matmul(q.reshape(*grouped, q.shape[-1]), k.transpose(-1, -2)).reshape(batch, heads_q, sq, skv) * scale
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    if bias is not None:
        x = x + bias
    if mask is not None and mask.dtype != torch.bool:
        x = x + mask
    if slopes is not None:
        positions = torch.arange(max(sq, skv), device=x.device)
        distance = (positions[:sq].unsqueeze(1) + skv - sq - positions[:skv].unsqueeze(0)).abs()
        x = x - slopes[:, :, None, None] * distance.to(x.dtype)
    if mask is not None and mask.dtype == torch.bool:
        x = x.masked_fill(~mask, -math.inf)
    x = x.masked_fill(~_allowed(problem, sq, skv, x.device), -math.inf)
    if sinks is not None:
        x = torch.cat([x, sinks.to(x.dtype)[None, :, None, None].expand(*x.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(x, dim=-1)
    weights = torch.exp(x - lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(-1))
    weights = torch.where(torch.isinf(lse).unsqueeze(-1), torch.zeros_like(weights), weights)
    if sinks is not None:
        weights = weights[..., :-1]
    if keep is not None:
        weights = weights * keep / (1.0 - dropout_p)
    out = torch.matmul(weights.reshape(*grouped, skv), v)
    return out.reshape(batch, heads_q, sq, v.shape[-1]), lse


def head_chunks(batch: int, heads_q: int, heads_kv: int, sq: int, skv: int):
    """(batches, query heads, key heads) slices that cover a problem, each within MAX_SCORES
    score elements where one head allows it: whole key-head groups, or part of one group (its
    query heads all read one key head)."""
    if batch * heads_q * sq * skv <= MAX_SCORES:
        yield slice(0, batch), slice(0, heads_q), slice(0, heads_kv)
        return
    group = heads_q // heads_kv
    fits = max(1, MAX_SCORES // (sq * skv))
    step = fits // group * group if fits >= group else max(d for d in range(1, fits + 1) if group % d == 0)
    for b in range(batch):
        for h in range(0, heads_q, step):
            end = min(h + step, heads_q)
            kv = slice(h // group, -(-end // group)) if step >= group else slice(h // group, h // group + 1)
            yield slice(b, b + 1), slice(h, end), kv


def _part(t, shape, rows: slice, heads: slice):
    """A chunk of a tensor that broadcasts to `shape` (batch, heads first): a view."""
    return None if t is None else t.expand(shape)[rows, heads]


def _fixed(q, k, v, problem: AttentionProblem, *, bias, mask, slopes, keep, sinks, **common):
    """`attend` over `head_chunks`, the chunks' outputs and LSEs joined."""
    batch, heads_q, sq, _ = q.shape
    skv = k.shape[2]
    full = (batch, heads_q, sq, skv)
    chunks = list(head_chunks(batch, heads_q, k.shape[1], sq, skv))
    if len(chunks) == 1:
        return attend(q, k, v, problem, bias=bias, mask=mask, slopes=slopes, keep=keep, sinks=sinks, **common)
    outs: dict[int, list] = {}
    lses: dict[int, list] = {}
    for rows, heads, kv in chunks:
        out, lse = attend(q[rows, heads], k[rows, kv], v[rows, kv], problem, bias=_part(bias, full, rows, heads),
                          mask=_part(mask, full, rows, heads), slopes=_part(slopes, (batch, heads_q), rows, heads),
                          keep=_part(keep, full, rows, heads), sinks=None if sinks is None else sinks[heads],
                          **common)
        outs.setdefault(rows.start, []).append(out)
        lses.setdefault(rows.start, []).append(lse)
    return (torch.cat([torch.cat(parts, 1) for parts in outs.values()], 0),
            torch.cat([torch.cat(parts, 1) for parts in lses.values()], 0))


def gradients(q, k, v, grad_out, problem: AttentionProblem, *, scale: float, softcap: float = 0.0, sinks=None):
    """float64 (dq, dk, dv) of a fixed-length problem without a mask, bias or dropout, by autograd
    over one `head_chunks` chunk at a time (a whole problem's graph keeps every chunk's scores)."""
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    batch, heads_q, sq, _ = q.shape
    for rows, heads, kv in head_chunks(batch, heads_q, k.shape[1], sq, k.shape[2]):
        leaves = [t[rows, part].detach().requires_grad_(True) for t, part in ((q, heads), (k, kv), (v, kv))]
        out, _ = attend(*leaves, problem, scale=scale, softcap=softcap,
                        sinks=None if sinks is None else sinks[heads])
        dq, dk, dv = torch.autograd.grad(out, leaves, grad_out[rows, heads])
        grads[0][rows, heads] += dq
        grads[1][rows, kv] += dk
        grads[2][rows, kv] += dv
    return tuple(grads)


def _f64(t, device="cpu"):
    return None if t is None else t.detach().to(device, torch.float64)


def reference_from(q, k, v, problem: AttentionProblem, *, scale: float, softcap: float = 0.0, bias=None, mask=None,
                   slopes=None, sinks=None, keep=None, dropout_p: float = 0.0, cu_seqlens_q=None, cu_seqlens_k=None):
    """(out, lse) of tensors as given (float64 leaves give autograd gradients), in the kernels' shapes.

    Varlen: q (tokens, heads, d) and cu_seqlens; each sequence is attended on its own
    (out (tokens, heads, d_v), lse (heads, tokens)). `keep` is (batch, heads_q, Sq, Skv).
    """
    common = {"scale": scale, "softcap": softcap, "dropout_p": dropout_p, "sinks": sinks}
    if cu_seqlens_q is None:
        return _fixed(q, k, v, problem, bias=bias, mask=mask, slopes=slopes, keep=keep, **common)
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


def reference(ops: AttentionOperands, keep: torch.Tensor | None = None, device="cpu"):
    """float64 (out, lse) on `device` for checked operands."""
    mask = ops.mask
    if mask is not None:
        mask = mask.to(device).bool() if ops.problem.variant.user_mask is UserMask.BOOLEAN else _f64(mask, device)
    return reference_from(
        _f64(ops.q, device), _f64(ops.k, device), _f64(ops.v, device), ops.problem, scale=ops.scale,
        softcap=ops.softcap, bias=_f64(ops.bias, device), mask=mask, slopes=_f64(ops.alibi_slopes, device),
        sinks=_f64(ops.sinks, device), keep=None if keep is None else keep.to(device).bool(),
        dropout_p=ops.dropout_p,
        cu_seqlens_q=None if ops.cu_seqlens_q is None else ops.cu_seqlens_q.cpu(),
        cu_seqlens_k=None if ops.cu_seqlens_k is None else ops.cu_seqlens_k.cpu())


RMS_FLOOR = 1e-3


def tolerance(dtype: DType, gradient: bool = False) -> float:
    """Allowed ||got - ref|| / ||ref||: a few roundoffs (P is rounded to the input dtype before P V)."""
    if dtype in FP8_DTYPES:  # the fp8 inputs are exact in the reference: what rounds is the bf16 output
        dtype = FP8_OUTPUT
    base = 8 * max(UNIT_ROUNDOFF[dtype], 1e-6)
    return base * (4 if gradient else 1)


def compare_tensors(got: torch.Tensor, ref: torch.Tensor, tol: float, floor: float = RMS_FLOOR) -> Comparison:
    # On the reference's device: a sweep's float64 reference is on the GPU, where comparing a 1 GB
    # output takes milliseconds (a copy of both to the CPU takes seconds a kernel).
    ref = ref.detach().to(torch.float64)
    got = got.detach().to(ref.device, torch.float64).reshape(ref.shape)
    finite = torch.isfinite(ref)
    unwritten = int((torch.isnan(got) & ~torch.isnan(ref)).sum())
    same_inf = (got == ref) & ~finite
    diff = torch.where(finite, got - ref, torch.where(same_inf, 0.0, math.inf))
    # An RMS floor of 1e-3: a gradient that is 0 in exact arithmetic (one visible key per
    # row) is compared absolutely, not against its own roundoff. `floor` raises it where the
    # error scales with something other than the values (the LSE's: its scores, `compare_lse`).
    least = max(floor, RMS_FLOOR) * ref.numel() ** 0.5
    scale = torch.linalg.vector_norm(torch.where(finite, ref, 0.0)).clamp_min(least)
    rel = float(torch.linalg.vector_norm(diff) / scale) if diff.numel() else 0.0
    return Comparison(float(diff.abs().max()) if diff.numel() else 0.0, rel, tol, unwritten)


LSE_TOLERANCE = 1e-5


def compare_lse(got: torch.Tensor, ref: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scale: float,
                scale_q: torch.Tensor | None = None, scale_k: torch.Tensor | None = None) -> Comparison:
    """The LSE against the reference, relative to no less than its scores' size (the RMS of scale x |q| x
    |k| over rows, fp8's dequantization scales in): an LSE's error is its scores' roundoff, which scales
    with them, while the LSE itself can cancel to near 0 (one key whose fp32 score was 0.045 read 1.1e-6
    of roundoff, 2.5e-5 of it)."""
    def rms_norm(t: torch.Tensor, dequantize: torch.Tensor | None) -> float:
        norm = float(torch.linalg.vector_norm(t.detach().float(), dim=-1).square().mean().sqrt())
        return norm * (1.0 if dequantize is None else abs(float(dequantize.reshape(-1)[0])))

    return compare_tensors(got, ref, LSE_TOLERANCE, floor=abs(scale) * rms_norm(q, scale_q) * rms_norm(k, scale_k))


def compare(out: torch.Tensor, ops: AttentionOperands, keep: torch.Tensor | None = None) -> Comparison:
    ref, _ = reference(ops, keep)
    return compare_tensors(out, ref, tolerance(ops.problem.dtype))
