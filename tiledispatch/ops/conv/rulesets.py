"""Conv rule sets: named generators of configs.

A config is a tile bound to a signature (direction, types, epilogue): each family's tile type
says which signatures it serves (`configs`), and a rule set is a list of tiles bound to every
signature in that order. By construction tiny ⊂ tests ⊂ default ⊂ full; the tests prove it
and that `full` never repeats a name.
Rule sets are arch-independent: `Registry.from_rule_set` drops the configs an arch
cannot run (bf16 and the vendor path on the interpreter).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from ...core.dtypes import DType
from ...core.op import RuleSet
from ..gemm import Activation
from .config import (
    AnyConvConfig,
    ConvSignature,
    DirectConfig,
    Family,
    ImplicitGemmConfig,
    PointwiseConfig,
    SplitMode,
    TmaConfig,
    ToeplitzConfig,
    VendorConfig,
)
from .problem import ConvEpilogue, ConvTypes, Direction


@dataclass(frozen=True)
class GemmTile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    split_k: int = 1  # > 1: backward-weight only
    split_mode: SplitMode = SplitMode.WORKSPACE
    groups_per_tile: int = 1  # > 1: forward and backward-data only
    family: Family = Family.IMPLICIT_GEMM  # or IMPLICIT_GEMM_FLAT
    pad_channels: bool = False  # IMPLICIT_GEMM_FLAT only: forward and backward-weight

    def serves(self, direction: Direction) -> bool:
        """Split tiles are backward-weight's, merged ones not; padded ones have no backward-data."""
        weight = direction is Direction.BWD_WEIGHT
        padded_ok = not self.pad_channels or direction is not Direction.BWD_DATA
        return (self.split_k == 1 or weight) and (self.groups_per_tile == 1 or not weight) and padded_ok

    def configs(self, sig: ConvSignature) -> Iterator[ImplicitGemmConfig]:
        if self.serves(sig.direction):
            yield ImplicitGemmConfig(sig, self.block_m, self.block_n, self.block_k, self.group_m, self.num_warps,
                                     self.num_stages, self.split_k, self.split_mode, self.groups_per_tile,
                                     self.family, self.pad_channels)


@dataclass(frozen=True)
class DirectTile:
    block_p: int
    block_c: int
    num_warps: int
    split_k: int = 1  # > 1: backward-weight only
    window: int = 0  # > 0: the sliding-window kernel for this filter width
    run: int = 1  # output pixels along W a thread holds (window kernels only)
    rows: int = 1  # filter rows held per pass (backward-weight window kernels only)
    band: int = 1  # output rows a thread's block spans (backward-weight window kernels only)
    directions: tuple[Direction, ...] = tuple(Direction)  # window tiles: set by `windows` / `weight_windows`
    window_stride: int = 1  # the stride along W a window kernel is built for

    def configs(self, sig: ConvSignature) -> Iterator[DirectConfig]:
        if (self.split_k == 1 or sig.direction is Direction.BWD_WEIGHT) and sig.direction in self.directions:
            yield DirectConfig(sig, self.block_p, self.block_c, self.num_warps, self.split_k, self.window, self.run,
                               self.rows, self.band, self.window_stride)


@dataclass(frozen=True)
class TmaTile:
    """A box of tile_h x tile_w output pixels and two channel blocks (see TmaConfig)."""

    tile_h: int
    tile_w: int
    block_out: int
    block_in: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # > 1: backward-weight only
    split_mode: SplitMode = SplitMode.WORKSPACE
    directions: tuple[Direction, ...] = tuple(Direction)  # backward-data: the forward kernel over dy

    def configs(self, sig: ConvSignature) -> Iterator[TmaConfig]:
        weight = sig.direction is Direction.BWD_WEIGHT
        if sig.types in TMA_TYPES and sig.direction in self.directions and (self.split_k == 1 or weight):
            yield TmaConfig(sig, self.tile_h, self.tile_w, self.block_out, self.block_in, self.num_warps,
                            self.num_stages, self.split_k, self.split_mode)


