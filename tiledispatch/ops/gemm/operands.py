"""From user tensors to a checked GemmProblem plus the batched 3-D views the kernels read.

This is the one place that inspects the caller's tensors: shapes, dtypes, devices,
strides and aliasing. Everything downstream trusts what it returns.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from ...core.args import as_bool, as_float
from ...core.dtypes import DType
from ...core import tensors
from ...core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from .problem import Activation, Align, Alignment, Epilogue, GemmLayout, GemmProblem, GemmTypes, Layout

_OUT_DTYPES = {
    DType.FP16: (DType.FP16, DType.FP32),
    DType.BF16: (DType.BF16, DType.FP32),
    DType.FP32: (DType.FP32,),
}
_FP8_OUT = (DType.BF16, DType.FP16, DType.FP32)
# The first element offset a 32-bit index cannot reach (see GemmProblem.wide_offsets).
INDEX_LIMIT = 2**31
FP32_MAX = torch.finfo(torch.float32).max  # a scale is a float32 value


@dataclass(frozen=True)
class GemmOperands:
    problem: GemmProblem
    a: torch.Tensor  # (batch or 1, M, K); a batch of 1 with batch > 1 means broadcast
    b: torch.Tensor  # (batch or 1, K, N)
    bias: torch.Tensor | None  # (N,)
    residual: torch.Tensor | None  # (batch or 1, M, N)
    scale_a: torch.Tensor | None  # () fp32, fp8 only
    scale_b: torch.Tensor | None
    out: torch.Tensor | None  # (batch, M, N) as given by the caller, else None (allocate)

    @property
    def device(self) -> torch.device:
        return self.a.device


def _shape(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape)) if t.dim() else "() (a 0-d tensor)"


def _as_batched(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dim() == 2:
        return t.unsqueeze(0)
    if t.dim() == 3:
        return t
    raise InvalidProblemError(f"{what} must be 2-D (rows x cols) or 3-D (batch x rows x cols), got shape {_shape(t)}")


def _dtype(t: torch.Tensor, what: str) -> DType:
    try:
        return DType.from_torch(t.dtype)
    except UnsupportedError as e:
        raise UnsupportedError(f"{what}: {e}") from None


def _scale(scale: Any, device: torch.device, what: str) -> torch.Tensor:
    """A per-tensor scale as a 0-d float32 tensor: a real number, or one float32 element on `device`
    (a string, a bool or a complex number is refused, not converted)."""
    if scale is None:
        return torch.ones((), dtype=torch.float32, device=device)
    if not isinstance(scale, torch.Tensor):
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise InvalidArgumentError(
                f"{what} must be a number or a float32 tensor, got {scale!r} ({type(scale).__name__})")
        try:
            value = as_float(scale, what, low=-FP32_MAX, high=FP32_MAX)
        except OverflowError:  # an int past float's range
            raise InvalidArgumentError(f"{what} must be a finite real number, got an int of "
                                       f"{int(scale).bit_length()} bits") from None
        return torch.full((), value, dtype=torch.float32, device=device)
    _check_dense(scale, what)
    if scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != device:
        raise InvalidProblemError(
            f"{what} must be one float32 value on {device} (a per-tensor scale), got "
            f"{scale.dtype} of shape {tuple(scale.shape)} on {scale.device}"
        )
    return tensors.check_plain(scale, what).reshape(())


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


_CONTIGUOUS_DIM = {Layout.ROW: 2, Layout.COL: 1}  # in a (batch, rows, cols) stack


def _aligned(t: torch.Tensor | None, dtype: DType, layout: Layout, shape: tuple[int, ...] | None = None) -> Align:
    """The operand's level: base pointer and every stride of a dim longer than one, in bytes.

    The layout's contiguous dim is the run a vector (or a TMA box) reads, not a step between
    them, so its stride does not count; every other one does, even a stride of 1: a 20 x 1
    contiguous matrix is row-major (its one column is the contiguous dim) with rows 2 bytes
    apart, which no descriptor takes. A tensor not given yet (`t` None, the output we
    allocate) is contiguous with `shape`, and torch allocates it 16-byte aligned.
    """
    shape = tuple(t.shape) if t is not None else shape
    strides = t.stride() if t is not None else _contiguous_strides(shape)
    inner = _CONTIGUOUS_DIM.get(layout)
    steps = [s for i, (s, n) in enumerate(zip(strides, shape)) if n != 1 and i != inner]
    return Align.of(steps, dtype.itemsize, t.data_ptr() if t is not None else 0)


def alignment_of(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, types: GemmTypes,
                 shape: tuple[int, int, int, int], layout: GemmLayout) -> Alignment:
    """The operands' levels and the sizes' (each in the smallest element laid along it)."""
    batch, m, n, k = shape
    return Alignment(_aligned(a, types.a, layout.a), _aligned(b, types.b, layout.b),
                     _aligned(out, types.c, layout.c, (batch, m, n)),
                     *(Align.of([size], types.itemsize_along(dim)) for dim, size in zip("mnk", (m, n, k))))


def _batched(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.unsqueeze(0) if t is not None and t.dim() == 2 else t


def check_no_alias(out: torch.Tensor, a, b, bias, residual=None, scale_a=None, scale_b=None) -> None:
    """out must not share memory with what the kernel reads from other programs.

    bias and the scales too: every tile reads all of them, so writing into them races with
    those reads. A residual may be out itself, element for element (each element is read,
    then written, by one program: an in-place add), but overlap it no other way. The two
    are compared as (batch, M, N) stacks, so a 2-D out and its (1, M, N) view are one tensor.
    """
    tensors.check_no_alias(_batched(out), {"a": a, "b": b, "bias": bias, "scale_a": scale_a, "scale_b": scale_b},
                           in_place_ok={"residual": _batched(residual)})


def _check_dense(t: Any, name: str) -> None:
    """A torch.Tensor with strides over a buffer of its own: sparse, nested and MKL-DNN tensors have
    no strides, a transform's wrapper tensor no buffer."""
    if not isinstance(t, torch.Tensor):
        raise InvalidProblemError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested:
        raise InvalidProblemError(f"{name} is a nested tensor; pass one dense (strided) tensor per call")
    if t.layout is not torch.strided:
        kind = str(t.layout).replace("torch.", "").strip("_")
        raise InvalidProblemError(f"{name} is a {kind} tensor; pass a dense (strided) tensor, e.g. {name}.to_dense()")
    try:
        t.data_ptr()
    except RuntimeError:  # torch.vmap's batched tensors, torch.func's wrappers, fake tensors
        raise InvalidProblemError(
            f"{name} has no memory of its own (a torch.vmap/torch.func or fake tensor); the kernels read "
            "real tensors: call gemm outside the transform, or use torch.matmul there") from None


