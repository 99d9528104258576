"""From user tensors to a checked GemmProblem plus the batched 3-D views the kernels read.

This is the one place that inspects the caller's tensors: shapes, dtypes, devices,
strides and aliasing. Everything downstream trusts what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...core.dtypes import DType
from ...core import tensors
from ...core.errors import InvalidProblemError, UnsupportedError
from .problem import Activation, Align, Alignment, Epilogue, GemmLayout, GemmProblem, GemmTypes, Layout

_OUT_DTYPES = {
    DType.FP16: (DType.FP16, DType.FP32),
    DType.BF16: (DType.BF16, DType.FP32),
    DType.FP32: (DType.FP32,),
}
_FP8_OUT = (DType.BF16, DType.FP16, DType.FP32)


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
    return "x".join(map(str, t.shape))


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
    if scale is None:
        return torch.ones((), dtype=torch.float32, device=device)
    if not isinstance(scale, torch.Tensor):
        try:
            value = float(scale)
        except (TypeError, ValueError):
            raise InvalidProblemError(f"{what} must be a number or a float32 tensor, got {scale!r}") from None
        return torch.full((), value, dtype=torch.float32, device=device)
    if scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != device:
        raise InvalidProblemError(
            f"{what} must be one float32 value on {device} (a per-tensor scale), got "
            f"{scale.dtype} of shape {tuple(scale.shape)} on {scale.device}"
        )
    return scale.reshape(())


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


def check_no_alias(out: torch.Tensor, a, b, bias) -> None:
    """out must not share memory with what the kernel reads from other programs.

    bias too: every row of tiles reads all of it, so writing into it races with them.
    (A residual of out's own shape may alias out: each element is read, then written, by one program.)
    """
    tensors.check_no_alias(out, {"a": a, "b": b, "bias": bias})


def check_operands(a, b, *, bias=None, activation=None, residual=None, out=None, out_dtype=None,
                   allow_tf32: bool = False, scale_a=None, scale_b=None) -> GemmOperands:
    for name, t in (("a", a), ("b", b), ("bias", bias), ("residual", residual), ("out", out)):
        if (t is not None or name in ("a", "b")) and not isinstance(t, torch.Tensor):
            raise InvalidProblemError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    device = a.device
    for name, t in (("b", b), ("bias", bias), ("residual", residual), ("out", out)):
        if t is not None and t.device != device:
            raise InvalidProblemError(f"{name} is on {t.device} but a is on {device}; put every tensor on one device")

    a3, b3 = _as_batched(a, "a"), _as_batched(b, "b")
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

    ta, tb = _dtype(a, "a"), _dtype(b, "b")
    if ta.is_fp8 != tb.is_fp8 or (not ta.is_fp8 and ta is not tb):
        raise UnsupportedError(
            f"a is {ta.value} and b is {tb.value}: both must have one dtype (fp16, bf16, fp32) or both be fp8"
        )
    if ta is DType.FP64:
        raise UnsupportedError("fp64 GEMM is not supported; use torch.matmul for float64")
    if out is not None:
        tc = _dtype(out, "out")
        if out_dtype is not None and DType.parse(out_dtype) is not tc:
            raise InvalidProblemError(f"out is {tc.value} but out_dtype asks for {DType.parse(out_dtype).value}")
    elif out_dtype is not None:
        tc = DType.from_torch(out_dtype) if isinstance(out_dtype, torch.dtype) else DType.parse(out_dtype)
    else:
        tc = DType.BF16 if ta.is_fp8 else ta
    allowed = _FP8_OUT if ta.is_fp8 else _OUT_DTYPES[ta]
    if tc not in allowed:
        raise UnsupportedError(
            f"output dtype {tc.value} is not supported for {ta.value} inputs; use one of: "
            f"{', '.join(d.value for d in allowed)}"
        )
    if allow_tf32 and ta is not DType.FP32:
        raise InvalidProblemError(f"allow_tf32 applies to fp32 inputs only, but a is {ta.value}")
    if not ta.is_fp8 and (scale_a is not None or scale_b is not None):
        raise InvalidProblemError("scale_a/scale_b are per-tensor scales of fp8 inputs; a is not fp8")

    if bias is not None:
        if bias.shape != (n,):
            raise InvalidProblemError(f"bias must have shape ({n},) (one value per output column), got {_shape(bias)}")
        if _dtype(bias, "bias") is not tc:
            raise InvalidProblemError(f"bias is {_dtype(bias, 'bias').value}; it must match the output dtype {tc.value}")
    res3 = None
    if residual is not None:
        res3 = _as_batched(residual, "residual")
        if res3.shape[1:] != (m, n) or res3.shape[0] not in (1, batch):
            raise InvalidProblemError(f"residual must have shape {m}x{n} or {batch}x{m}x{n}, got {_shape(residual)}")
        if _dtype(residual, "residual") is not tc:
            raise InvalidProblemError(
                f"residual is {_dtype(residual, 'residual').value}; it must match the output dtype {tc.value}"
            )
    out3 = None
    layout_c = Layout.ROW
    if out is not None:
        out3 = _as_batched(out, "out")
        want = (batch, m, n)
        if tuple(out3.shape) != want and not (out.dim() == 2 and batch == 1 and tuple(out.shape) == (m, n)):
            raise InvalidProblemError(f"out must have shape {'x'.join(map(str, want))}, got {_shape(out)}")
        if tensors.overlaps_itself(out3):
            raise InvalidProblemError(
                f"out (shape {_shape(out)}, strides {tuple(out.stride())}) overlaps itself, so several results "
                "would land in one element; pass a contiguous tensor")
        check_no_alias(out, a, b, bias)
        layout_c = Layout.of(m, n, out3.stride(1), out3.stride(2))

    types = GemmTypes(ta, tb, tc, DType.FP32, allow_tf32)
    layout = GemmLayout(Layout.of(m, k, a3.stride(1), a3.stride(2)), Layout.of(k, n, b3.stride(1), b3.stride(2)),
                        layout_c)
    problem = GemmProblem(
        m=m, n=n, k=k, batch=batch, types=types, layout=layout,
        epilogue=Epilogue(bias is not None, Activation.parse(activation), residual is not None),
        alignment=alignment_of(a3, b3, out3, types, (batch, m, n, k), layout),
    )
    fp8 = ta.is_fp8
    return GemmOperands(
        problem=problem, a=a3, b=b3, bias=bias, residual=res3,
        scale_a=_scale(scale_a, device, "scale_a") if fp8 else None,
        scale_b=_scale(scale_b, device, "scale_b") if fp8 else None,
        out=out3,
    )
