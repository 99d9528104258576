"""An attention kernel config: everything that changes the compiled code, and its name."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.choice import Choice
from ...core.dtypes import DType
from .problem import Direction


class Family(Choice):
    """A kernel family is one kernel file in ``kernels/`` (the vendor paths: ``vendor.py``)."""

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
        return {Family.FWD: Direction.FORWARD, Family.FWD_TMA: Direction.FORWARD, Family.FWD_WS: Direction.FORWARD,
                Family.BWD: Direction.BACKWARD, Family.BWD_ATOMIC: Direction.BACKWARD,
                Family.BWD_WS: Direction.BACKWARD}.get(self)

    @property
    def uses_tma(self) -> bool:
        return self in (Family.FWD_TMA, Family.FWD_WS, Family.BWD_WS)

    @property
    def warp_specialised(self) -> bool:
        """Written in Gluon for Hopper's warpgroup MMA: a loader warp and two MMA warpgroups."""
        return self in (Family.FWD_WS, Family.BWD_WS)

    @property
    def is_vendor(self) -> bool:
        return self in (Family.SDPA_FLASH, Family.SDPA_CUDNN)


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
