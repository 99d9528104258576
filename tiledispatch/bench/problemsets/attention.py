"""Attention problem sets: serving (prefill, decode, chunked and packed prefill), training, random.

Heads and head dims come from the language models of `models.py` (GQA ratios 1 to 8 and 14,
MQA, head dims 32 to 256, DeepSeek's 192/128). Each problem is posed as a framework calls
it: prefill and training with Q, K, V as (batch, seq, heads, dim) tensors seen as
(batch, heads, seq, dim) (``bshd``), decode over a KV cache of (batch, heads, seq, dim)
(``bhsd``), packed prefill as varlen (``thd``); a model with a sliding window passes it on
every call. Training's forward keeps the log-sum-exp for its backward.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ...core.dtypes import DType
from ...ops.attention import AttentionOptions, Direction, check_operands, parse_causal
from ...ops.attention.problem import HEAD_DIMS
from .base import ATTEMPTS, Collector, ProblemSet, Request, log_uniform_int, rng_for
from .models import ATTENTION_ONLY, LLMS, TINY_LLMS, Transformer

DTYPES = ("bf16", "fp16", "fp32", "fp8e4m3")
DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class Shape:
    """One attention call's sizes and mask; `seqlens` (query, key) pairs make it varlen."""

    batch: int
    seqlen_q: int
    seqlen_kv: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    causal: bool | str = False  # False, True (top-left), "bottom_right"
    window: tuple[int, int] | None = None
    layout: str = "bshd"
    seqlens: tuple[tuple[int, int], ...] = ()


def _qkv(s: Shape, dtype) -> tuple[torch.Tensor, ...]:
    def tensor(seq: int, heads: int, dim: int) -> torch.Tensor:
        if s.seqlens:
            return torch.empty(seq, heads, dim, device="meta", dtype=dtype)
        if s.layout == "bshd":
            return torch.empty(s.batch, seq, heads, dim, device="meta", dtype=dtype).transpose(1, 2)
        return torch.empty(s.batch, heads, seq, dim, device="meta", dtype=dtype)

    tokens_q = sum(q for q, _ in s.seqlens) or s.seqlen_q
    tokens_kv = sum(k for _, k in s.seqlens) or s.seqlen_kv
    return (tensor(tokens_q, s.heads_q, s.head_dim), tensor(tokens_kv, s.heads_kv, s.head_dim),
            tensor(tokens_kv, s.heads_kv, s.head_dim_v), tensor(tokens_q, s.heads_q, s.head_dim_v))