@dataclass(frozen=True)
class ToeplitzTile:
    """block_m (image, chunk) rows x block_c channels a program, walking `rows` output rows (ToeplitzConfig)."""

    block_m: int
    block_c: int
    num_warps: int
    rows: int
    split_k: int = 1  # > 1: backward-weight only
    directions: tuple[Direction, ...] = (Direction.FORWARD, Direction.BWD_DATA)

    def configs(self, sig: ConvSignature) -> Iterator[ToeplitzConfig]:
        """One config a filter height the kernel is built for (16-bit types only)."""
        if sig.types in TMA_TYPES and sig.direction in self.directions:
            for rows in TOEPLITZ_FILTER_ROWS:
                yield ToeplitzConfig(sig, self.block_m, self.block_c, self.num_warps, self.rows, rows, self.split_k)


@dataclass(frozen=True)
class SignatureOnly:
    """A family with one config a signature, that picks its own kernel (the vendor, the GEMM op)."""

    config_type: type

    def configs(self, sig: ConvSignature) -> Iterator[VendorConfig | PointwiseConfig]:
        yield self.config_type(sig)


# Tiles are bound in this order within a signature: the families that pick their own kernels first.
SIGNATURE_ONLY = (SignatureOnly(VendorConfig), SignatureOnly(PointwiseConfig))
TMA_TYPES = (ConvTypes(DType.FP16), ConvTypes(DType.BF16))  # 16-bit: the TMA and toeplitz families
TOEPLITZ_FILTER_ROWS = (3, 5, 7)


def splits_of(tiles: tuple[TmaTile, ...], split_ks: tuple[int, ...]) -> tuple[TmaTile, ...]:
    """Each backward-weight tile with each split of its pixel reduction."""
    return tuple(replace(t, split_k=k, directions=(Direction.BWD_WEIGHT,)) for k in split_ks for t in tiles)


def windows(tiles: tuple[DirectTile, ...], widths: tuple[int, ...], stride: int = 1) -> tuple[DirectTile, ...]:
    """Each sliding-window tile for each filter width, for forward and backward-data at `stride` along W."""
    return tuple(replace(t, window=width, window_stride=stride, directions=(Direction.FORWARD, Direction.BWD_DATA))
                 for width in widths for t in tiles)


def weight_windows(tiles: tuple[DirectTile, ...], shapes: tuple[tuple[int, int], ...],
                   split_ks: tuple[int, ...] = (1,), stride: int = 1) -> tuple[DirectTile, ...]:
    """Each backward-weight window tile for each (filter rows held, filter width) and split, at `stride` along W."""
    return tuple(replace(t, rows=rows, window=width, split_k=k, window_stride=stride,
                         directions=(Direction.BWD_WEIGHT,))
                 for rows, width in shapes for k in split_ks for t in tiles)


# Small tiles the CPU interpreter runs quickly; both split modes included.
TINY_GEMM = (
    GemmTile(32, 32, 32, 4, 2, 4),
    GemmTile(16, 16, 16, 1, 1, 1),
    GemmTile(32, 16, 16, 2, 2, 2, split_k=3),
    GemmTile(16, 32, 32, 2, 2, 1, split_k=2, split_mode=SplitMode.ATOMIC),
)
TESTS_GEMM = TINY_GEMM + (
    GemmTile(32, 16, 32, 2, 2, 4, family=Family.IMPLICIT_GEMM_FLAT),
    GemmTile(16, 32, 16, 2, 2, 1, split_k=2, family=Family.IMPLICIT_GEMM_FLAT),
    GemmTile(32, 16, 32, 2, 2, 4, family=Family.IMPLICIT_GEMM_FLAT, pad_channels=True),
    GemmTile(16, 32, 16, 2, 2, 1, split_k=2, family=Family.IMPLICIT_GEMM_FLAT, pad_channels=True),
    GemmTile(64, 32, 32, 4, 3, 8),
    GemmTile(32, 64, 16, 4, 3, 8),
    GemmTile(64, 64, 32, 4, 3, 8, split_k=4),
    GemmTile(32, 16, 16, 2, 2, 4, groups_per_tile=2),
    GemmTile(16, 32, 32, 2, 2, 4, groups_per_tile=4),
)
# igemm-flat for few channels a group (the C=3 stem): forward tiles of 64-256 output pixels by
# 64 output channels (the stem's K), stepping 32-64 (tap, channel) pairs; backward-weight tiles of
# 64 output channels by 32-64 pairs (7x7x3 = 147: 3-5 column tiles), the pixels split 16-64 ways.
# Each also with the channels padded to a 16-byte vector (C=3 -> 8: the gathers become vectors).
FLAT_GEMM = tuple(replace(t, family=Family.IMPLICIT_GEMM_FLAT, pad_channels=pad) for pad, t in itertools.product(
    (False, True), (
        GemmTile(128, 64, 32, 4, 3, 8),
        GemmTile(128, 64, 64, 4, 3, 8),
        GemmTile(64, 64, 32, 4, 4, 8),
        GemmTile(256, 64, 32, 8, 3, 8),
        *(GemmTile(64, n, 64, 4, 3, 8, split_k=k) for n in (32, 64) for k in (16, 32, 64)),
    )))
