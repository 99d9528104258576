"""An attention kernel config: everything that changes the compiled code, and its name; and the
table of kernel families (`FAMILIES`) that the op's shared code looks a config's family up in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...core.choice import Choice
from ...core.dtypes import DType
from ...core.family import FamilyTable, KernelFamily
from .problem import Direction


class Family(Choice):
    """The name of a kernel family: one module in ``families/`` (and its kernel file in ``kernels/``,
    or ``vendor.py`` for the SDPA backends)."""

    FWD = "fwd"  # online-softmax forward, pointer loads: every arch, every stride
    FWD_TMA = "fwd-tma"  # sm_90+: Q/K/V by tensor descriptors; bands, soft-cap, sinks, GQA (kernels/forward_tma.py)
    FWD_WS = "fwd-ws"  # sm_90, Gluon: a TMA loader warp and two MMA warpgroups (kernels/forward_ws.py)
    BWD = "bwd"  # dK/dV per key block and dQ per query block: no atomics, deterministic
    BWD_ATOMIC = "bwd-atomic"  # dK/dV per key block, dQ by fp32 atomics and a conversion stage
    BWD_WS = "bwd-ws"  # bwd's plan with Gluon dK/dV and dQ stages, warp-specialised as fwd-ws (kernels/backward_ws.py)
    SDPA_FLASH = "sdpa-flash"  # PyTorch SDPA's FlashAttention-2 backend
    SDPA_CUDNN = "sdpa-cudnn"  # PyTorch SDPA's cuDNN backend

    @property
    def direction(self) -> Direction | None:
        """The direction a Triton family computes; None for the vendor ones (they do both)."""
        return FAMILIES.named(self.value).direction

    @property
    def is_vendor(self) -> bool:
        return FAMILIES.named(self.value).config_type is VendorConfig


@dataclass(frozen=True)
class AttentionConfig:
    family: Family
    dtype: DType
    head_dim_qk: int
    head_dim_v: int
    # Forward: a program owns block_m query rows and steps over block_n keys. Backward: a
    # program owns block_n rows (keys in dK/dV, queries in dQ) and steps over block_m rows
    # of the other side (queries in dK/dV, keys in dQ), FlashAttention-2's split.
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    @property
    def direction(self) -> Direction:
        return self.family.direction

    @property
    def name(self) -> str:
        return (f"attention_{self.direction.value}_{self.dtype.value}_d{self.head_dim_qk}x{self.head_dim_v}"
                f"_{self.family.value}_{self.block_m}x{self.block_n}_w{self.num_warps}_s{self.num_stages}")


@dataclass(frozen=True)
class VendorConfig:
    """A PyTorch SDPA backend as a candidate: it picks its own kernel for any head dim it takes."""

    family: Family
    dtype: DType
    direction: Direction

    @property
    def name(self) -> str:
        return f"attention_{self.direction.value}_{self.dtype.value}_{self.family.value}"


AnyAttentionConfig = AttentionConfig | VendorConfig


@dataclass(frozen=True)
class AttentionFamily(KernelFamily):
    """An attention family: `core.family.KernelFamily` and two facts of attention's own. `direction`
    is what the family computes (None: a vendor backend, which does both); `shared_memory` the bytes
    a config of it stages (None: a library picks its own kernel), read by the rules and the model."""

    direction: Direction | None = None
    shared_memory: Callable[[Any], int] | None = None


class AttentionFamilies(FamilyTable):
    """The registered attention families, found by a config (`of`) or by the name configs spell (`named`)."""

    def __init__(self) -> None:
        super().__init__("attention", key=lambda config: config.family.value)
        self._named: dict[str, AttentionFamily] = {}

    def register(self, family: AttentionFamily) -> AttentionFamily:
        if not isinstance(family, AttentionFamily):
            raise TypeError(f"attention family {family.name!r} is a {type(family).__name__}, not an AttentionFamily")
        self._named[family.name] = super().register(family)
        return family

    def named(self, name: str) -> AttentionFamily:
        family = self._named.get(name)
        if family is None:
            raise KeyError(f"no attention kernel family {name!r} is registered (registered: {', '.join(self._named)})")
        return family


FAMILIES = AttentionFamilies()