def _plain_inputs(a, b, bias, residual, out) -> tuple:
    """The tensors checked dense, on a's device, and plain: a negated view is resolved (a copy of the
    values its flag stands for) as an input, and refused as the output."""
    for name, t in (("a", a), ("b", b), ("bias", bias), ("residual", residual), ("out", out)):
        if t is not None or name in ("a", "b"):
            _check_dense(t, name)
    for name, t in (("b", b), ("bias", bias), ("residual", residual), ("out", out)):
        if t is not None and t.device != a.device:
            raise InvalidProblemError(f"{name} is on {t.device} but a is on {a.device}; put every tensor on one device")
    return (tensors.check_plain(a, "a"), tensors.check_plain(b, "b"), tensors.check_plain(bias, "bias"),
            tensors.check_plain(residual, "residual"), tensors.check_plain(out, "out", written=True))


def _asked_dtype(out_dtype: Any) -> DType | None:
    if out_dtype is None or isinstance(out_dtype, DType):
        return out_dtype
    if isinstance(out_dtype, (torch.dtype, str)):
        try:
            return DType.from_torch(out_dtype) if isinstance(out_dtype, torch.dtype) else DType.parse(out_dtype)
        except (UnsupportedError, ValueError) as e:
            raise type(e)(f"out_dtype={out_dtype!r}: {e}") from None
    raise InvalidArgumentError(
        f"out_dtype must be None, a torch.dtype (torch.float32) or a dtype name ('fp32'), "
        f"got {out_dtype!r} ({type(out_dtype).__name__})")