# For sm_80+ tensor cores: the GEMM op's proven shapes, narrowed in N where K/G or C/G is
# small, and split backward-weight tiles for its long pixel reductions.
DEFAULT_GEMM = TESTS_GEMM + (
    GemmTile(128, 128, 64, 8, 3, 8),
    GemmTile(128, 128, 64, 8, 4, 8),
    GemmTile(128, 64, 64, 4, 4, 8),
    GemmTile(64, 128, 64, 4, 4, 8),
    GemmTile(64, 128, 64, 4, 3, 8),
    GemmTile(128, 256, 64, 8, 3, 8),
    GemmTile(128, 256, 64, 8, 4, 8),
    GemmTile(64, 256, 64, 8, 3, 8),
    GemmTile(256, 128, 64, 8, 3, 8),
    # Narrow N for C/G = K/G = 32 (conv1d_g16, conv3d_g4) and the stem. 256 x 32 x 32 over 8 warps and
    # 3 stages ran 6-19 % slower than 128 x 32 x 32 on every row of the suite that timed both, on the
    # H100 and the H200 (benchmarks/results/*/conv.csv), and was the best timed on none; the model
    # ranks it first on 10 of them, so it is in `full` only.
    GemmTile(128, 32, 32, 4, 4, 8),
    GemmTile(128, 16, 16, 4, 4, 8),
    GemmTile(64, 64, 64, 4, 4, 8, split_k=8),
    GemmTile(128, 128, 64, 8, 3, 8, split_k=4),
    GemmTile(64, 64, 64, 4, 4, 8, split_k=16),
    *FLAT_GEMM,
    GemmTile(32, 32, 64, 4, 4, 8, split_k=32),
    GemmTile(64, 64, 64, 4, 4, 8, split_k=8, split_mode=SplitMode.ATOMIC),
    # Backward-weight with the carried pixel walk is issue-bound on small tiles (~29 instructions
    # a pixel row a thread loads): 128-wide tiles share a step's walk among more MMAs. The
    # ranking's model puts these first for resnet50 3x3 / 1x1 and unet (K/G, C/G of 128-1024).
    GemmTile(128, 128, 64, 4, 3, 8, split_k=8),
    GemmTile(128, 128, 64, 8, 3, 8, split_k=16),
    GemmTile(128, 256, 64, 8, 3, 8, split_k=8),
    # Merged groups for C/G, K/G of 4-16 (ResNeXt's 8 and 16): 32-128 channels per tile.
    GemmTile(128, 32, 32, 4, 3, 8, groups_per_tile=4),
    GemmTile(128, 64, 64, 4, 3, 8, groups_per_tile=8),
    GemmTile(128, 32, 32, 4, 3, 8, groups_per_tile=2),
    GemmTile(64, 64, 64, 4, 3, 8, groups_per_tile=4),
    GemmTile(128, 128, 128, 8, 3, 8, groups_per_tile=16),
)
FULL_GEMM = tuple(
    GemmTile(bm, bn, bk, w, s, 8, k)
    for bm, bn, bk, w, s, k in itertools.product(
        (16, 32, 64, 128, 256), (16, 32, 64, 128, 256), (16, 32, 64), (4, 8), (2, 3, 4), (1, 4, 16)
    )
)
TINY_DIRECT = (
    DirectTile(16, 16, 2),
    DirectTile(32, 8, 2, split_k=3),
) + windows((DirectTile(8, 16, 2, run=3),), (3,)) + weight_windows((DirectTile(4, 16, 1, run=3),), ((3, 3),), (2,))
# Backward-weight windows holding all, some (passes; the last one partly masked) or one of the filter rows.
TESTS_DIRECT = TINY_DIRECT + (
    DirectTile(8, 32, 4),
    DirectTile(16, 16, 4, split_k=2),
) + windows((DirectTile(8, 16, 2, run=3),), (1, 2, 5)) + windows((DirectTile(4, 32, 1, run=5),), (3,)) + (
    weight_windows((DirectTile(4, 16, 1, run=3),), ((1, 1), (1, 2), (3, 5), (2, 3)), (1, 3))
    + weight_windows((DirectTile(2, 32, 2, run=5),), ((5, 5), (1, 3)), (1,))
    + weight_windows((DirectTile(4, 16, 1, run=3, band=2),), ((3, 3), (2, 5)), (1, 2))
    # stride 2 along W (backward-data's runs even: rules), and backward-weight
    + windows((DirectTile(8, 16, 2, run=4),), (3,), stride=2) + windows((DirectTile(4, 32, 1, run=6),), (2, 5), stride=2)
    + weight_windows((DirectTile(4, 16, 1, run=3),), ((3, 3), (2, 5), (1, 2)), (1, 2), stride=2))
