"""What every conv config shares: the family it belongs to, its signature, and the table of families.

A config's `family` names its kernel family; `FAMILIES` finds the family module that owns it
(``families/``), which is how the op's shared code reaches a family's rules, ranking, units and plan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ...core.family import FamilyTable
from .problem import ConvEpilogue, ConvProblem, ConvTypes, Direction


class Family(enum.Enum):
    """A kernel family: one module in ``families/`` and (but the vendor and gemm families) one kernel
    file in ``kernels/``. The value is the family's name in config names and in `FAMILIES`."""

    IMPLICIT_GEMM = "igemm"  # tensor-core tiles over (pixels x channels), groups on the grid
    IMPLICIT_GEMM_FLAT = "igemm-flat"  # the filter's (tap, channel) pairs as one flat index: few channels a group
    IMPLICIT_GEMM_TMA = "igemm-tma"  # the same GEMMs with boxes of pixels moved by TMA (sm_90+, stride 1)
    DIRECT = "direct"  # no tensor cores: channel vectors, for depthwise and few channels per group
    TOEPLITZ = "toeplitz"  # depthwise on tensor cores: each filter row as a banded (Toeplitz) matrix
    GEMM = "gemm"  # a 1x1, stride-1 dense conv as the GEMM op's plain matrix product (families/pointwise.py)
    VENDOR = "vendor"  # cuDNN through PyTorch


class SplitMode(enum.Enum):
    """How backward-weight programs that share an output tile combine their partial sums."""

    WORKSPACE = "ws"  # each writes an fp32 slab; a second kernel sums them in a fixed order (deterministic)
    ATOMIC = "at"  # fp32 atomic adds into one zeroed buffer, then a cast (order varies from run to run)


class SplitReduction:
    """Backward-weight's split over pixels, as both implicit-GEMM configs hold it
    (fields `split_k` and `split_mode`): how many slabs it writes, and its name."""

    @property
    def atomic_split(self) -> bool:
        """The programs of a tile add into one zeroed fp32 buffer instead of each writing a slab."""
        return self.split_mode is SplitMode.ATOMIC and self.split_k > 1

    @property
    def workspace_slabs(self) -> int:
        """fp32 slabs of dw a split backward-weight writes: one per split, or one shared by atomic adds."""
        return 1 if self.atomic_split else self.split_k

    @property
    def split_tag(self) -> str:
        return f"k{self.split_k}" + (self.split_mode.value if self.split_k > 1 else "")


@dataclass(frozen=True)
class ConvSignature:
    """What a kernel computes: direction, element types, and (forward only) the epilogue."""

    direction: Direction
    types: ConvTypes
    epilogue: ConvEpilogue = field(default_factory=ConvEpilogue)

    @property
    def name(self) -> str:
        return f"{self.direction.short}_{self.types.name}"

    @classmethod
    def of(cls, problem: ConvProblem) -> ConvSignature:
        return cls(problem.direction, problem.types, problem.epilogue)


# Every conv kernel family, found by the name its configs carry (`config.family`); each module of
# ``families/`` registers its own.
FAMILIES = FamilyTable("conv", key=lambda config: config.family.value)
