"""A kernel spec: one op, one config, one architecture. Its name is its identity."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .op import OpDefinition, OpKind, get_op
from .serialize import from_jsonable, to_jsonable


@dataclass(frozen=True)
class KernelSpec:
    op: OpKind
    config: Any  # the op's frozen config dataclass
    arch: str  # an arch name, e.g. "sm_90" or "interpreter"

    @property
    def definition(self) -> OpDefinition:
        return get_op(self.op)

    @functools.cached_property  # a formatted string read on every checked call: made once
    def name(self) -> str:
        from ..arch import load

        return f"{self.config.name}_{load(self.arch).tag}"

    @property
    def family(self) -> str:
        return self.definition.family_of(self.config)

    @property
    def is_vendor(self) -> bool:
        """Whether this is the vendor library's kernel, as its op says (`OpDefinition.is_vendor`): a
        Python call alone is not one (conv's 1x1 family calls the GEMM op's Triton kernels)."""
        return self.definition.is_vendor(self.config)

    @property
    def dtype(self) -> str:
        return self.definition.dtype_of(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op.value, "arch": self.arch, "config": to_jsonable(self.config)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "KernelSpec":
        """Raises ValueError naming the bad field when `data` is not a valid spec."""
        op = OpKind.parse(data["op"], exact=True)  # a registered op, spelled as to_dict spells it
        try:
            config = from_jsonable(get_op(op).config_type, data["config"], "config")
        except ValueError as e:  # say which op's config it was read as: the op field may be the mistake
            raise ValueError(f"{e} (read as a {op.value} config)") from None
        return cls(op=op, config=config, arch=str(data["arch"]))