# Depthwise forward and backward-data by sliding windows (kernels/direct.py), for the filter
# widths of MobileNet/EfficientNet (3, 5), ConvNeXt (7) and Mamba's causal conv1d (4). A
# thread holds one run of `run` pixels of 4-8 channels (block_c / 8 or / 4 lanes across the
# channels, the rest of the threads over runs); runs of 7 and 14 cover the 56, 28, 14 and 7
# wide maps of those networks without an idle tail. Runs of 14 were the fastest on the H200
# for every width (benchmarks/results/h200/conv_depthwise.csv: 5x5 forward 22.3 -> 16.2 us).
WINDOW_WIDTHS = (3, 4, 5, 7)
DEFAULT_WINDOW_TILES = (  # one run a thread, 4-8 channels: 127-255 registers (families/direct_window.py)
    DirectTile(16, 64, 4, run=4),
    DirectTile(16, 64, 4, run=7),
    DirectTile(16, 64, 4, run=8),
    DirectTile(16, 64, 4, run=14),
    DirectTile(8, 64, 4, run=14),
    DirectTile(8, 32, 2, run=14),
    DirectTile(8, 128, 4, run=8),
)
# Channel vectors of 64-128 (8-16 bytes a lane), a few pixel rows per program; the tall
# tiles give each thread 4-8 rows of one channel vector, so its per-tap weight loads and
# tap arithmetic are shared by 4-8 row loads (sm_90 SASS: 2 rows a thread spend ~150
# instructions a tap on 16 FMAs).
DEFAULT_DIRECT = TESTS_DIRECT + (
    DirectTile(32, 64, 4),
    DirectTile(16, 128, 4),
    DirectTile(64, 64, 8),
    DirectTile(8, 256, 4),
    DirectTile(64, 64, 4),
    DirectTile(128, 64, 4),
    DirectTile(256, 64, 8),
    DirectTile(64, 128, 8),
    DirectTile(64, 32, 4, split_k=16),
    DirectTile(32, 64, 4, split_k=32),
    DirectTile(128, 32, 8, split_k=64),
) + windows(DEFAULT_WINDOW_TILES, WINDOW_WIDTHS)
# Depthwise backward-weight by sliding windows (kernels/direct.py): the accumulators are the taps of
# `rows` filter rows, rows x window x (block_p * block_c / threads) a thread, so the channels a thread
# holds shrink as the filter grows (3x3: 8, one 16-byte bf16 vector; 5x5: 2-4; 7x7: 1-2) to stay
# within 255 registers (sm_90 builds: 168-255, families/direct_window.py). A band of 2-4 output rows shares each
# loaded input row among 2-4 filter rows: 7x7 run 7 band 2 spends 1.88 instructions an FMA, run 7
# alone 2.49. 1-D (Mamba's k4) holds one filter row and long runs. Splits of the pixels: 16-64
# programs a channel block, the fp32 workspace summed by conv_weight_reduce.
WEIGHT_WINDOW_TILES = {
    (3, 3): (DirectTile(16, 64, 4, run=7), DirectTile(16, 64, 4, run=4, band=2), DirectTile(8, 64, 4, run=4, band=2)),
    (5, 5): (DirectTile(8, 64, 4, run=4, band=2), DirectTile(4, 64, 4, run=7, band=2),
             DirectTile(4, 64, 4, run=4, band=4)),
    (7, 7): (DirectTile(4, 64, 4, run=7, band=2), DirectTile(4, 64, 4, run=4, band=4),
             DirectTile(2, 64, 4, run=7, band=4)),
    (1, 4): (DirectTile(16, 64, 4, run=16), DirectTile(16, 64, 4, run=8), DirectTile(8, 64, 4, run=16)),
}
# 22 and 44 splits of 6 channel blocks (C = 384) and 12 and 24 of 11 (C = 672) are one and two
# programs per SM of an H100/H200's 132: a busiest SM with one program more than the others idles the rest.
WEIGHT_WINDOW_SPLITS = {(3, 3): (22, 32, 44, 64), (5, 5): (12, 16, 24), (7, 7): (22, 32, 44), (1, 4): (16, 32, 64)}
DEFAULT_WEIGHT_WINDOWS = tuple(itertools.chain.from_iterable(
    weight_windows(tiles, (shape,), WEIGHT_WINDOW_SPLITS[shape]) for shape, tiles in WEIGHT_WINDOW_TILES.items())
) + weight_windows((DirectTile(16, 64, 4, run=16),), ((1, 3), (1, 5), (1, 7)), (32,))
DEFAULT_DIRECT = DEFAULT_DIRECT + DEFAULT_WEIGHT_WINDOWS
# Stride 2 along W: the downsampling depthwise layers of MobileNet (3x3) and EfficientNet (3x3, 5x5),
# off the stride-1 windows above, run on cuDNN (backward-data at 0.2-0.4 TB/s) without these. Forward
# and backward-data windows of even runs (backward-data's rule) covering their 7-56 wide outputs;
# backward-weight one output row a block (a band shares input rows only at stride 1 along H). On the
# H100 (results/h100/conv_depthwise_strided.csv) backward-data ran 2.2-5.6x cuDNN, forward 1.0-1.5x,
# backward-weight 0.45-0.75x (cuDNN keeps it).
STRIDED_WINDOW_TILES = (DirectTile(16, 64, 4, run=4), DirectTile(16, 64, 4, run=8), DirectTile(16, 64, 4, run=14),
                        DirectTile(8, 64, 4, run=14), DirectTile(8, 32, 2, run=14))
