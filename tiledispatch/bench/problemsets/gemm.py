"""GEMM problem sets: language-model Linears, MoE experts, square, odd and deep-K shapes, random shapes.

A Linear's forward is ``F.linear(x, W)``: A the activations (tokens x in, row-major), B the
weight's transposed view (in x out, column-major), C row-major: layout ``rcr``. Its
backward poses ``dX = dY @ W`` (``rrr``) and ``dW^T = X^T @ dY`` (``crr``, tokens as K),
as the GEMM's autograd does. A plain ``torch.mm`` of contiguous matrices is ``rrr``.
"""

from __future__ import annotations

import functools
import math

import torch

from ...ops.gemm import GemmTypes, check_operands
from .base import ATTEMPTS, Collector, ProblemSet, Request, log_uniform_int, rng_for
from .models import LLMS, MOES, TINY_LLMS, TINY_MOES, TINY_TOKENS, TOKENS, TRAINING_TOKENS, Moe, Transformer

DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8e4m3")
DIRECTIONS = ("forward",)


def _matrix(rows: int, cols: int, order: str, lead: tuple[int, ...], dtype) -> torch.Tensor:
    """A rows x cols (meta) matrix: ``r`` row-major, ``c`` the transposed view of a row-major cols x rows."""
    if order == "r":
        return torch.empty(*lead, rows, cols, device="meta", dtype=dtype)
    return torch.empty(*lead, cols, rows, device="meta", dtype=dtype).transpose(-1, -2)


def gemm(m: int, n: int, k: int, dtype: str, layout: str = "rcr", *, batch: int = 1, bias: bool = False,
         activation: str = "none"):
    """The problem of ``A @ B`` (+ bias, activation) as a real call poses it: A (M x K) and B (K x N)
    laid out as `layout`'s first two letters say, a contiguous C allocated by the op."""
    types = GemmTypes.parse(dtype, allow_tf32=dtype == "tf32")
    lead = (batch,) if batch > 1 else ()
    a = _matrix(m, k, layout[0], lead, types.a.torch)
    b = _matrix(k, n, layout[1], lead, types.b.torch)
    bias_tensor = torch.empty(n, device="meta", dtype=types.c.torch) if bias else None
    return check_operands(a, b, bias=bias_tensor, activation=None if activation == "none" else activation,
                          out_dtype=types.c.torch, allow_tf32=types.allow_tf32).problem


def _linear(out: Collector, what: str, tokens: int, n: int, k: int, dtype: str, bias: bool, activation: str,
            layout: str = "rcr", batch: int = 1) -> None:
    out.pose(f"{what} tokens={tokens}", lambda: gemm(tokens, n, k, dtype, layout, batch=batch, bias=bias,
                                                    activation=activation))


def llm(request: Request, out: Collector, models: tuple[Transformer, ...], tokens: tuple[int, ...]) -> None:
    """Every Linear of each model, inference forward (``rcr``), at each token count."""
    for model in models:
        for layer, n, k, bias, activation in model.linears():
            for t in tokens:
                _linear(out, f"{model.name}.{layer}", t, n, k, request.dtype, bias, activation)


def llm_training(request: Request, out: Collector, models: tuple[Transformer, ...],
                 tokens: tuple[int, ...]) -> None:
    """The two backward GEMMs of every Linear at training token counts: dX (``rrr``) and dW^T (``crr``)."""
    for model in models:
        for layer, n, k, _, _ in model.linears():
            for t in tokens:
                out.pose(f"{model.name}.{layer}.dx tokens={t}", lambda: gemm(t, k, n, request.dtype, "rrr"))
                out.pose(f"{model.name}.{layer}.dw tokens={t}", lambda: gemm(k, n, t, request.dtype, "crr"))


def _per_expert(tokens: int, moe: Moe) -> tuple[int, ...]:
    """Rows an expert receives: the even share of the routed tokens, and a hot expert's (4x, at most all)."""
    even = max(1, math.ceil(tokens * moe.top_k / moe.experts))
    return tuple(sorted({even, min(tokens, 4 * even)}))


def moe(request: Request, out: Collector, moes: tuple[Moe, ...], tokens: tuple[int, ...],
        batched_tokens: tuple[int, ...]) -> None:
    """Router, expert and shared-expert GEMMs over token counts; a few as one batched GEMM over every expert."""
    d = request.dtype
    for spec in moes:
        for t in tokens:
            _linear(out, f"{spec.name}.router", t, spec.experts, spec.hidden, d, False, "none")
            for rows in _per_expert(t, spec):
                _linear(out, f"{spec.name}.expert.gate_up", rows, 2 * spec.expert_intermediate, spec.hidden, d,
                        False, "none")
                _linear(out, f"{spec.name}.expert.down", rows, spec.hidden, spec.expert_intermediate, d, False,
                        "none")
            if spec.shared_intermediate:
                _linear(out, f"{spec.name}.shared.gate_up", t, 2 * spec.shared_intermediate, spec.hidden, d,
                        False, "none")
                _linear(out, f"{spec.name}.shared.down", t, spec.hidden, spec.shared_intermediate, d, False, "none")
        for t in batched_tokens:
            rows = max(1, math.ceil(t * spec.top_k / spec.experts))
            _linear(out, f"{spec.name}.experts.bmm", rows, 2 * spec.expert_intermediate, spec.hidden, d, False,
                    "none", batch=spec.experts)


