"""A GEMM kernel config: everything that changes the compiled code, and its name."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from .family import FAMILIES, named
from .problem import Epilogue, GemmLayout, GemmProblem, GemmTypes


class Family(enum.Enum):
    """A kernel family: its module in ``families/`` (holding its rules, ranking, units and plan)
    and its kernel file in ``kernels/`` (the vendor path: ``vendor.py``)."""

    TILED = "tiled"  # portable pointer loads, grouped tile order, every arch and stride
    TMA_PERSISTENT = "tma-persistent"  # Hopper tensor descriptors, one program per SM (sm_90+)
    WS_PERSISTENT = "ws-persistent"  # the same in Gluon, a loader warp and two MMA warpgroups (sm_90)
    WS_PINGPONG = "ws-pingpong"  # ws-persistent with each warpgroup on tiles of its own, in turns (sm_90)
    STREAM_K = "stream-k"  # tma-persistent with the last wave's K iterations dealt evenly over SMs
    GEMV = "gemv"  # one row of A (M = 1) on the CUDA cores: B streamed once, K never split
    VENDOR = "vendor"  # cuBLAS (cuBLASLt for fp8) through PyTorch, epilogue as separate steps

    @property
    def uses_tma(self) -> bool:
        """Operands and output move through tensor descriptors: sm_90+, 16-byte aligned, unit-stride rows."""
        return named(self.value).uses_tma

    @property
    def warp_specialised(self) -> bool:
        """A Gluon kernel of a loader warp and two MMA warpgroups (sm_90 only)."""
        return named(self.value).warp_specialised


@dataclass(frozen=True)
class GemmConfig:
    family: Family
    types: GemmTypes
    layout: GemmLayout
    epilogue: Epilogue
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8  # tiles of M visited together, so B tiles stay in L2
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # >1: K is split over programs and reduced in a second stage
    epilogue_split: int = 1  # tma-persistent: store the C tile in this many column slices
    flatten: bool = False  # tma-persistent: one software pipeline across tiles, not per tile
    # Operands below 16-byte alignment (a base or a row not a multiple of 16 bytes: no TMA, no
    # vector loads) are copied first into buffers whose rows are, C copied back after (families/realign.py).
    realign: bool = False

    @property
    def name(self) -> str:
        options = FAMILIES.of(self).name_options(self)  # e.g. tma-persistent's epilogue split
        return (
            f"gemm_{self.types.name}_{self.layout.name}_{self.family.value}"
            f"_{self.block_m}x{self.block_n}x{self.block_k}_w{self.num_warps}_s{self.num_stages}"
            f"_g{self.group_m}_k{self.split_k}{options}{'_realign' if self.realign else ''}_{self.epilogue.name}"
        )

    def for_problem(self, problem: GemmProblem) -> "GemmConfig":
        """This tile shape with the problem's signature (types, layout, epilogue)."""
        return replace(self, types=problem.types, layout=problem.layout, epilogue=problem.epilogue)


@dataclass(frozen=True)
class VendorConfig:
    """The vendor library as a candidate: no tile to choose, it picks its own kernel."""

    types: GemmTypes
    layout: GemmLayout
    epilogue: Epilogue
    family: Family = Family.VENDOR

    @property
    def name(self) -> str:
        return f"gemm_{self.types.name}_{self.layout.name}_vendor_{self.epilogue.name}"


AnyGemmConfig = GemmConfig | VendorConfig