def _output_dtype(ta: DType, out: torch.Tensor | None, out_dtype: Any) -> DType:
    """The output's dtype: out's, else the one asked for, else the inputs' (bf16 for fp8 inputs)."""
    asked = _asked_dtype(out_dtype)
    if out is not None:
        tc = _dtype(out, "out")
        if asked is not None and asked is not tc:
            raise InvalidProblemError(f"out is {tc.value} but out_dtype asks for {asked.value}")
    else:
        tc = asked if asked is not None else DType.BF16 if ta.is_fp8 else ta
    allowed = _FP8_OUT if ta.is_fp8 else _OUT_DTYPES.get(ta, ())
    if tc not in allowed:
        given = "out" if out is not None else "out_dtype" if asked is not None else "the output"
        raise UnsupportedError(
            f"{given}: output dtype {tc.value} is not supported for {ta.value} inputs; use one of: "
            f"{', '.join(d.value for d in allowed)}"
        )
    return tc


def _input_types(a, b, out, out_dtype, allow_tf32: bool, scale_a, scale_b) -> GemmTypes:
    ta, tb = _dtype(a, "a"), _dtype(b, "b")
    if ta.is_fp8 != tb.is_fp8 or (not ta.is_fp8 and ta is not tb):
        raise UnsupportedError(
            f"a is {ta.value} and b is {tb.value}: both must have one dtype (fp16, bf16, fp32) or both be fp8"
        )
    if ta is DType.FP64:
        raise UnsupportedError("fp64 GEMM is not supported; use torch.matmul for float64")
    tc = _output_dtype(ta, out, out_dtype)
    if allow_tf32 and ta is not DType.FP32:
        raise InvalidProblemError(f"allow_tf32 applies to fp32 inputs only, but a is {ta.value}")
    if not ta.is_fp8 and (scale_a is not None or scale_b is not None):
        raise InvalidProblemError("scale_a/scale_b are per-tensor scales of fp8 inputs; a is not fp8")
    return GemmTypes(ta, tb, tc, DType.FP32, allow_tf32)


def _sizes(a: torch.Tensor, b: torch.Tensor, a3: torch.Tensor, b3: torch.Tensor) -> tuple[int, int, int, int]:
    """(batch, M, N, K), the operands' shapes checked against each other."""
    m, k = a3.shape[1], a3.shape[2]
    k_b, n = b3.shape[1], b3.shape[2]
    if k != k_b:
        raise InvalidProblemError(
            f"a is {_shape(a)} and b is {_shape(b)}: the inner dims must agree (a's K={k}, b's K={k_b})"
        )
    if a3.shape[0] != b3.shape[0] and 1 not in (a3.shape[0], b3.shape[0]):
        raise InvalidProblemError(f"batch sizes of a ({a3.shape[0]}) and b ({b3.shape[0]}) differ and neither is 1")
    batch = 0 if 0 in (a3.shape[0], b3.shape[0]) else max(a3.shape[0], b3.shape[0])  # 0 broadcasts to 0
    if 0 in (m, n, k, batch):
        raise InvalidProblemError(f"a is {_shape(a)} and b is {_shape(b)}: zero-size dims are not a GEMM")
    return batch, m, n, k