def _cumulative(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def attention(s: Shape, dtype: str, direction: str, needs_lse: bool = False):
    """The problem of one attention call of shape `s`, forward or backward, as a real call poses it."""
    torch_dtype = DType.parse(dtype).torch
    q, k, v, out = _qkv(s, torch_dtype)
    options = AttentionOptions(causal=parse_causal(s.causal), window=s.window,
                               needs_lse=needs_lse or direction == "bwd")
    extra = {}
    if s.seqlens:
        extra = {"cu_seqlens_q": _cumulative([a for a, _ in s.seqlens]),
                 "cu_seqlens_k": _cumulative([b for _, b in s.seqlens])}
    if direction == "bwd":
        rows = (s.heads_q, out.shape[0]) if s.seqlens else (s.batch, s.heads_q, s.seqlen_q)
        lse = torch.empty(*rows, device="meta", dtype=torch.float32)
        extra.update(direction=Direction.BACKWARD, out=out, lse=lse, grad_out=torch.empty_like(out))
    return check_operands(q, k, v, options=options, **extra).problem


def _heads(model: Transformer) -> dict:
    return {"heads_q": model.heads, "heads_kv": model.kv_heads, "head_dim": model.head_dim,
            "head_dim_v": model.head_dim_v or model.head_dim}


def _window(model: Transformer) -> tuple[int, int] | None:
    return (model.window, 0) if model.window else None


@dataclass(frozen=True)
class Serving:
    """The sizes a serving set sweeps: prefill lengths and batches, decode cache lengths and batches."""

    prefill: tuple[int, ...] = (128, 255, 512, 1000, 2048, 4096, 8192, 16384)
    prefill_batches: tuple[int, ...] = (1, 4, 16)
    prefill_tokens: int = 65536  # the most tokens a prefill batch holds
    decode: tuple[int, ...] = (128, 512, 1000, 2048, 4096, 8192, 16384, 32768)
    decode_batches: tuple[int, ...] = (1, 8, 32, 128)
    decode_tokens: int = 1 << 20  # the most cached tokens a decode batch reads
    chunks: tuple[tuple[int, int], ...] = ((512, 2048), (2048, 8192))  # (chunk, cached + chunk)
    packs: tuple[tuple[int, ...], ...] = ((100, 1000, 37, 2047), (512,) * 8)  # packed prefill lengths
    # An encoder's (ViT's) tokens: 224x224 by patches of 16 and 14, 384x384 by 16, 512x512 by 16, plus the class token.
    encoder: tuple[int, ...] = (197, 257, 577, 1025)


def _serving_shapes(model: Transformer, sizes: Serving):
    heads, window = _heads(model), _window(model)
    causal = model.causal
    for seq in sizes.prefill if model.causal else sizes.encoder:
        for batch in sizes.prefill_batches:
            if batch * seq <= sizes.prefill_tokens:
                yield "prefill", Shape(batch, seq, seq, **heads, causal=causal, window=window)
    if not model.causal:
        return
    for cached in sizes.decode:
        for batch in sizes.decode_batches:
            if batch * cached <= sizes.decode_tokens:
                yield "decode", Shape(batch, 1, cached, **heads, causal="bottom_right" if window else False,
                                      window=window, layout="bhsd")
    for chunk, total in sizes.chunks:
        yield "chunk", Shape(1, chunk, total, **heads, causal="bottom_right", window=window)
    for pack in sizes.packs:
        yield "packed", Shape(len(pack), max(pack), max(pack), **heads, causal=True, window=window,
                              layout="thd", seqlens=tuple((n, n) for n in pack))


def serving(request: Request, out: Collector, models: tuple[Transformer, ...], sizes: Serving) -> None:
    """Inference forwards of each model: prefill, decode, chunked prefill over a cache, packed prefill."""
    for model in models:
        for phase, shape in _serving_shapes(model, sizes):
            out.pose(f"{model.name} {phase} {shape}", lambda shape=shape: attention(shape, request.dtype, "fwd"))


def training(request: Request, out: Collector, models: tuple[Transformer, ...], seqs: tuple[int, ...],
             batches: tuple[int, ...], max_tokens: int) -> None:
    """Training's forward (keeping the LSE) or backward at each sequence length and batch within `max_tokens`
    (an encoder at its own token counts)."""
    for model in models:
        for seq in seqs if model.causal else Serving.encoder:
            for batch in batches:
                if batch * seq > max_tokens:
                    continue
                shape = Shape(batch, seq, seq, **_heads(model), causal=model.causal, window=_window(model))
                out.pose(f"{model.name} train {shape}",
                         lambda shape=shape: attention(shape, request.dtype, request.direction, needs_lse=True))


@dataclass(frozen=True)
class RandomBounds:
    batch: int = 32
    heads_kv: int = 32
    seqlen_q: int = 16384
    seqlen_kv: int = 32768
    head_dims: tuple[int, ...] = HEAD_DIMS
    max_flops: float = 2.0**42


def _random_shape(rng, bounds: RandomBounds) -> Shape:
    d = rng.choice(bounds.head_dims)
    dv = 128 if d == 192 and rng.random() < 0.5 else d
    heads_kv = log_uniform_int(rng, 1, bounds.heads_kv)
    sq = log_uniform_int(rng, 1, bounds.seqlen_q)
    skv = sq if rng.random() < 0.5 else log_uniform_int(rng, 1, bounds.seqlen_kv)
    mask = rng.choice(("none", "causal", "bottom_right", "window"))
    causal = {"none": False, "causal": True}.get(mask, "bottom_right")
    window = (log_uniform_int(rng, 1, 4096), rng.choice((0, 0, 16))) if mask == "window" else None
    if causal is True and sq > skv:
        causal = "bottom_right"
    return Shape(log_uniform_int(rng, 1, bounds.batch), sq, max(sq, skv) if causal == "bottom_right" else skv,
                 heads_kv * rng.choice((1, 1, 2, 4, 8)), heads_kv, d, dv, causal, window,
                 rng.choice(("bshd", "bhsd")))


def random_shapes(request: Request, out: Collector, count: int, bounds: RandomBounds) -> None:
    """`count` random attentions: batch, heads, lengths log-uniform; every head dim; each mask kind."""
    rng = rng_for(request, "attention-random")
    start = len(out.problems)
    for _ in range(ATTEMPTS * count):
        if len(out.problems) - start >= count:
            break
        s = _random_shape(rng, bounds)
        if 4 * s.batch * s.heads_q * s.seqlen_q * s.seqlen_kv * max(s.head_dim, s.head_dim_v) > bounds.max_flops:
            continue
        needs_lse = rng.random() < 0.5
        out.pose(f"random {s}", lambda: attention(s, request.dtype, request.direction, needs_lse))


def _set(name: str, directions: tuple[str, ...], description: str, generate) -> ProblemSet:
    return ProblemSet(name, "attention", directions, DTYPES, description, generate, forward_only=("fp8e4m3",))


TINY_SERVING = Serving(prefill=(17,), prefill_batches=(2,), decode=(40,), decode_batches=(3,), chunks=((8, 24),),
                       packs=((5, 12),))
MODELS = LLMS + ATTENTION_ONLY

SETS = (
    _set("attention-serving", ("fwd",), "inference forwards of 16 model attentions: prefill 128..16384 at batch "
         "1/4/16, decode over caches of 128..32768 at batch 1..128, chunked and packed prefill",
         functools.partial(serving, models=MODELS, sizes=Serving())),
    _set("attention-serving-small", ("fwd",), "attention-serving's phases for a tiny model",
         functools.partial(serving, models=TINY_LLMS[:1], sizes=TINY_SERVING)),
    _set("attention-training", DIRECTIONS, "training forward (with LSE) and backward of 16 model attentions, "
         "sequences 197..16384, up to 65536 tokens a batch",
         functools.partial(training, models=MODELS, seqs=(197, 512, 1024, 2048, 4096, 8192, 16384),
                           batches=(1, 2, 4, 8, 16, 64), max_tokens=65536)),
    _set("attention-training-small", DIRECTIONS, "attention-training for a tiny model at 16 and 33 tokens",
         functools.partial(training, models=TINY_LLMS[:1], seqs=(16, 33), batches=(1, 2), max_tokens=64)),
    _set("attention-random", DIRECTIONS, "300 random attentions: log-uniform batch, heads, lengths; every head "
         "dim, GQA ratio and mask", functools.partial(random_shapes, count=300, bounds=RandomBounds())),
    _set("attention-random-small", DIRECTIONS, "5 tiny random attentions",
         functools.partial(random_shapes, count=5, bounds=RandomBounds(2, 2, 24, 40, (32, 64), 2.0**22))),
)