SQUARE = (64, 127, 128, 255, 256, 333, 512, 1000, 1024, 2047, 2048, 3000, 4093, 4096, 8192, 16384)
ODD = ((17, 257, 1023), (97, 1031, 509), (333, 777, 999), (1021, 2053, 4099), (4093, 4091, 4099),
       (5, 12289, 769), (8191, 127, 8193), (1, 50257, 768), (2, 3, 5), (49, 97, 193))
DEEP_K = tuple((mn, mn, k) for mn in (16, 64, 128, 256, 512) for k in (8192, 32768, 131072))
BATCHED = ((8, 512, 512, 64), (16, 1024, 1024, 1024), (4, 4096, 4096, 128), (64, 128, 128, 128),
           (12, 197, 64, 197), (32, 1, 4096, 128))


def shapes(request: Request, out: Collector, square: tuple[int, ...], odd: tuple, deep_k: tuple,
           batched: tuple) -> None:
    """Square sizes (powers of two and not), odd (prime-ish) triples and deep K in both ``rrr`` and ``rcr``;
    batched products (``torch.bmm`` of contiguous stacks)."""
    d = request.dtype
    triples = [(s, s, s) for s in square] + list(odd) + list(deep_k)
    for layout in ("rrr", "rcr"):
        for m, n, k in triples:
            out.pose(f"{layout} {m}x{n}x{k}", lambda m=m, n=n, k=k, layout=layout: gemm(m, n, k, d, layout))
    for batch, m, n, k in batched:
        out.pose(f"bmm {batch}x{m}x{n}x{k}", lambda batch=batch, m=m, n=n, k=k: gemm(m, n, k, d, "rrr", batch=batch))


RANDOM_LAYOUTS = ("rcr", "rrr", "crr", "ccr")


def random_shapes(request: Request, out: Collector, count: int, high: int, max_flops: float) -> None:
    """`count` shapes with M, N, K log-uniform in [1, high] (K up to 4x), some batched, some biased."""
    rng = rng_for(request, "gemm-random")
    start = len(out.problems)
    for _ in range(ATTEMPTS * count):
        if len(out.problems) - start >= count:
            break
        m, n, k = log_uniform_int(rng, 1, high), log_uniform_int(rng, 1, high), log_uniform_int(rng, 1, 4 * high)
        batch = log_uniform_int(rng, 2, 16) if rng.random() < 0.1 else 1
        if 2 * batch * m * n * k > max_flops:
            continue
        layout, bias = rng.choice(RANDOM_LAYOUTS), rng.random() < 0.2
        out.pose(f"random {batch}x{m}x{n}x{k} {layout}",
                 lambda: gemm(m, n, k, request.dtype, layout, batch=batch, bias=bias))


def _set(name: str, description: str, generate) -> ProblemSet:
    return ProblemSet(name, "gemm", DIRECTIONS, DTYPES, description, generate)


SETS = (
    _set("gemm-llm", "every Linear of 12 language models (Llama 2/3, Mistral, Qwen2.5, Gemma, Phi, GPT-2), rcr, "
         "at 16 token counts 1..16384", functools.partial(llm, models=LLMS, tokens=TOKENS)),
    _set("gemm-llm-small", "gemm-llm's layers of two tiny models at 1 and 17 tokens",
         functools.partial(llm, models=TINY_LLMS[:1], tokens=TINY_TOKENS)),
    _set("gemm-llm-train", "the backward GEMMs (dX rrr, dW^T crr) of gemm-llm's layers at training token counts",
         functools.partial(llm_training, models=LLMS, tokens=TRAINING_TOKENS)),
    _set("gemm-llm-train-small", "gemm-llm-train's GEMMs of a tiny model at 17 tokens",
         functools.partial(llm_training, models=TINY_LLMS[1:], tokens=(17,))),
    _set("gemm-moe", "router, expert (even and hot loads) and shared-expert GEMMs of 7 MoE models, and batched "
         "expert GEMMs", functools.partial(moe, moes=MOES, tokens=TOKENS, batched_tokens=(16, 1000, 4096, 16384))),
    _set("gemm-moe-small", "gemm-moe's GEMMs of a tiny MoE",
         functools.partial(moe, moes=TINY_MOES, tokens=(3,), batched_tokens=(5,))),
    _set("gemm-shapes", "square, odd and deep-K products (rrr and rcr) and batched products",
         functools.partial(shapes, square=SQUARE, odd=ODD, deep_k=DEEP_K, batched=BATCHED)),
    _set("gemm-shapes-small", "a few tiny square, odd, deep-K and batched products",
         functools.partial(shapes, square=(16,), odd=((3, 17, 33),), deep_k=((8, 8, 256),),
                           batched=((2, 16, 16, 16),))),
    _set("gemm-random", "500 log-uniform random shapes (M, N up to 16384, K up to 65536), every layout",
         functools.partial(random_shapes, count=500, high=16384, max_flops=2.0**44)),
    _set("gemm-random-small", "6 log-uniform random shapes up to 48",
         functools.partial(random_shapes, count=6, high=48, max_flops=2.0**20)),
)