STRIDED_WINDOW_WIDTHS = (3, 5)
STRIDED_WEIGHT_WINDOWS = weight_windows((DirectTile(16, 64, 4, run=7), DirectTile(8, 64, 4, run=4)), ((3, 3),),
                                        (22, 44), stride=2) + weight_windows(
    (DirectTile(4, 64, 4, run=7), DirectTile(8, 64, 4, run=4)), ((5, 5),), (12, 24), stride=2)
DEFAULT_DIRECT = DEFAULT_DIRECT + windows(STRIDED_WINDOW_TILES, STRIDED_WINDOW_WIDTHS, stride=2) + STRIDED_WEIGHT_WINDOWS
# `full` adds other splits of the 2-D windows (6-11 channel blocks of 64 x 8-48 splits: 48-528 programs).
FULL_WEIGHT_WINDOWS = tuple(itertools.chain.from_iterable(
    weight_windows(tiles, (shape,), tuple(k for k in (8, 11, 16, 24, 48) if k not in WEIGHT_WINDOW_SPLITS[shape]))
    for shape, tiles in WEIGHT_WINDOW_TILES.items() if shape[0] > 1))
# `full` adds forward and backward-data windows of 2-8 channels a thread (8-16 warps an SM at
# 2-4 channels, where the 8-channel default tiles hold 168-193 registers: 2 programs an SM) and runs of 2-14.
FULL_WINDOWS = windows(tuple(
    DirectTile(p, c, w, run=r)
    for (p, c, w), r in itertools.product(((16, 32, 4), (16, 64, 8), (8, 64, 4), (32, 32, 8), (8, 32, 2),
                                           (16, 16, 2), (32, 16, 4), (16, 16, 4), (8, 32, 4), (16, 64, 4),
                                           (32, 32, 4)), (2, 4, 7, 8, 14))), WINDOW_WIDTHS)
