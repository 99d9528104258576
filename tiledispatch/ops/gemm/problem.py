"""The GEMM problem: C[b] = epilogue(scale * A[b] @ B[b]), described without any tensor.

A is M x K, B is K x N, C is M x N, each optionally batched. Layouts come from strides:
``r`` (row-major: the last dim is contiguous), ``c`` (column-major) or ``s`` (any other
strides). The epilogue is applied in a fixed order: scale, bias, activation, residual.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from ...core.arith import rank_bucket
from ...core.choice import Choice
from ...core.dtypes import DType
from ...core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from ...core.op import OpKind

KIND = OpKind("gemm")  # this op's name: its specs' and problems' `op`, registered in __init__.py


class Layout(enum.Enum):
    ROW = "r"
    COL = "c"
    STRIDED = "s"  # neither dim is contiguous: only kernels with generic strides take it

    @classmethod
    def of(cls, rows: int, cols: int, row_stride: int, col_stride: int) -> "Layout":
        """The layout of a rows x cols matrix.

        ROW only fixes the column stride at 1 (the row stride stays an argument, so
        padded or broadcast rows are fine), COL the reverse. The stride of a dim of size
        1 is never used, so such a dim counts as contiguous.
        """
        if col_stride == 1 or cols == 1:
            return cls.ROW
        if row_stride == 1 or rows == 1:
            return cls.COL
        return cls.STRIDED


class Activation(Choice):
    NONE = "none"
    RELU = "relu"
    GELU = "gelu"  # the exact (erf) form, as torch.nn.functional.gelu
    SILU = "silu"

    @classmethod
    def parse(cls, value: "str | Activation | None") -> "Activation":
        return cls.NONE if value is None else super().parse(value)

    @classmethod
    def of_argument(cls, value) -> "Activation":
        """The `activation` argument of a public op: None, an Activation or its name; a function
        (torch.relu) or a module is refused, not guessed at."""
        if value is not None and not isinstance(value, (str, Activation)):
            raise InvalidArgumentError(
                f"activation must be None or one of {', '.join(repr(a.value) for a in cls)} (a name, not a "
                f"function), got {value!r} ({type(value).__name__})")
        return cls.parse(value)


@dataclass(frozen=True)
class GemmLayout:
    a: Layout = Layout.ROW
    b: Layout = Layout.ROW
    c: Layout = Layout.ROW

    @property
    def name(self) -> str:
        return self.a.value + self.b.value + self.c.value

    @classmethod
    def parse(cls, text: str) -> "GemmLayout":
        text = text.lower()
        if len(text) != 3 or any(ch not in "rcs" for ch in text):
            raise UnsupportedError(f"layout {text!r} must be three letters of r/c/s for A, B, C, e.g. rcr")
        return cls(*(Layout(ch) for ch in text))


@dataclass(frozen=True)
class GemmTypes:
    """Element types of A, B, C and the accumulator; `allow_tf32` lets fp32 use tensor cores."""

    a: DType = DType.FP16
    b: DType = DType.FP16
    c: DType = DType.FP16
    acc: DType = DType.FP32
    allow_tf32: bool = False

    @property
    def name(self) -> str:
        """Short and unique: ``bf16``, ``tf32``, ``fp16-fp32`` (fp32 out), ``fp8e4m3xfp8e5m2-bf16``."""
        base = "tf32" if self.a is DType.FP32 and self.allow_tf32 else self.a.value
        if self.b is not self.a:
            base += "x" + self.b.value
        if self.c is not self.a:
            base += "-" + self.c.value
        if self.acc is not DType.FP32:
            base += "-acc" + self.acc.value
        return base

    def itemsize_along(self, dim: str) -> int:
        """The smallest element among the operands laid along size `dim`: M (A, C), N (B, C), K (A, B).

        A size's alignment (`Align`) counts in it, so one level holds for every operand
        whose edge mask runs along that size."""
        pair = {"m": (self.a, self.c), "n": (self.b, self.c), "k": (self.a, self.b)}[dim.lower()]
        return min(d.itemsize for d in pair)

    @property
    def scaled(self) -> bool:
        """fp8 operands carry per-tensor scales."""
        return self.a.is_fp8 or self.b.is_fp8

    @classmethod
    def parse(cls, text: str, allow_tf32: bool = False) -> "GemmTypes":
        """From a CLI dtype: ``fp16``, ``bf16``, ``fp32``, ``tf32``, ``fp8e4m3`` (bf16 out), ``fp8e4m3xfp8e5m2``."""
        text = text.lower()
        if text == "tf32":
            return cls(DType.FP32, DType.FP32, DType.FP32, allow_tf32=True)
        a_text, _, b_text = text.partition("x")
        a = DType.parse(a_text)
        b = DType.parse(b_text) if b_text else a
        c = DType.BF16 if a.is_fp8 else a
        return cls(a, b, c, allow_tf32=allow_tf32)


@dataclass(frozen=True)
class Epilogue:
    bias: bool = False
    activation: Activation = Activation.NONE
    residual: bool = False

    @property
    def name(self) -> str:
        parts = (["bias"] if self.bias else []) + (
            [self.activation.value] if self.activation is not Activation.NONE else []
        ) + (["res"] if self.residual else [])
        return "-".join(parts) or "none"

    @property
    def plain(self) -> bool:
        """No step after the product."""
        return self == Epilogue()


VECTOR_BYTES = 16  # the widest vector access, and TMA's rule for base addresses and strides


class Align(enum.IntEnum):
    """What is known to divide an operand's addresses or a size, from weakest to strongest.

    For an operand: its base pointer and every stride of a dim longer than one. For a
    size (M, N, K): the size itself, in elements of every operand laid along it (M: A and
    C, N: B and C, K: A and B; the smallest element counts, so one rule covers them all).
    Each level implies the ones below it.
    """

    NONE = 0  # nothing: element-by-element accesses
    BYTES16 = 1  # base 16-byte aligned, strides (sizes) multiples of 16 bytes: 16-byte vectors and TMA are legal
    ELEMS16 = 2  # and multiples of 16 elements: what Triton's own JIT specialises on (the same for fp8)

    @classmethod
    def of(cls, values, itemsize: int, base: int = 0) -> "Align":
        """The level of strides (or a size) `values`, in elements of `itemsize` bytes, at address `base`."""
        if base % VECTOR_BYTES:
            return cls.NONE
        if all(v % 16 == 0 for v in values):
            return cls.ELEMS16
        if all(v * itemsize % VECTOR_BYTES == 0 for v in values):
            return cls.BYTES16
        return cls.NONE

    def divisor(self, itemsize: int) -> int:
        """What the compiler may assume divides an integer (a stride or size) of this level, in elements.

        16-byte strides of 2-byte elements are multiples of 8 elements: enough for 16-byte
        vectors, and the 16-element hint would be false (a row of 1000 bf16 is 2000 bytes).
        """
        return {Align.NONE: 1, Align.BYTES16: VECTOR_BYTES // itemsize, Align.ELEMS16: 16}[self]


def _level(value) -> Align:
    """A boolean is all or nothing: True is everything aligned, in 16-element units; False none."""
    if isinstance(value, bool):
        return Align.ELEMS16 if value else Align.NONE
    return Align(value)


@dataclass(frozen=True)
class Alignment:
    """How far each operand (A, B, C) and each size (M, N, K) is aligned: an `Align` each.

    Alignment is a fact about the data, not a kernel choice: every kernel serves every
    alignment, and the compiled artifact is specialised on it (as Triton's JIT does).
    It is what lets the compiler prove 16-byte vector loads and a pipelined mainloop
    (an operand's strides, and the size along its contiguous dim for the edge masks);
    without it, loads are element by element. The rule is in bytes: a bf16 matrix with
    rows of 1000 elements (2000 bytes) is BYTES16, and takes 16-byte vectors and TMA.
    Booleans are accepted (True is ELEMS16, False is NONE); a level is truthy when it is
    at least BYTES16.
    """

    a: Align = Align.ELEMS16
    b: Align = Align.ELEMS16
    c: Align = Align.ELEMS16
    m: Align = Align.ELEMS16
    n: Align = Align.ELEMS16
    k: Align = Align.ELEMS16

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _level(getattr(self, f.name)))

    @property
    def unaligned_operands(self) -> tuple[str, ...]:
        """The operands ("a", "b", "c") that TMA cannot take: below BYTES16."""
        return tuple(role for role in ("a", "b", "c") if not getattr(self, role))

    def realigned(self) -> "Alignment":
        """The alignment once every operand below BYTES16 is copied into a buffer of our own
        (16-byte base, rows padded to 16 bytes); the sizes stay what they are."""
        return replace(self, **{role: Align.BYTES16 for role in self.unaligned_operands})

    @property
    def tag(self) -> str:
        """``al-`` and one digit (the `Align` value) per field: A, B, C, M, N, K."""
        return "al-" + "".join(str(int(getattr(self, f.name))) for f in fields(self))


@dataclass(frozen=True)
class GemmProblem:
    op: ClassVar[OpKind] = KIND

    m: int
    n: int
    k: int
    batch: int = 1
    types: GemmTypes = GemmTypes()
    layout: GemmLayout = GemmLayout()
    epilogue: Epilogue = Epilogue()
    alignment: Alignment = Alignment()
    # Some operand (or the output) has an element offset of 2**31 or more: past what a 32-bit
    # index reaches. Triton's pointer kernels index in 32 bits, so only the vendor path takes it.
    wide_offsets: bool = False

    def __post_init__(self) -> None:
        for dim in ("m", "n", "k", "batch"):
            value = getattr(self, dim)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidProblemError(f"GEMM size {dim.upper()}={value!r} must be a positive integer")
        if not isinstance(self.wide_offsets, bool):
            raise InvalidProblemError(f"wide_offsets must be True or False, got {self.wide_offsets!r}")
        if max(self.m, self.n, self.k) >= 2**31:
            raise InvalidProblemError(
                f"GEMM dims must stay below 2**31 (got M={self.m}, N={self.n}, K={self.k}); split the problem"
            )

    def key(self) -> "GemmProblem":
        """Frozen and hashable: the problem is its own key."""
        return self

    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def bytes(self) -> int:
        """The fewest bytes moved: each operand read once, C written once (and read, as residual)."""
        t = self.types
        elems = self.m * self.k * t.a.itemsize + self.k * self.n * t.b.itemsize
        elems += self.m * self.n * t.c.itemsize * (2 if self.epilogue.residual else 1)
        bias = self.n * t.c.itemsize if self.epilogue.bias else 0
        return self.batch * elems + bias

    def selection_slice(self) -> tuple[str, str]:
        """(direction, dtype) as `describe` names them: the slice a learned model ranks, read on every
        first sight without describing the whole problem."""
        return "forward", self.types.name

    def describe(self) -> dict:
        from ...core.serialize import to_jsonable

        return {
            "op": "gemm",
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "batch": self.batch,
            "dtype": self.types.name,
            "layout": self.layout.name,
            "epilogue": self.epilogue.name,
            "alignment": self.alignment.tag,
            "types": to_jsonable(self.types),
            "flops": self.flops(),
            **({"wide_offsets": True} if self.wide_offsets else {}),
        }

    @classmethod
    def from_tensors(cls, a, b, *, bias=None, activation=None, residual=None, out=None,
                     out_dtype=None, allow_tf32: bool = False) -> "GemmProblem":
        """Describes ``a @ b`` with the given epilogue; every mismatch raises InvalidProblemError."""
        from .operands import check_operands

        return check_operands(a, b, bias=bias, activation=activation, residual=residual, out=out,
                              out_dtype=out_dtype, allow_tf32=allow_tf32).problem


# A serving engine's linears see a new token count (M) with each batch, and each first sight ranked
# every candidate (1-1.5 ms with a model, PyTorch's whole call 0.2 ms). A count ranks as the largest of
# its bucket (`core.arith.rank_bucket`: up to 64 its own, above, an eighth of an octave), once per
# bucket. On the sm_90 sweeps' 326 GEMMs, ranked so, the model's picks changed on 9 and its bf16 mean
# efficiency by 0.0003 (benchmarks/studies/rank_buckets.py).
def ranking_problem(problem: GemmProblem) -> GemmProblem:
    """The problem whose ranking stands for `problem`'s: its M rounded up to its bucket (itself where
    that M would pass the sizes a problem may have)."""
    top = rank_bucket(problem.m)
    if top == problem.m or top >= 2**31:
        return problem
    return replace(problem, m=top)
