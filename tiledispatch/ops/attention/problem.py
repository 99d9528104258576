"""The attention problem: O = softmax(mask(scale * Q K^T + bias)) V, described without any tensor.

Q is (batch, heads_q, seqlen_q, head_dim_qk), K is (batch, heads_kv, seqlen_kv, head_dim_qk),
V is (batch, heads_kv, seqlen_kv, head_dim_v); heads_q is a multiple of heads_kv (MHA, GQA,
MQA) and query head h reads key/value head h // (heads_q // heads_kv). A varlen ("group
mode") problem packs its sequences along one token axis, described by their lengths.

What the compiled code specialises on (masks, bias, soft-cap, sinks, dropout, varlen,
alignment) is the `AttentionVariant`; every kernel serves every variant, as every GEMM
kernel serves every alignment, and the artifact in the cache is specialised on it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ...core.arith import rank_bucket
from ...core.choice import Choice
from ...core.dtypes import DType
from ...core.errors import InvalidProblemError, UnsupportedError
from ...core.op import OpKind
from .counting import band_pairs

KIND = OpKind("attention")  # this op's name: its specs' and problems' `op`, registered in __init__.py

HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256)
DTYPES = (DType.FP16, DType.BF16, DType.FP32)  # fp32: the interpreter's exact path, and tests
# fp8 inputs, forward only (inference): per-tensor dequantization scales, a bf16 output.
FP8_DTYPES = (DType.FP8E4M3,)
FP8_OUTPUT = DType.BF16
# FlashAttention's convention: the backward does 5 matmuls of the forward's 2 -> 2.5x its FLOPs.
BACKWARD_FLOP_FACTOR = 2.5
INT32_MAX = 2**31 - 1
# The longest sequence the kernels index safely. They number queries and keys in 32 bits and
# stand for an unbounded window side by 2**30 (kernels/scores.py UNBOUNDED): a row of the last
# block (up to seqlen + a 256-row tile) plus the diagonal offset plus that bound must stay
# below 2**31, and the bound must exceed every key distance. Memory offsets are 64-bit: long
# sequences of wide heads are fine up to this length.
MAX_SEQLEN = 2**30 - 1024


def check_seqlen_limit(seqlen_q: int, seqlen_kv: int) -> None:
    """Refuses sequences longer than MAX_SEQLEN, where the kernels' 32-bit positions would wrap."""
    if max(seqlen_q, seqlen_kv) > MAX_SEQLEN:
        raise UnsupportedError(
            f"[seqlen-limit] {seqlen_q} queries and {seqlen_kv} keys: attention's kernels number the positions "
            f"of a sequence in 32 bits and take sequences of at most {MAX_SEQLEN} queries and keys; split it into "
            "chunks (chunks of queries over the same keys combine exactly by their LSE)")


class Direction(Choice):
    FORWARD = "fwd"
    BACKWARD = "bwd"


class Layout(Choice):
    """How Q, K, V sit in memory, read from strides; kernels take any strides with a unit head dim."""

    BHSD = "bhsd"  # heads outside sequence: (batch, heads, seq, dim) contiguous
    BSHD = "bshd"  # sequence outside heads: a (batch, seq, heads, dim) tensor seen as BHSD
    THD = "thd"  # varlen: (total tokens, heads, dim), sequences given by cumulative offsets


class MaskKind(Choice):
    """The position mask. Bottom-right alignment puts the last query on the last key (Sq != Skv)."""

    NONE = "none"
    CAUSAL_TOP_LEFT = "causal"  # query i sees keys j <= i (torch SDPA's is_causal)
    CAUSAL_BOTTOM_RIGHT = "causal-br"  # query i sees keys j <= i + Skv - Sq (FlashAttention's causal)
    SLIDING_WINDOW = "window"  # i + Skv - Sq - left <= j <= i + Skv - Sq + right (bottom-right aligned)


class UserMask(Choice):
    """A mask tensor given by the caller, broadcastable to (batch, heads_q, seqlen_q, seqlen_kv)."""

    NONE = "none"
    BOOLEAN = "bool"  # True: the key takes part (torch SDPA's convention)
    ADDITIVE = "additive"  # added to the scores (-inf removes a key); no gradient


@dataclass(frozen=True)
class Window:
    """Keys a query sees to its left and right of the (bottom-right aligned) diagonal; -1: unbounded."""

    left: int = -1
    right: int = -1

    def __post_init__(self) -> None:
        for side in ("left", "right"):
            value = getattr(self, side)
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise InvalidProblemError(f"window {side}={value!r} must be an integer >= 0, or -1 for unbounded")