FULL_WINDOWS += windows(tuple(  # stride 2 along W: the even runs, every direction's rule holds
    DirectTile(p, c, w, run=r)
    for (p, c, w), r in itertools.product(((16, 32, 4), (16, 64, 8), (8, 64, 4), (32, 32, 8), (8, 32, 2), (16, 64, 4)),
                                          (2, 4, 8, 14))), STRIDED_WINDOW_WIDTHS, stride=2)
FULL_DIRECT = FULL_WEIGHT_WINDOWS + FULL_WINDOWS + tuple(
    DirectTile(p, c, w, k)
    for p, c, w, k in itertools.product((8, 16, 32, 64, 128), (16, 32, 64, 128, 256), (2, 4, 8), (1, 8, 32))
)

# The igemm-tma family (kernels/implicit_gemm_tma.py): fp16/bf16, forward and backward-weight.
# The interpreter's tiles: a 2-D box and a 1-D one (1-D convs take tile_h = 1 only), both split modes.
TINY_TMA = (
    TmaTile(4, 8, 16, 16, 4, 2),
    TmaTile(1, 32, 32, 16, 4, 2),
    TmaTile(4, 8, 16, 32, 4, 2, split_k=3, directions=(Direction.BWD_WEIGHT,)),
)
TESTS_TMA = TINY_TMA + (
    TmaTile(2, 16, 32, 32, 4, 3),
    TmaTile(1, 16, 16, 16, 4, 2, split_k=2, directions=(Direction.BWD_WEIGHT,)),
    TmaTile(4, 4, 32, 16, 4, 2, split_k=2, split_mode=SplitMode.ATOMIC, directions=(Direction.BWD_WEIGHT,)),
)
# For sm_90, timed on the H200 (benchmarks/results/h200/conv_tma.csv). Boxes of 128-256
# pixels shaped for the maps of the suite's dense convs (14x14: 8x16 and 16x16 boxes cover 256
# pixels in 1-2 boxes; 28-128 wide: 4x32 and 1-row boxes); forward steps 64 input channels a box
# (128 bytes: one TMA swizzle line). Backward-weight boxes one row tall keep dy^T in shared memory
# for wgmma; taller ones copy it to registers (families/igemm_tma.py, register_a_operand): both are listed.
# Backward-data at stride 1 runs the forward's boxes over dy, reading the filter turned in place: on the
# H100 they ran ResNet's 3x3, UNet's and the dilated 3x3 at 18.1, 73.2 and 28.7 us, where igemm's best
# took 24.2, 101.7 and 31.3 (results/h100/conv_tma_turned_bwd_data.csv). One warpgroup on a 128 x 128
# tile (4 warps, one program an SM) ran ResNet's 3x3 at 15.8 us forward and 15.7 backward-data on the
# H100, the fastest of `full` (results/h100/conv_sweep_igemm-tma_forward_dense.csv).
DEFAULT_TMA_FORWARD = tuple(replace(t, directions=(Direction.FORWARD, Direction.BWD_DATA)) for t in (
    TmaTile(8, 16, 128, 64, 8, 3),
    TmaTile(8, 16, 128, 64, 8, 4),
    TmaTile(8, 16, 128, 64, 4, 4),
    TmaTile(16, 8, 128, 64, 4, 4),
    TmaTile(8, 16, 256, 64, 8, 3),
    TmaTile(16, 8, 128, 64, 8, 3),
    TmaTile(4, 32, 128, 64, 8, 3),
    TmaTile(16, 16, 128, 64, 8, 3),
    TmaTile(8, 8, 128, 64, 4, 4),
    TmaTile(8, 16, 64, 64, 4, 4),
    TmaTile(1, 128, 128, 64, 8, 3),
    TmaTile(1, 128, 256, 64, 8, 3),
))
# Backward-weight runs taps x (K/G, C/G tiles) programs times the split: splits of 3, 6, 12 and 14
# fill the 132 SMs where 9 or 27 taps leave powers of two a wave and a sliver (9 x 14 = 126).
# Not here: 8x8x64x64 boxes (in `full`). They tile a 56-wide map exactly, where 8x16 and 1x64 boxes
# overhang it by 12.5 %: the 3-D video conv's backward-weight ran 107-113 us over 14 splits (cuDNN
# 106-108), 121-135 over 16, against 144-149 for 8x16's best (H100: results/h100/
# conv_sweep_igemm-tma_bwd_weight_8x8.csv, conv_8x8_in_default.csv). But the ranking takes them over
# 16 splits there, and over 14 on regnet's 28x28 maps, which both boxes overhang alike, where they ran
# 100.6-101.0 us against 94.8-95.1 for the 8x16 pick (conv_sweep_igemm-tma_bwd_weight_8x8_grouped.csv).
# cuDNN keeps the video conv either way, so in `default` they would cost the dispatcher regnet's 6 %.
WEIGHT_TMA_TILES = (
    TmaTile(1, 128, 128, 128, 8, 3),
    TmaTile(1, 64, 128, 128, 8, 4),
    TmaTile(8, 16, 128, 128, 8, 3),
    TmaTile(16, 8, 128, 128, 8, 3),
    TmaTile(4, 16, 128, 128, 8, 4),
    TmaTile(8, 16, 64, 64, 4, 3),
    TmaTile(1, 128, 64, 64, 4, 3),
)
WEIGHT_TMA_SPLITS = (1, 2, 3, 4, 6, 8, 12, 14, 16)
DEFAULT_TMA = TESTS_TMA + DEFAULT_TMA_FORWARD + splits_of(WEIGHT_TMA_TILES, WEIGHT_TMA_SPLITS) + (
    TmaTile(8, 16, 128, 128, 8, 3, split_k=8, split_mode=SplitMode.ATOMIC, directions=(Direction.BWD_WEIGHT,)),
    TmaTile(1, 128, 128, 128, 8, 3, split_k=8, split_mode=SplitMode.ATOMIC, directions=(Direction.BWD_WEIGHT,)),
)
FULL_TMA = tuple(
    TmaTile(h, w, bo, bi, warps, stages, k)
    for (h, w), bo, bi, warps, stages, k in itertools.product(
        ((1, 64), (1, 128), (4, 32), (8, 8), (8, 16), (16, 8), (16, 16)), (64, 128, 256), (64, 128), (4, 8), (3, 4),
        (1, 4, 16))
)

