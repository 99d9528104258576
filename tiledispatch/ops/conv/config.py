"""A conv kernel config: everything that changes the compiled code, and its name."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

from .problem import ConvEpilogue, ConvProblem, ConvTypes, Direction


class Family(enum.Enum):
    """A kernel family is one kernel file in ``kernels/`` (the vendor path: ``vendor.py``)."""

    IMPLICIT_GEMM = "igemm"  # tensor-core tiles over (pixels x channels), groups on the grid
    IMPLICIT_GEMM_FLAT = "igemm-flat"  # the filter's (tap, channel) pairs as one flat index: few channels a group
    IMPLICIT_GEMM_TMA = "igemm-tma"  # the same GEMMs with boxes of pixels moved by TMA (sm_90+, stride 1)
    DIRECT = "direct"  # no tensor cores: channel vectors, for depthwise and few channels per group
    TOEPLITZ = "toeplitz"  # depthwise on tensor cores: each filter row as a banded (Toeplitz) matrix
    GEMM = "gemm"  # a 1x1, stride-1 dense conv as the GEMM op's plain matrix product (pointwise.py)
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


@dataclass(frozen=True)
class ImplicitGemmConfig(SplitReduction):
    """An implicit GEMM: block_m x block_n output tile, block_k deep steps of the reduction.

    The GEMM view per group: forward M = output pixels, N = K/G, reduction = taps x C/G;
    backward-data M = input pixels, N = C/G, reduction = taps x K/G; backward-weight
    M = K/G, N = C/G (per tap), reduction = output pixels, split over `split_k` programs.
    Family `igemm-flat` (forward and backward-weight) takes taps x C/G as one flat index
    where the others take C/G per tap: forward's reduction, backward-weight's N. With
    `pad_channels` it first copies x (and forward's w) with C padded to a whole 16-byte
    vector of zeros, so that a C=3 stem's gathers are vectors (plan.py, name `_pc`).
    """

    signature: ConvSignature
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8  # tiles of M visited together, so the filter tiles they share stay in L2
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # backward-weight only: programs sharing one tile of dw
    split_mode: SplitMode = SplitMode.WORKSPACE
    groups_per_tile: int = 1  # > 1: that many groups merged into one block-diagonal tile (small C/G, K/G)
    family: Family = Family.IMPLICIT_GEMM
    pad_channels: bool = False  # igemm-flat: C padded to 16-byte vectors first (ConvProblem.channels_padded)

    @property
    def name(self) -> str:
        merge = f"_gt{self.groups_per_tile}" if self.groups_per_tile > 1 else ""
        pad = "_pc" if self.pad_channels else ""
        return (f"conv_{self.signature.name}_{self.family.value}_{self.block_m}x{self.block_n}x{self.block_k}"
                f"_w{self.num_warps}_s{self.num_stages}_g{self.group_m}_{self.split_tag}{merge}{pad}"
                f"_{self.signature.epilogue.name}")

    def for_problem(self, problem: ConvProblem) -> ImplicitGemmConfig:
        return replace(self, signature=ConvSignature.of(problem))


@dataclass(frozen=True)
class TmaConfig(SplitReduction):
    """An implicit GEMM over boxes of tile_h x tile_w output pixels that TMA moves (kernels/implicit_gemm_tma.py).

    Forward and backward-weight of stride-1 convs on sm_90+, and backward-data as the forward
    kernel over dy (`as_forward`), which reads the conv's filter turned in place. The channel blocks are
    named by what they block, the same in both directions: `block_out` output channels
    (K/G: forward's N, backward-weight's M) and `block_in` input channels (C/G:
    forward's reduction step, backward-weight's N). Forward's M and backward-weight's
    reduction step are the tile's pixels. Name: ``igemm-tma_{tile_h}x{tile_w}x{block_out}x{block_in}``.
    """

    signature: ConvSignature
    tile_h: int
    tile_w: int
    block_out: int
    block_in: int
    num_warps: int = 8
    num_stages: int = 3
    split_k: int = 1  # backward-weight only: programs sharing one tile of dw
    split_mode: SplitMode = SplitMode.WORKSPACE
    family: Family = Family.IMPLICIT_GEMM_TMA

    @property
    def name(self) -> str:
        return (f"conv_{self.signature.name}_{self.family.value}_{self.tile_h}x{self.tile_w}x{self.block_out}"
                f"x{self.block_in}_w{self.num_warps}_s{self.num_stages}_{self.split_tag}_{self.signature.epilogue.name}")

    @property
    def pixels(self) -> int:
        """Output pixels a box holds: forward's M, backward-weight's reduction step."""
        return self.tile_h * self.tile_w

    def as_forward(self) -> TmaConfig:
        """A backward-data config as the forward kernel it runs over dy (ConvProblem.data_gradient_as_forward)."""
        return replace(self, signature=replace(self.signature, direction=Direction.FORWARD))

    @property
    def gemm_tile(self) -> tuple[int, int, int]:
        """(M, N, reduction step) of the GEMM tile in the direction's own terms (as ImplicitGemmConfig's)."""
        if self.signature.direction is Direction.BWD_WEIGHT:
            return self.block_out, self.block_in, self.pixels
        return self.pixels, self.block_out, self.block_in


@dataclass(frozen=True)
class DirectConfig:
    """Direct convolution: block_p pixels x block_c channels per program, fp32 FMAs, no tensor cores.

    Memory-bound by design: channels-last makes block_c consecutive channels one vector
    load. Backward-weight splits the pixels over `split_k` programs (fp32 workspace).

    `window` > 0 selects the sliding-window kernels (depthwise, filter width = window,
    stride and dilation 1 along W): block_p rows of the tile are then runs of `run`
    output pixels along W, each thread holding a run in registers, so a program covers
    block_p * run pixels. `window` = 0 is the per-tap kernel (run = 1). Backward-weight's
    window kernel holds the taps of `rows` filter rows as its accumulators (rows x window
    per channel: one pass over its pixels per `rows` filter rows), named `win{rows}x{window}`,
    and may hold `band` output rows of runs (a thread's block is band x run outputs, whose
    band + rows - 1 input rows it loads once each), named `r{run}b{band}`. `window_stride`
    is the conv's stride along W the window kernel is built for (1, or 2 for the downsampling
    layers of MobileNet and EfficientNet), named `win{shape}s{stride}`.
    """

    signature: ConvSignature
    block_p: int
    block_c: int
    num_warps: int = 4
    split_k: int = 1
    window: int = 0
    run: int = 1
    rows: int = 1  # backward-weight window kernels only: filter rows held per pass
    band: int = 1  # backward-weight window kernels only: output rows a thread's block spans
    window_stride: int = 1  # window kernels only: the stride along W they are built for
    family: Family = Family.DIRECT

    @property
    def name(self) -> str:
        shape = f"{self.rows}x{self.window}" if self.rows > 1 else f"{self.window}"
        stride = f"s{self.window_stride}" if self.window_stride > 1 else ""
        band = f"b{self.band}" if self.band > 1 else ""
        window = f"_win{shape}{stride}r{self.run}{band}" if self.window else ""
        return (f"conv_{self.signature.name}_{self.family.value}_{self.block_p}x{self.block_c}_w{self.num_warps}"
                f"_k{self.split_k}{window}_{self.signature.epilogue.name}")

    @property
    def pixels_per_program(self) -> int:
        return self.block_p * self.run

    def runs(self, p: ConvProblem) -> int:
        """Runs a forward or backward-data window kernel computes: its output rows' runs of `run`
        columns. Backward-data at stride 2 starts its runs a column early where the padding's
        parity asks (kernels/direct.py, conv_bwd_data_direct_window): one run more a row at times."""
        spatial = p.output_size if p.direction is Direction.FORWARD else p.input_size
        width = spatial[-1]
        if p.direction is Direction.BWD_DATA:
            width += (p.padding[-1] + self.window + 1) % self.window_stride
        return p.n * math.prod(spatial[:-1]) * -(-width // self.run)

    @property
    def window_columns(self) -> int:
        """Source columns a window kernel's run loads once each, a filter row: input columns
        (run - 1) x stride + window wide for forward and backward-weight, dy columns that reach the
        run's input columns for backward-data. The kernels' own count (their loops' bound)."""
        from .kernels.direct import window_columns

        return window_columns(self.run, self.window, self.window_stride,
                              self.signature.direction is Direction.BWD_DATA)

    @property
    def workspace_slabs(self) -> int:
        return self.split_k


@dataclass(frozen=True)
class ToeplitzConfig:
    """Depthwise 2-D convolution on tensor cores, every direction (kernels/toeplitz.py).

    A program owns `block_c` channels (the MMA's batch, spread over the warps) and
    `block_m` (image, chunk of 8 output columns) rows, and walks down `rows` output rows
    of them; `filter_rows` (the filter height) is compiled in, as a window kernel's width.
    Backward-weight's programs each walk a share of those blocks, `split_k` shares, into
    as many fp32 slabs that a second kernel sums. Name:
    ``toeplitz_{block_m}x{block_c}_w{num_warps}_r{rows}_f{filter_rows}`` (+ ``_k{split_k}``).
    """

    signature: ConvSignature
    block_m: int
    block_c: int
    num_warps: int
    rows: int
    filter_rows: int
    split_k: int = 1  # backward-weight only: the workspace's slabs
    family: Family = Family.TOEPLITZ

    @property
    def name(self) -> str:
        split = f"_k{self.split_k}" if self.signature.direction is Direction.BWD_WEIGHT else ""
        return (f"conv_{self.signature.name}_{self.family.value}_{self.block_m}x{self.block_c}_w{self.num_warps}"
                f"_r{self.rows}_f{self.filter_rows}{split}_{self.signature.epilogue.name}")

    @property
    def workspace_slabs(self) -> int:
        return self.split_k


@dataclass(frozen=True)
class VendorConfig:
    """cuDNN through PyTorch as a candidate: it picks its own algorithm."""

    signature: ConvSignature
    family: Family = Family.VENDOR

    @property
    def name(self) -> str:
        return f"conv_{self.signature.name}_vendor_{self.signature.epilogue.name}"


@dataclass(frozen=True)
class PointwiseConfig:
    """A 1x1, stride-1, unpadded dense conv run as one GEMM by the GEMM op's Triton kernels.

    Channels-last, such a conv is a matrix product of its tensors' 2-D views (pixels x
    channels), which the GEMM op's persistent TMA kernels run faster than the conv's
    implicit GEMMs; the GEMM op's own ranking picks the tile, so there is one config a
    signature, as for the vendor.
    """

    signature: ConvSignature
    family: Family = Family.GEMM

    @property
    def name(self) -> str:
        return f"conv_{self.signature.name}_gemm_{self.signature.epilogue.name}"


AnyConvConfig = ImplicitGemmConfig | TmaConfig | DirectConfig | ToeplitzConfig | PointwiseConfig | VendorConfig
