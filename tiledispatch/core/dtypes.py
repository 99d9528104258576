"""Element types, named once for every op, with their PyTorch and Triton spellings."""

from __future__ import annotations

import enum

from .errors import UnsupportedError


class DType(enum.Enum):
    """An element type. The value is the short name used in kernel names and on the CLI."""

    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"
    FP64 = "fp64"
    FP8E4M3 = "fp8e4m3"
    FP8E5M2 = "fp8e5m2"

    itemsize: int  # bytes an element: set on each member below, a plain attribute (the rankings read it
    # thousands of times a new problem, where a property's lookup hashed the member each time)

    @property
    def is_fp8(self) -> bool:
        return self in (DType.FP8E4M3, DType.FP8E5M2)

    @property
    def torch(self):
        import torch

        return getattr(torch, _TORCH_NAME[self])

    @property
    def triton(self) -> str:
        """The spelling of this type in a Triton kernel signature (``*fp16`` for a pointer)."""
        return _TRITON_NAME[self]

    @classmethod
    def parse(cls, text: str | "DType") -> "DType":
        """Accepts the short name (``bf16``) and common aliases (``bfloat16``, ``e4m3``)."""
        if isinstance(text, DType):
            return text
        key = str(text).strip().lower().replace("torch.", "")
        found = _ALIASES.get(key)
        if found is None:
            names = ", ".join(d.value for d in cls)
            raise UnsupportedError(f"unknown dtype {text!r}; use one of: {names}")
        return found

    @classmethod
    def from_torch(cls, dtype) -> "DType":
        for d in cls:
            if _TORCH_NAME[d] == str(dtype).replace("torch.", ""):
                return d
        names = ", ".join(f"torch.{_TORCH_NAME[d]}" for d in cls)
        raise UnsupportedError(f"tensor dtype {dtype} is not supported; use one of: {names}")


_ITEMSIZE = {
    DType.FP16: 2,
    DType.BF16: 2,
    DType.FP32: 4,
    DType.FP64: 8,
    DType.FP8E4M3: 1,
    DType.FP8E5M2: 1,
}
for _member, _size in _ITEMSIZE.items():
    _member.itemsize = _size
_TORCH_NAME = {
    DType.FP16: "float16",
    DType.BF16: "bfloat16",
    DType.FP32: "float32",
    DType.FP64: "float64",
    DType.FP8E4M3: "float8_e4m3fn",
    DType.FP8E5M2: "float8_e5m2",
}
_TRITON_NAME = {
    DType.FP16: "fp16",
    DType.BF16: "bf16",
    DType.FP32: "fp32",
    DType.FP64: "fp64",
    DType.FP8E4M3: "fp8e4nv",
    DType.FP8E5M2: "fp8e5",
}
_ALIASES = {
    **{d.value: d for d in DType},
    **{_TORCH_NAME[d]: d for d in DType},
    "half": DType.FP16,
    "f16": DType.FP16,
    "bfloat": DType.BF16,
    "float": DType.FP32,
    "f32": DType.FP32,
    "double": DType.FP64,
    "e4m3": DType.FP8E4M3,
    "fp8": DType.FP8E4M3,
    "e5m2": DType.FP8E5M2,
}