# The toeplitz family (kernels/toeplitz.py): Gluon, GPU only, so no tiny tiles. Timed on the H200 on
# the suite's depthwise 3x3, 5x5 and 7x7 maps (28x28, 14x14): 16 rows x 32 channels over 16 warps
# walking 28 rows was the fastest forward (7x7 1.8x the window kernel), 16 x 16 over 8 warps next;
# on the H100 tiles of 1 channel a warp (16 x 8 over 8 warps, 3 programs an SM) ran 1.4x slower.
# Backward-weight walks the same tiles, the pixels its MMAs' reduction: of the 72 of `full` on the
# H100 (benchmarks/results/h100/conv_toeplitz_weight_banded.csv) 16 x 32 over 16 warps was the
# fastest at 5x5 and 7x7 (1.5x and 1.6x cuDNN) with a program a block of (image, chunk) rows (4
# and 8 of them there), and at 3x3 (0.98x). Walking 56 rows with 16 programs a channel block took
# ConvNeXt's 56x56 7x7 at 1.58x cuDNN (conv_toeplitz_weight_banded_shapes.csv).
_WEIGHT = (Direction.BWD_WEIGHT,)
_ROWS = (Direction.FORWARD, Direction.BWD_DATA)
TESTS_TOEPLITZ = (ToeplitzTile(16, 32, 16, 28), ToeplitzTile(16, 16, 8, 14),
                  ToeplitzTile(16, 32, 16, 56, 4, _WEIGHT), ToeplitzTile(16, 32, 16, 14, 3, _WEIGHT))