@dataclass(frozen=True)
class AttentionVariant:
    """Every feature flag that changes the compiled code; `tag` names it in cache keys."""

    band: bool = False  # a causal or sliding-window mask: keys outside a diagonal band are removed
    user_mask: UserMask = UserMask.NONE
    bias: bool = False  # an additive bias tensor
    alibi: bool = False  # ALiBi: -slope * |i + Skv - Sq - j| per query head
    softcap: bool = False  # scores -> cap * tanh(scores / cap)
    sinks: bool = False  # a learned per-head logit that takes part in the softmax
    dropout: bool = False
    varlen: bool = False
    bias_grad: bool = False  # backward only: dS is written out for the bias gradient
    aligned: bool = True  # base pointers 16-byte aligned and row strides multiples of 16 elements

    @property
    def tag(self) -> str:
        flags = [("band", self.band), ("bias", self.bias), ("alibi", self.alibi), ("cap", self.softcap),
                 ("sink", self.sinks), ("drop", self.dropout), ("varlen", self.varlen), ("dbias", self.bias_grad)]
        parts = [name for name, on in flags if on]
        if self.user_mask is not UserMask.NONE:
            parts.append(f"mask-{self.user_mask.value}")
        parts.append("al" if self.aligned else "unal")
        return "v-" + "-".join(parts)

    @property
    def masks_rows(self) -> bool:
        """Whether some query row may see no key at all (its output is then 0, its LSE -inf)."""
        return self.band or self.user_mask is not UserMask.NONE or self.bias


