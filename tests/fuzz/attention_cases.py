"""Fuzz cases of `tiledispatch.attention`: MHA/GQA/MQA, fixed-length and varlen, over random masks,
windows, biases, soft-caps, sinks, dropout and layouts, some with gradients; and calls with one
argument made bad."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, replace

import torch

import tiledispatch
from tiledispatch import OpKind
from tiledispatch.ops.attention.dropout import keep_mask

from . import tensors as T
from .attention_mutations import mutations
from .cases import (
    DEVICE, DTYPES, UNIT_ROUNDOFF, Case, Expect, describe_value, pick, some_dispatcher, warmup_for,
)

OPTIONAL = ("bias", "mask", "alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_k")


@dataclass(frozen=True)
class Call:
    args: tuple  # q, k, v
    kwargs: dict
    dtype: torch.dtype
    shape: tuple[int, int, int, int, int, int]  # batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head dim
    lengths: tuple | None = None  # varlen: ((len_q, len_k), ...) per sequence
    grad: bool = False

    def describe(self) -> str:
        parts = [f"{n}={describe_value(t)}" for n, t in zip("qkv", self.args)]
        parts += [f"{key}={describe_value(v)}" for key, v in self.kwargs.items() if v is not None]
        return " ".join(parts) + (" (autograd)" if self.grad else "")


def _layout(rng, rank: int) -> T.Layout:
    """Any strides with a dense head dim; a negated view (a conjugated one has a head-dim stride of 2)."""
    layout = T.random_layout(rng, rank, inner_fixed=True)
    return replace(layout, wrap=T.Wrap.NEG) if layout.wrap is T.Wrap.CONJ_IMAG else layout


def _qkv(rng, gen, shapes, dtype):
    return tuple(T.make(gen, s, dtype, DEVICE, _layout(rng, len(s))) for s in shapes)


def _broadcast_shape(rng, b, hq, sq, skv):
    return rng.choice([(sq, skv), (1, hq, sq, skv), (b, 1, sq, skv), (b, hq, sq, skv), (hq, sq, skv)])


def _features(rng, gen, call_shape, dtype, varlen: bool) -> dict:
    b, hq, _, sq, skv, _ = call_shape
    kw: dict = {}
    if rng.random() < 0.4:
        kw["causal"] = rng.choice([False, True, "top_left", "bottom_right"])
    if rng.random() < 0.2:
        kw["window"] = (rng.choice([-1, rng.randint(0, 8)]), rng.choice([-1, rng.randint(0, 8)]))
        if kw.get("causal") in (True, "top_left") and sq != skv and not varlen:
            kw["causal"] = "bottom_right"  # a window is bottom-right aligned
    if rng.random() < 0.15:
        kw["softcap"] = rng.uniform(2.0, 30.0)
    if rng.random() < 0.2:
        kw["scale"] = rng.uniform(0.05, 0.5)
    if not varlen and rng.random() < 0.15:
        kw["bias"] = T.make(gen, _broadcast_shape(rng, b, hq, sq, skv), dtype, DEVICE)
    if not varlen and rng.random() < 0.15:
        shape = _broadcast_shape(rng, b, hq, sq, skv)
        if rng.random() < 0.5:
            kw["mask"] = (torch.rand(shape, generator=gen) < 0.7).to(DEVICE)
        else:
            kw["mask"] = T.make(gen, shape, dtype, DEVICE, scale=2.0)
    if rng.random() < 0.1:
        shape = rng.choice([(hq,), (b, hq)])
        kw["alibi_slopes"] = (torch.rand(shape, generator=gen) * 0.5).to(DEVICE)
    if rng.random() < 0.1:
        kw["sinks"] = T.make(gen, (hq,), rng.choice([torch.float32, dtype]), DEVICE)
    if rng.random() < 0.4:
        kw["return_lse"] = True
    return kw


def draw(rng: random.Random, gen: torch.Generator) -> Call:
    dtype = rng.choice(DTYPES)
    b, hkv = rng.randint(1, 2), rng.randint(1, 2)
    hq = hkv * rng.choice([1, 1, 2])
    d = rng.choice([32, 32, 64, 80])
    varlen = rng.random() < 0.1
    lengths = None
    if varlen:
        lengths = tuple((rng.randint(1, 16), rng.randint(1, 16)) for _ in range(b))
        sq, skv = max(q for q, _ in lengths), max(k for _, k in lengths)
        shapes = ((sum(q for q, _ in lengths), hq, d), *[(sum(k for _, k in lengths), hkv, d)] * 2)
    else:
        sq, skv = rng.randint(1, 32), rng.randint(1, 32)
        shapes = ((b, hq, sq, d), (b, hkv, skv, d), (b, hkv, skv, d))
    shape = (b, hq, hkv, sq, skv, d)
    args = _qkv(rng, gen, shapes, dtype)
    kwargs = _features(rng, gen, shape, dtype, varlen)
    if varlen:
        for name, index in (("cu_seqlens_q", 0), ("cu_seqlens_k", 1)):
            offsets = [0] + list(itertools.accumulate(n[index] for n in lengths))
            kwargs[name] = torch.tensor(offsets, dtype=torch.int32, device=DEVICE)
    grad = rng.random() < 0.25
    if grad:
        kwargs["deterministic"] = rng.random() < 0.3
    elif not varlen and rng.random() < 0.08:
        kwargs["dropout_p"] = rng.uniform(0.1, 0.5)
        kwargs["dropout_seed"] = rng.randrange(2**31)
    kwargs |= some_dispatcher(rng, OpKind.ATTENTION)
    return Call(args, kwargs, dtype, shape, lengths, grad)


# -- the reference ---------------------------------------------------------------------------------
def _band(sq: int, skv: int, causal, window) -> torch.Tensor:
    """(sq, skv) bool, True where query i may see key j: causal top-left (j <= i) or bottom-right
    (j <= i + skv - sq); a window (left, right) around the bottom-right diagonal, negative unbounded,
    closed on the right at the diagonal when causal too."""
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    keep = torch.ones(sq, skv, dtype=torch.bool)
    causal = bool(causal) if not isinstance(causal, str) else causal
    if window is not None:
        left, right = (min(int(v), sq + skv) for v in window)  # past both lengths: unbounded
        right = 0 if causal else right
        if left >= 0:
            keep &= j >= i + skv - sq - left
        if right >= 0:
            keep &= j <= i + skv - sq + right
    elif causal:
        keep &= j <= i + (skv - sq if causal == "bottom_right" else 0)
    return keep


def _val(t: torch.Tensor) -> torch.Tensor:
    """float64 on the CPU; a float64 leaf of the reference's autograd stays itself."""
    return t if t.dtype == torch.float64 and t.device.type == "cpu" else T.f64(t)