def _epilogue_operands(bias, residual, tc: DType, batch: int, m: int, n: int) -> torch.Tensor | None:
    """bias and residual checked against the output; the residual as a (batch or 1, M, N) stack."""
    if bias is not None:
        if bias.shape != (n,):
            raise InvalidProblemError(f"bias must have shape ({n},) (one value per output column), got {_shape(bias)}")
        if _dtype(bias, "bias") is not tc:
            raise InvalidProblemError(f"bias is {_dtype(bias, 'bias').value}; it must match the output dtype {tc.value}")
    if residual is None:
        return None
    res3 = _as_batched(residual, "residual")
    if res3.shape[1:] != (m, n) or res3.shape[0] not in (1, batch):
        raise InvalidProblemError(f"residual must have shape {m}x{n} or {batch}x{m}x{n}, got {_shape(residual)}")
    if _dtype(residual, "residual") is not tc:
        raise InvalidProblemError(
            f"residual is {_dtype(residual, 'residual').value}; it must match the output dtype {tc.value}"
        )
    return res3


def _output(out: torch.Tensor | None, batch: int, m: int, n: int) -> torch.Tensor | None:
    """The caller's out as a (batch, M, N) stack, checked: its shape, and no two results in one element."""
    if out is None:
        return None
    out3 = _as_batched(out, "out")
    want = (batch, m, n)
    if tuple(out3.shape) != want and not (out.dim() == 2 and batch == 1 and tuple(out.shape) == (m, n)):
        raise InvalidProblemError(f"out must have shape {'x'.join(map(str, want))}, got {_shape(out)}")
    if tensors.overlaps_itself(out3):
        raise InvalidProblemError(
            f"out (shape {_shape(out)}, strides {tuple(out.stride())}) overlaps itself, so several results "
            "would land in one element; pass a contiguous tensor")
    return out3


def largest_offset(t: torch.Tensor) -> int:
    """The element offset of `t`'s last element from its first: what a kernel's index must reach.
    A stride-0 (broadcast) dim adds nothing, however long; torch has no negative strides."""
    return sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)


def reaches_index_limit(operands: tuple, allocated: int) -> bool:
    """Whether an operand of `operands` (None entries skipped), or an output of `allocated` elements
    that we allocate contiguous (0: the caller gave one), has an element offset of INDEX_LIMIT or more."""
    return allocated > INDEX_LIMIT or any(t is not None and largest_offset(t) >= INDEX_LIMIT for t in operands)


def check_operands(a, b, *, bias=None, activation=None, residual=None, out=None, out_dtype=None,
                   allow_tf32: bool = False, scale_a=None, scale_b=None) -> GemmOperands:
    a, b, bias, residual, out = _plain_inputs(a, b, bias, residual, out)
    allow_tf32 = as_bool(allow_tf32, "allow_tf32")
    epilogue_activation = Activation.of_argument(activation)
    a3, b3 = _as_batched(a, "a"), _as_batched(b, "b")
    batch, m, n, k = _sizes(a, b, a3, b3)
    types = _input_types(a, b, out, out_dtype, allow_tf32, scale_a, scale_b)
    res3 = _epilogue_operands(bias, residual, types.c, batch, m, n)
    out3 = _output(out, batch, m, n)
    fp8 = types.a.is_fp8
    scales = (_scale(scale_a, a.device, "scale_a"), _scale(scale_b, a.device, "scale_b")) if fp8 else (None, None)
    if out is not None:
        check_no_alias(out, a, b, bias, residual, *scales)
    layout = GemmLayout(Layout.of(m, k, a3.stride(1), a3.stride(2)), Layout.of(k, n, b3.stride(1), b3.stride(2)),
                        Layout.ROW if out3 is None else Layout.of(m, n, out3.stride(1), out3.stride(2)))
    wide = reaches_index_limit((a3, b3, bias, res3, out3), batch * m * n if out3 is None else 0)
    problem = GemmProblem(
        m=m, n=n, k=k, batch=batch, types=types, layout=layout,
        epilogue=Epilogue(bias is not None, epilogue_activation, residual is not None),
        alignment=alignment_of(a3, b3, out3, types, (batch, m, n, k), layout), wide_offsets=wide,
    )
    return GemmOperands(problem=problem, a=a3, b=b3, bias=bias, residual=res3, scale_a=scales[0],
                        scale_b=scales[1], out=out3)