@dataclass(frozen=True)
class AttentionProblem:
    op: ClassVar[OpKind] = KIND

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int  # the longest query sequence (varlen) or the query length
    seqlen_kv: int
    head_dim_qk: int
    head_dim_v: int
    dtype: DType = DType.FP16
    direction: Direction = Direction.FORWARD
    layout: Layout = Layout.BHSD
    mask: MaskKind = MaskKind.NONE
    window: Window = Window()
    variant: AttentionVariant = AttentionVariant()
    needs_lse: bool = False  # forward: the log-sum-exp is wanted (returned, or kept for the backward)
    deterministic: bool = False  # backward: same gradients bit for bit on every run
    # varlen: (query length, key length) of each sequence; empty for fixed-length batches
    seqlens: tuple[tuple[int, int], ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim_qk", "head_dim_v"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidProblemError(f"attention size {name}={value!r} must be a positive integer")
        if self.heads_q % self.heads_kv:
            raise InvalidProblemError(
                f"[heads-group] heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}: each "
                f"key/value head must serve a whole group of query heads (MHA: equal; GQA/MQA: a divisor)")
        for name in ("head_dim_qk", "head_dim_v"):
            if getattr(self, name) not in HEAD_DIMS:
                raise UnsupportedError(
                    f"[head-dim] {name}={getattr(self, name)} is not supported; use one of {HEAD_DIMS}")
        if self.dtype not in DTYPES + FP8_DTYPES:
            raise UnsupportedError(
                f"[dtype] attention in {self.dtype.value} is not supported; use one of "
                f"{', '.join(d.value for d in DTYPES + FP8_DTYPES)}")
        if self.dtype in FP8_DTYPES and self.direction is not Direction.FORWARD:
            raise UnsupportedError(f"[fp8-forward] {self.dtype.value} attention is forward only (inference); "
                                   "train in bf16")
        if self.mask is not MaskKind.SLIDING_WINDOW and self.window != Window():
            raise InvalidProblemError(f"a window {self.window} is given but the mask is {self.mask.value}")
        if self.variant.band != (self.mask is not MaskKind.NONE):
            raise InvalidProblemError(f"variant.band={self.variant.band} disagrees with mask {self.mask.value}")
        if self.variant.varlen != bool(self.seqlens) or self.variant.varlen != (self.layout is Layout.THD):
            raise InvalidProblemError("a varlen problem has layout thd and its sequence lengths; others neither")
        if self.seqlens and len(self.seqlens) != self.batch:
            raise InvalidProblemError(f"{len(self.seqlens)} sequence lengths for a batch of {self.batch}")
        check_seqlen_limit(self.seqlen_q, self.seqlen_kv)
        if self.seqlens and max(self.tokens()) > INT32_MAX:
            raise UnsupportedError(f"[seqlen-limit] varlen sequences of {max(self.tokens())} tokens in all: the "
                                   "kernels read int32 cumulative offsets (at most 2**31 - 1 tokens)")

    def key(self) -> AttentionProblem:
        """Frozen and hashable: the problem is its own key."""
        return self

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads_q // self.heads_kv

    def band(self, seqlen_q: int, seqlen_kv: int) -> tuple[int, int, int]:
        """(diagonal offset, left, right) of the position mask for one sequence; -1: unbounded.

        Query i sees key j iff i + offset - left <= j <= i + offset + right.
        """
        if self.mask is MaskKind.CAUSAL_TOP_LEFT:
            return 0, -1, 0
        offset = seqlen_kv - seqlen_q
        if self.mask is MaskKind.CAUSAL_BOTTOM_RIGHT:
            return offset, -1, 0
        if self.mask is MaskKind.SLIDING_WINDOW:
            return offset, self.window.left, self.window.right
        return 0, -1, -1

    def visible_pairs(self) -> int:
        """(query, key) pairs the mask keeps, summed over sequences (not heads): what FLOPs count.
        In closed form: O(1) a distinct sequence, whatever its length."""
        if not self.seqlens:
            return self.batch * band_pairs(self.seqlen_q, self.seqlen_kv, *self.band(self.seqlen_q, self.seqlen_kv))
        lengths = collections.Counter(self.seqlens)
        return sum(n * band_pairs(sq, skv, *self.band(sq, skv)) for (sq, skv), n in lengths.items())

    def forward_flops(self) -> int:
        """2 * (D_qk + D_v) per visible (query, key) pair and query head: Q K^T and P V."""
        return 2 * (self.head_dim_qk + self.head_dim_v) * self.heads_q * self.visible_pairs()

    def flops(self) -> float:
        """This direction's FLOPs: the backward counts 2.5x the forward (FlashAttention's convention)."""
        fwd = self.forward_flops()
        return fwd if self.direction is Direction.FORWARD else BACKWARD_FLOP_FACTOR * fwd

    def training_flops(self) -> float:
        """Forward plus backward: 3.5x the forward."""
        return (1 + BACKWARD_FLOP_FACTOR) * self.forward_flops()

    def tokens(self) -> tuple[int, int]:
        """Total query and key tokens over the batch."""
        if self.seqlens:
            return sum(s[0] for s in self.seqlens), sum(s[1] for s in self.seqlens)
        return self.batch * self.seqlen_q, self.batch * self.seqlen_kv

    def bytes(self) -> int:
        """The fewest bytes moved: Q, K, V read and O written once (the backward: twice that, and dO, dQ...)."""
        tq, tk = self.tokens()
        size = self.dtype.itemsize
        fwd = size * (tq * self.heads_q * (self.head_dim_qk + self.head_dim_v)
                      + tk * self.heads_kv * (self.head_dim_qk + self.head_dim_v))
        return fwd if self.direction is Direction.FORWARD else 2 * fwd

    def selection_slice(self) -> tuple[str, str]:
        """(direction, dtype) as `describe` names them: the slice a learned model ranks, read on every
        first sight without describing the whole problem."""
        return self.direction.value, self.dtype.value

    def describe(self) -> dict:
        from ...core.serialize import to_jsonable

        out = {
            "op": "attention",
            "direction": self.direction.value,
            "batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
            "seqlen_q": self.seqlen_q, "seqlen_kv": self.seqlen_kv,
            "head_dim_qk": self.head_dim_qk, "head_dim_v": self.head_dim_v,
            "dtype": self.dtype.value, "layout": self.layout.value, "mask": self.mask.value,
            "variant": self.variant.tag, "features": to_jsonable(self.variant),
            "flops": self.flops(),
        }
        if self.mask is MaskKind.SLIDING_WINDOW:
            out["window"] = [self.window.left, self.window.right]
        if self.seqlens:
            out["seqlens"] = [list(s) for s in self.seqlens]
        if self.direction is Direction.BACKWARD:
            out["deterministic"] = self.deterministic
        return out


def ranking_problem(problem: AttentionProblem) -> AttentionProblem:
    """The problem whose ranking stands for a forward's: its sequence lengths rounded up to their
    buckets (`core.arith.rank_bucket`), so that a decode over a cache that grows a token a step is
    ranked once per bucket. A varlen problem and a backward rank themselves: training's lengths
    repeat, and ranked by buckets the sweep's backward picks lost 0.004 of mean efficiency and 0.04
    of P10 (benchmarks/studies/rank_buckets.py), the forward's none."""
    if problem.seqlens or problem.direction is not Direction.FORWARD:
        return problem
    q, kv = rank_bucket(problem.seqlen_q), rank_bucket(problem.seqlen_kv)
    if (q, kv) == (problem.seqlen_q, problem.seqlen_kv) or max(q, kv) > MAX_SEQLEN:
        return problem  # itself, too, where a stand-in would be longer than a problem may be
    return replace(problem, seqlen_q=q, seqlen_kv=kv)


__all__ = [
    "DTYPES",
    "FP8_DTYPES",
    "FP8_OUTPUT",
    "HEAD_DIMS",
    "INT32_MAX",
    "MAX_SEQLEN",
    "AttentionProblem",
    "AttentionVariant",
    "Direction",
    "Layout",
    "MaskKind",
    "UserMask",
    "Window",
    "check_seqlen_limit",
]