DEFAULT_TOEPLITZ = TESTS_TOEPLITZ + tuple(ToeplitzTile(16, 32, 16, 56, k, _WEIGHT) for k in (8, 16))
FULL_TOEPLITZ = DEFAULT_TOEPLITZ + tuple(
    ToeplitzTile(m, c, w, r, k, directions) for m, c, w, r, (k, directions) in itertools.product(
        (16, 32), (16, 32), (8, 16), (14, 28, 56), ((1, _ROWS),) + tuple((k, _WEIGHT) for k in (2, 4, 8, 16)))
    if c % w == 0 and c // w <= 2 and ToeplitzTile(m, c, w, r, k, directions) not in DEFAULT_TOEPLITZ)

_CPU_TYPES = (ConvTypes(DType.FP16), ConvTypes(DType.FP32), ConvTypes(DType.FP32, allow_tf32=True))
TYPES = _CPU_TYPES + (ConvTypes(DType.BF16),)  # no bf16 tl.dot in the interpreter: its arch drops them
EPILOGUES = tuple(ConvEpilogue(bias, activation, residual)
                  for bias, activation, residual in itertools.product((False, True), Activation, (False, True)))


def problem_class(problem) -> ConvSignature:
    """A problem's class: its signature (direction, types, epilogue), which every config must
    match (`rules.signature_refusal`, the vendor's own check)."""
    return ConvSignature.of(problem)


def signatures(epilogues=EPILOGUES, within: ConvSignature | None = None) -> Iterator[ConvSignature]:
    """Every signature, or only `within`: signatures are `_bind`'s outer loop, so one class comes
    out in the order of the whole set."""
    for direction, types in itertools.product(Direction, TYPES):
        for epilogue in epilogues if direction is Direction.FORWARD else (ConvEpilogue(),):
            sig = ConvSignature(direction, types, epilogue)
            if within is None or sig == within:
                yield sig


def _bind(tiles: Iterable, epilogues=EPILOGUES, within: ConvSignature | None = None) -> Iterator[AnyConvConfig]:
    """Each tile bound to each signature it serves, signature by signature, in the order of `tiles`."""
    for sig in signatures(epilogues, within):
        for tile in tiles:
            yield from tile.configs(sig)


# Each rule set's tiles, family by family. A new family adds its tiles here.
TINY = (*SIGNATURE_ONLY, *TINY_TMA, *TINY_GEMM, *TINY_DIRECT)
TESTS = (*SIGNATURE_ONLY, *TESTS_TOEPLITZ, *TESTS_TMA, *TESTS_GEMM, *TESTS_DIRECT)
DEFAULT = (*SIGNATURE_ONLY, *DEFAULT_TOEPLITZ, *DEFAULT_TMA, *DEFAULT_GEMM, *DEFAULT_DIRECT)
FULL = (*SIGNATURE_ONLY, *FULL_TOEPLITZ, *FULL_TMA, *FULL_GEMM, *FULL_DIRECT)  # bound without epilogues


def tiny(within: ConvSignature | None = None) -> Iterator[AnyConvConfig]:
    return _bind(TINY, within=within)


def tests(within: ConvSignature | None = None) -> Iterator[AnyConvConfig]:
    return _bind(TESTS, within=within)


def default(within: ConvSignature | None = None) -> Iterator[AnyConvConfig]:
    return _bind(DEFAULT, within=within)


def full(within: ConvSignature | None = None) -> Iterator[AnyConvConfig]:
    """Every default config, plus the whole tile space for each signature without epilogue."""
    seen = set()
    for config in itertools.chain(default(within), _bind(FULL, (ConvEpilogue(),), within)):
        if config not in seen:
            seen.add(config)
            yield config


RULE_SETS = {RuleSet.TINY: tiny, RuleSet.TESTS: tests, RuleSet.DEFAULT: default, RuleSet.FULL: full}