def attend(q, k, v, kw: dict, keep=None, slopes=None):
    """float64 attention of one fixed-length batch, q (B, Hq, Sq, D): (out, lse)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    sq, skv = q.shape[2], k.shape[2]
    scale = float(kw["scale"]) if kw.get("scale") is not None else 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale
    if kw.get("softcap") is not None:
        s = float(kw["softcap"]) * torch.tanh(s / float(kw["softcap"]))
    if kw.get("bias") is not None:
        s = s + _val(kw["bias"])
    mask = kw.get("mask")
    if mask is not None and mask.dtype != torch.bool:
        s = s + T.f64(mask)
    if slopes is not None:
        distance = (torch.arange(sq).unsqueeze(1) + skv - sq - torch.arange(skv).unsqueeze(0)).abs()
        s = s - slopes[:, :, None, None] * distance
    if mask is not None and mask.dtype == torch.bool:
        s = s.masked_fill(~mask.cpu(), -math.inf)
    s = s.masked_fill(~_band(sq, skv, kw.get("causal", False), kw.get("window")), -math.inf)
    sinks = kw.get("sinks")
    if sinks is not None:
        s = torch.cat([s, _val(sinks)[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0).unsqueeze(-1))
    p = torch.where(torch.isinf(lse).unsqueeze(-1), 0.0, p)
    if sinks is not None:
        p = p[..., :-1]
    if keep is not None:
        p = p * keep / (1 - float(kw["dropout_p"]))
    return p @ v, lse


def _slopes(kw, b, hq):
    slopes = kw.get("alibi_slopes")
    return None if slopes is None else T.f64(slopes).expand(b, hq)


def reference_of(call: Call, leaves) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = leaves[:3]
    kw = {**call.kwargs, **leaves[3]}
    b, hq, _, sq, skv, _ = call.shape
    slopes = _slopes(kw, b, hq)
    if call.lengths is None:
        keep = None
        if kw.get("dropout_p"):
            keep = keep_mask(b, hq, sq, skv, float(kw["dropout_p"]), int(kw["dropout_seed"]),
                             int(kw.get("dropout_offset", 0)), device=DEVICE).cpu()
        return attend(q, k, v, kw, keep, slopes)
    outs, lses = [], []
    cq = ck = 0
    for index, (lq, lk) in enumerate(call.lengths):
        qs, ks, vs = (t[start:start + n].transpose(0, 1).unsqueeze(0)
                      for t, start, n in ((q, cq, lq), (k, ck, lk), (v, ck, lk)))
        out, lse = attend(qs, ks, vs, kw, slopes=None if slopes is None else slopes[index:index + 1])
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
        cq, ck = cq + lq, ck + lk
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _grad_of(out: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)


GRAD_LEAVES = ("q", "k", "v", "bias", "sinks")


def reference(call: Call) -> dict[str, torch.Tensor]:
    tensors = dict(zip("qkv", call.args)) | {n: call.kwargs.get(n) for n in ("bias", "sinks")}
    leaves = {n: None if t is None else T.f64(t).requires_grad_(call.grad) for n, t in tensors.items()}
    out, lse = reference_of(call, [leaves["q"], leaves["k"], leaves["v"],
                                   {n: leaves[n] for n in ("bias", "sinks") if leaves[n] is not None}])
    result = {"result": out.detach()}
    if call.kwargs.get("return_lse"):
        result["lse"] = lse.detach()
    if call.grad:
        out.backward(_grad_of(out))
        result |= {f"d{n}": t.grad for n, t in leaves.items() if t is not None}
    return result


def _run(call: Call) -> dict[str, torch.Tensor]:
    tensors = dict(zip("qkv", call.args)) | {n: call.kwargs.get(n) for n in ("bias", "sinks")}
    if call.grad:
        for t in tensors.values():
            if t is not None:
                t.requires_grad_()
    result = tiledispatch.attention(*call.args, **call.kwargs)
    out, lse = result if call.kwargs.get("return_lse") else (result, None)
    outputs = {"result": out} | ({"lse": lse} if lse is not None else {})
    if call.grad:
        out.backward(_grad_of(out).to(device=out.device, dtype=out.dtype))
        outputs |= {f"d{n}": t.grad for n, t in tensors.items() if t is not None}
    return outputs


def _rms(t: torch.Tensor) -> float:
    return float(T.f64(t).pow(2).mean().sqrt()) if t.numel() else 0.0


def gradient_floors(call: Call) -> dict[str, float]:
    """dq's and dk's floors: the size of the terms that dS = P (dP - D) cancels, carried through.

    Where dq or dk is 0 in exact arithmetic (one key: every P is 1 and dP = D), a kernel's D =
    rowsum(dO * O) differs from dP by roundoff, so its gradient is roundoff of terms of size
    |dO| |V| sqrt(dv) (dP's), times the scale and |K| (dq) or |Q| summed over the query rows a key
    meets (dk). A fixed floor cannot tell that roundoff from a bug; the tolerance read against this
    size can, as it does where the gradient is not 0."""
    q, k, v = call.args
    scale = call.kwargs.get("scale")
    if not call.grad or not all(isinstance(t, torch.Tensor) and t.dim() for t in (q, k, v)) or not (
            scale is None or type(scale) in (int, float)):
        return {}  # a call with a bad tensor or scale: the floor of every output
    _, hq, hkv, sq, _, _ = call.shape
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else abs(float(scale))
    dp = _rms(v) * math.sqrt(v.shape[-1]) / math.sqrt(3)  # dO is linspace(-1, 1): RMS 1/sqrt(3)
    # dq's row mixes keys by P (weights summing to 1); dk's sums the rows of every query head of its group
    return {"dq": scale * dp * _rms(k), "dk": scale * dp * _rms(q) * math.sqrt(sq * hq // hkv)}


def _case(ident: str, call: Call, expect: Expect, argument=None, label="") -> Case:
    u = max(UNIT_ROUNDOFF[call.dtype], 4e-6)  # fp32: the softmax's exp and the sums in fp32
    tolerance = {"result": 8 * u, "lse": 1e-4} | {f"d{n}": 32 * u for n in GRAD_LEAVES}
    reads = dict(zip("qkv", call.args)) | {n: call.kwargs[n] for n in OPTIONAL
                                            if isinstance(call.kwargs.get(n), torch.Tensor)}
    reads = {n: t for n, t in reads.items() if isinstance(t, torch.Tensor)}
    return Case(ident=ident, summary=f"{label} {call.describe()}".strip(), run=lambda: _run(call), expect=expect,
                argument=argument, reference=lambda: reference(call), tolerance=tolerance, reads=reads,
                result_dtype=call.dtype, floor=max(1e-3, 16 * u), floors=gradient_floors(call),
                warmup=warmup_for(ident, lambda: _run(_twin(call)), [*call.args, *call.kwargs.values()]))


def _twin(call: Call) -> Call:
    twins = {id(v): T.twin(v) for v in (*call.args, *call.kwargs.values())}  # one twin for a tensor given twice
    return replace(call, args=tuple(twins[id(a)] for a in call.args),
                   kwargs={key: twins[id(v)] for key, v in call.kwargs.items()})


def make_case(ident: str, rng: random.Random, gen: torch.Generator, mutate: bool) -> Case:
    call = draw(rng, gen)
    if not mutate:
        return _case(ident, call, Expect.WORKS)
    argument, label, mutated, expect = pick(rng, mutations(replace(call, grad=False), rng, gen))
    return _case(ident, mutated, expect, argument, label)
