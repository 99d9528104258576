"""The one validity predicate for conv configs, its auto-corrector, and `supports`.

Each rule is a member of `ConvRule`, so an error names the rule it breaks and tests
can check for exactly that rule.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, fields, replace

from ...arch import Feature
from ...core.dtypes import DType
from ...core.errors import InvalidConfigError
from ...core.validation import Correction, Finding, Severity, ValidationResult
from . import vendor
from .config import (
    AnyConvConfig,
    ConvSignature,
    DirectConfig,
    Family,
    ImplicitGemmConfig,
    PointwiseConfig,
    SplitMode,
    SplitReduction,
    TmaConfig,
    ToeplitzConfig,
    VendorConfig,
)
from .kernels.toeplitz import KW as TOEPLITZ_KW
from .kernels.toeplitz import MAX_WIDTH as TOEPLITZ_MAX_WIDTH
from .kernels.toeplitz import NW as TOEPLITZ_NW
from .problem import ConvProblem, Direction

BLOCK_CHOICES = (16, 32, 64, 128, 256)
DIRECT_BLOCK_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WARP_CHOICES = (1, 2, 4, 8, 16)
STAGE_CHOICES = tuple(range(1, 9))
MAX_SPLIT_K = 64
MERGE_CHOICES = (1, 2, 4, 8, 16)
REGISTER_RESERVE = 64  # registers for addresses, operands and loop state besides the accumulator
# The direct family loops over C/G (forward) or K/G (backward-data) per lane: beyond this
# many channels per group the tensor cores of the implicit GEMM win by far.
DIRECT_MAX_CHANNELS_PER_GROUP = 16
# The igemm-flat family walks the filter's (tap, channel) pairs flat: it pays where the igemm
# family would pad each tap's few channels to a whole block of 16 or more.
FLAT_MAX_CHANNELS_PER_GROUP = 8
# The sliding-window kernels unroll the filter width and a thread's run of output pixels:
# every window x run pair is one FMA per channel in the unrolled body.
MAX_WINDOW = 11
MAX_RUN = 16
WINDOW_STRIDES = (1, 2)  # strides along W the window kernels are built for
# The igemm-tma family: a box dim of a tensor descriptor holds at most 256 elements (TMA's limit),
# and a box of pixels is a power-of-two tile of 1..256 rows and columns.
TMA_TILE_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TMA_BOX_MAXIMUM = 256
TMA_DTYPES = (DType.FP16, DType.BF16)
# Why no Triton or Gluon kernel takes a problem with `wide_offsets`: their index arithmetic is
# 32-bit, and an offset past it wraps to an address outside the tensor.
WIDE_OFFSETS = ("element offsets past 2**31 need 64-bit indexing, and the Triton kernels index in 32 bits; "
                "the vendor path (cuDNN through PyTorch, on a GPU) takes it, or pass tensors that span less memory "
                "(a contiguous copy, or a smaller batch)")
# The toeplitz family (kernels/toeplitz.py): mma.sync tensor cores through Gluon, 16-bit data in
# 16-byte vectors of channels (one to four a pixel's lanes), the filter height compiled in.
TOEPLITZ_DTYPES = (DType.FP16, DType.BF16)
TOEPLITZ_MIN_SM = 80
TOEPLITZ_BLOCK_M = (16, 32, 64)
TOEPLITZ_BLOCK_C = (8, 16, 32)
TOEPLITZ_MAX_FILTER_ROWS = 9
# Addresses, masks and the rows in flight, besides the operands and accumulators: with it the estimate
# of sm_90 builds that fit is at most their count (16 x 32 over 16 warps at 7 rows: 128, as built) and
# those past the cap of their warps spilled (32 x 32 over 16 warps at 5 rows: 152, a 176-byte stack;
# it ran 2.3x slower than 16 x 32, 18x at 7 rows: benchmarks/results/h100/conv_toeplitz_small_tiles.csv).
TOEPLITZ_REGISTER_BASE = 36


class ConvRule(enum.Enum):
    TILE_POWER_OF_TWO = "tile-power-of-two"
    TENSOR_CORE_MINIMUM = "tensor-core-minimum"
    TILE_MAXIMUM = "tile-maximum"
    WARPS = "warps"
    WARPS_FOR_TILE = "warps-for-tile"
    STAGES = "stages"
    GROUP_M = "group-m"
    SPLIT_K = "split-k"
    WINDOW = "window"
    SPLIT_MODE = "split-mode"
    GROUP_MERGE = "group-merge"
    SHARED_MEMORY = "shared-memory"
    REGISTER_BUDGET = "register-budget"
    VECTOR_WIDTH = "vector-width"
    DTYPE_ARCH = "dtype-arch"
    TF32 = "tf32"
    EPILOGUE_DIRECTION = "epilogue-direction"
    FAMILY_ARCH = "family-arch"
    FAMILY_DIRECTION = "family-direction"
    FAMILY_DTYPE = "family-dtype"
    PAD_CHANNELS = "pad-channels"


def shared_memory_bytes(config: ImplicitGemmConfig | TmaConfig) -> int:
    """Shared memory of the software pipeline: one A and one B tile per stage."""
    item = config.signature.types.dtype.itemsize
    if isinstance(config, TmaConfig):
        block_m, block_n, block_k = config.gemm_tile
    else:
        block_m, block_n, block_k = config.block_m, config.block_n, config.block_k
    return max(config.num_stages, 1) * (block_m + block_n) * block_k * item


def register_a_operand(config: TmaConfig) -> bool:
    """Whether wgmma reads this backward-weight's A operand (dy^T) from registers, not shared memory.

    Triton 3.6 feeds wgmma's A from shared memory only when it is a descriptor load as
    loaded (leading unit dims dropped, transposed at most): a box of several pixel rows,
    merged into one reduction dim, is copied into registers each step (ldmatrix, and a
    barrier to free its buffer). Forward takes its pixels as the B operand, which may be
    reshaped in shared memory, so only backward-weight boxes taller than one row pay this.
    """
    return config.signature.direction is Direction.BWD_WEIGHT and config.tile_h > 1


def accumulator_registers(config: ImplicitGemmConfig | TmaConfig | DirectConfig) -> int:
    """32-bit registers per thread that the fp32 accumulator tile needs."""
    if isinstance(config, TmaConfig):
        elements = config.block_out * config.pixels if config.signature.direction is Direction.FORWARD else (
            config.block_out * config.block_in)
    elif isinstance(config, ImplicitGemmConfig):
        elements = config.block_m * config.block_n
    elif config.window and config.signature.direction is Direction.BWD_WEIGHT:
        elements = config.block_p * config.block_c * config.rows * config.window  # the taps are the sums
    else:
        elements = config.block_p * config.block_c * config.run
    return math.ceil(elements / (config.num_warps * 32))


# The sliding-window kernels' registers a thread, fitted to sm_90 SASS of 45 bf16 forward builds
# (windows 3/5/7, runs 4/8/14, 2-8 channels a thread; ranking.py has the instruction side):
# ~1.7 an accumulator, ~1.4 a weight element, ~39 more.
WINDOW_REGISTERS_PER_ACCUMULATOR = 1.7
WINDOW_REGISTERS_PER_WEIGHT = 1.4
WINDOW_REGISTER_BASE = 39
# Left to itself ptxas gives a window kernel more registers than occupancy can afford (ncu,
# convnext 7x7 forward 8x32 w2 run 14 on the H100: 197 registers against the fit's 173, so an SM
# runs 8 warps and issues on 0.58 of its cycles). Capped at 168, the forward and backward-data
# kernels the fit puts at <= 200 ran 1.0-1.34x faster, timed in turns on the H100 (8x32 run 14 at
# 7x7: 61.3 -> 51.0 us; 16x64 run 7 at 3x3: 28.4 -> 21.2; 32x32 and 16x64 run 7 at 5x5: 1.16-1.17x;
# 8x64 run 14 at 5x5, already at 12 warps an SM: 1.0x), and those it puts at 260-310, 90-140 over
# the cap, 0.80-0.86x (at a cap of 128: 0.22-0.30x): benchmarks/studies/conv_window_cap.py,
# results/h100/conv_window_cap.txt. Backward-weight window tiles stay uncapped: at 168 the best
# two of each depthwise case ran 1.0x (5x5) to 1.49x slower (conv_window_cap_bwdw.txt).
WINDOW_REGISTER_CAP = 168
WINDOW_CAPPED_UP_TO = 200


def window_registers(config: DirectConfig, vector: int) -> int:
    """The fit's registers a thread for a sliding-window tile; `vector`: channels a 16-byte load holds.

    The fit is of stride-1 builds, whose run + window - 1 source columns a filter row grow with
    the run. A stride-2 run holds config.window_columns of them, a 16-byte register quad each of
    its vectors: forward's 2 (run - 1) + window held more (16x64 w4 run 8, window 3: 17 columns,
    168 registers and 120 bytes of stack under the cap, against 24 at stride 1), backward-data's
    (run + window - 1) / 2 fewer (run 4: 122 registers against 143).
    """
    elements = max(1.0, config.block_p * config.block_c / (config.num_warps * 32))
    channels = min(elements, vector, config.block_c)  # the distinct channels a thread holds: its weights
    extra_columns = config.window_columns - (config.run + config.window - 1)
    return int(WINDOW_REGISTERS_PER_ACCUMULATOR * accumulator_registers(config)
               + WINDOW_REGISTERS_PER_WEIGHT * config.window * channels + WINDOW_REGISTER_BASE
               + extra_columns * 4 * math.ceil(elements / vector))


def window_register_cap(config: DirectConfig, vector: int) -> int | None:
    """The register cap a forward or backward-data window kernel compiles with (None: ptxas's own)."""
    if not config.window or config.signature.direction is Direction.BWD_WEIGHT:
        return None
    return WINDOW_REGISTER_CAP if window_registers(config, vector) <= WINDOW_CAPPED_UP_TO else None


# The backward-weight window kernel's registers a thread (kernels/direct.py, counted on sm_90 SASS of bf16
# builds): ~the accumulators and the held dy block (dy of a one-row kernel is consumed as it streams: a
# quarter of it counted), plus ~90 for addresses and loads in flight.
WEIGHT_WINDOW_REGISTER_BASE = 90
# Warps an SM needs for its loads and its FMAs to overlap: with fewer, a tile's loads wait while no
# other warp computes (a guess to check with .probe/dw_bwdw.py on the H200).
WEIGHT_WINDOW_WARPS_TO_OVERLAP = 16


def weight_window_registers(config: DirectConfig) -> int:
    """The fit's registers a thread for a backward-weight window tile."""
    per_thread = max(1.0, config.block_p * config.block_c / (config.num_warps * 32))
    held_dy = config.band * config.run * per_thread * (1.0 if config.rows > 1 else 0.25)
    return int(config.rows * config.window * per_thread + held_dy + WEIGHT_WINDOW_REGISTER_BASE)


def weight_window_register_cap(config: DirectConfig, registers_per_sm: int) -> int | None:
    """The register cap a backward-weight window kernel compiles with: the most registers that leave an
    SM the WEIGHT_WINDOW_WARPS_TO_OVERLAP warps its loads need, where the fit puts the tile under them
    (None: ptxas's own). Uncapped, ptxas gave Mamba's one-row 8x64 tile 168 registers in fp16 (128 in
    bf16, no spill under the cap): three programs of 4 warps an SM, not four, and 0.89 of a copy against
    bf16's 0.97 (H100). Tiles the fit puts above the cap stay uncapped: the 2-D ones ran 1.0-1.49x slower
    at 168 (benchmarks/results/h100/conv_window_cap_bwdw.txt), and a cap above ptxas's own choice is no
    ceiling but a budget it spends (a 16x64 one-row tile takes 114 registers uncapped, 168 capped at 168)."""
    cap = _registers_a_thread(WEIGHT_WINDOW_WARPS_TO_OVERLAP * 32, registers_per_sm)
    return cap if weight_window_registers(config) <= cap else None


def _registers_a_thread(threads_an_sm: int, registers_per_sm: int) -> int:
    """The most registers a thread that let an SM hold `threads_an_sm` threads (ptxas allocates in 8s)."""
    return registers_per_sm // threads_an_sm // 8 * 8


def _power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def _signature_findings(sig: ConvSignature, arch, error) -> None:
    t = sig.types
    if t.dtype is not DType.FP32 and not arch.supports_dtype(t.dtype):
        where = "Triton's interpreter has no " + t.dtype.value if arch.is_interpreter else f"{arch.name} lacks it"
        error(ConvRule.DTYPE_ARCH, f"{t.dtype.value} convolution: {where}", "use fp16 or fp32")
    if t.allow_tf32 and t.dtype is not DType.FP32:
        error(ConvRule.TF32, f"allow_tf32 applies to fp32 only, not {t.dtype.value}")
    if sig.direction is not Direction.FORWARD and not sig.epilogue.plain:
        error(ConvRule.EPILOGUE_DIRECTION,
              f"epilogue {sig.epilogue.name} on {sig.direction.value}: bias, activation and residual are forward only",
              "use no epilogue")


def validate(config: AnyConvConfig, arch) -> ValidationResult:
    if isinstance(config, VendorConfig):
        return vendor.validate(config, arch)
    out: list[Finding] = []

    def error(rule, message, fix=None):
        out.append(Finding(rule, Severity.ERROR, message, fix))

    def warning(rule, message, fix=None):
        out.append(Finding(rule, Severity.WARNING, message, fix))

    sig = config.signature
    _signature_findings(sig, arch, error)
    if isinstance(config, PointwiseConfig):  # beyond the signature, the GEMM op validates the kernels it picks
        return ValidationResult(tuple(out))
    if isinstance(config, ToeplitzConfig):
        _toeplitz_findings(config, arch, error, warning)
        return ValidationResult(tuple(out))
    if config.num_warps not in WARP_CHOICES:
        error(ConvRule.WARPS, f"num_warps={config.num_warps} is not one of {WARP_CHOICES}")
    if not 1 <= config.split_k <= MAX_SPLIT_K:
        error(ConvRule.SPLIT_K, f"split_k={config.split_k} must be within 1..{MAX_SPLIT_K}")
    elif config.split_k > 1 and sig.direction is not Direction.BWD_WEIGHT:
        error(ConvRule.SPLIT_K, f"split_k={config.split_k} on {sig.direction.value}: only backward-weight "
              "splits its reduction (over pixels) across programs", "use split_k=1")
    if isinstance(config, SplitReduction) and config.split_mode is SplitMode.ATOMIC and config.split_k == 1:
        error(ConvRule.SPLIT_MODE, "split_mode atomic with split_k=1: there is nothing to add up",
              "use split_mode workspace, or split_k > 1")
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    regs = accumulator_registers(config)

    if isinstance(config, DirectConfig):
        for field in ("block_p", "block_c"):
            value = getattr(config, field)
            if value not in DIRECT_BLOCK_CHOICES:
                error(ConvRule.TILE_POWER_OF_TWO, f"{field}={value} is not one of {DIRECT_BLOCK_CHOICES}")
        _window_findings(config, error)
        vector = 16 // sig.types.dtype.itemsize
        if config.block_c < vector:
            warning(ConvRule.VECTOR_WIDTH, f"block_c={config.block_c} channels are less than one 16-byte vector "
                    f"({vector} x {sig.types.dtype.value})", f"use block_c >= {vector}")
        if regs > budget:
            error(ConvRule.REGISTER_BUDGET, f"the {config.block_p}x{config.block_c} accumulator needs {regs} "
                  f"registers per thread over {config.num_warps} warps; at most {budget} fit",
                  "more warps or a smaller tile")
        return ValidationResult(tuple(out))
    if isinstance(config, TmaConfig):
        _tma_findings(config, arch, error, warning)
        return ValidationResult(tuple(out))

    blocks = {"block_m": config.block_m, "block_n": config.block_n, "block_k": config.block_k}
    for field, value in blocks.items():
        if not _power_of_two(value):
            error(ConvRule.TILE_POWER_OF_TWO, f"{field}={value} is not a power of two (tl.arange needs one)",
                  f"use one of {BLOCK_CHOICES}")
    if min(blocks.values()) < 16:
        error(ConvRule.TENSOR_CORE_MINIMUM, f"tile {config.block_m}x{config.block_n}x{config.block_k} is below "
              "the tensor-core minimum 16x16x16", "use blocks >= 16")
    if max(blocks.values()) > 256:
        error(ConvRule.TILE_MAXIMUM, f"a block dim above 256 ({blocks}) does not fit one program", "use <= 256")
    if config.num_warps in WARP_CHOICES and config.block_m * config.block_n < config.num_warps * 512:
        warning(ConvRule.WARPS_FOR_TILE, f"{config.num_warps} warps share a {config.block_m}x{config.block_n} "
                "tile: most would idle", "use fewer warps or a larger tile")
    if config.num_stages not in STAGE_CHOICES:
        error(ConvRule.STAGES, f"num_stages={config.num_stages} must be within 1..{STAGE_CHOICES[-1]}")
    if config.group_m < 1:
        error(ConvRule.GROUP_M, f"group_m={config.group_m} must be at least 1")
    if config.groups_per_tile not in MERGE_CHOICES:
        error(ConvRule.GROUP_MERGE, f"groups_per_tile={config.groups_per_tile} is not one of {MERGE_CHOICES}")
    elif config.groups_per_tile > 1 and sig.direction is Direction.BWD_WEIGHT:
        error(ConvRule.GROUP_MERGE, "backward-weight does not merge groups: each group's dw tile is its own",
              "use groups_per_tile=1")
    elif config.groups_per_tile > 1 and config.family is Family.IMPLICIT_GEMM_FLAT:
        error(ConvRule.GROUP_MERGE, "igemm-flat does not merge groups: its flat (tap, channel) index is one "
              "group's", "use groups_per_tile=1")
    if config.pad_channels and config.family is not Family.IMPLICIT_GEMM_FLAT:
        error(ConvRule.PAD_CHANNELS,
              f"pad_channels is igemm-flat's (few channels a group), not {config.family.value}'s",
              "use family igemm-flat, or pad_channels=False")
    if config.pad_channels and sig.direction is Direction.BWD_DATA:
        error(ConvRule.PAD_CHANNELS, "igemm-flat's backward-data writes dx's own channels: there is no x to pad",
              "use pad_channels=False")
    smem = shared_memory_bytes(config)
    if smem > arch.shared_memory_per_block_optin:
        error(ConvRule.SHARED_MEMORY, f"{config.num_stages} stages of {config.block_m}x{config.block_k} and "
              f"{config.block_k}x{config.block_n} tiles need {smem} B of shared memory; {arch.name} allows "
              f"{arch.shared_memory_per_block_optin} B per block", "fewer stages or a smaller block_k")
    if regs > budget:
        error(ConvRule.REGISTER_BUDGET, f"the {config.block_m}x{config.block_n} accumulator needs {regs} "
              f"registers per thread over {config.num_warps} warps; at most {budget} fit beside the operands",
              "more warps or a smaller tile")
    return ValidationResult(tuple(out))


def _tma_findings(config: TmaConfig, arch, error, warning) -> None:
    """The igemm-tma family's rules (split_k and warps are checked with every family's)."""
    sig = config.signature
    if not arch.has(Feature.TMA):
        error(ConvRule.FAMILY_ARCH, f"igemm-tma needs the tensor memory accelerator (sm_90+); {arch.name} has none",
              "use the igemm family")
    if sig.types.dtype not in TMA_DTYPES:
        error(ConvRule.FAMILY_DTYPE, f"igemm-tma is fp16/bf16 only, not {sig.types.name}: backward-weight's "
              "operands are M- and N-major, which a tf32 wgmma cannot read", "use the igemm family")
    for field in ("tile_h", "tile_w"):
        value = getattr(config, field)
        if value not in TMA_TILE_CHOICES:
            error(ConvRule.TILE_POWER_OF_TWO, f"{field}={value} is not one of {TMA_TILE_CHOICES}")
    for field in ("block_out", "block_in"):
        value = getattr(config, field)
        if not _power_of_two(value):
            error(ConvRule.TILE_POWER_OF_TWO, f"{field}={value} is not a power of two (tl.arange needs one)",
                  f"use one of {BLOCK_CHOICES}")
    gemm = dict(zip(("M", "N", "step"), config.gemm_tile))
    if min(gemm.values()) < 16:
        error(ConvRule.TENSOR_CORE_MINIMUM, f"the GEMM tile {gemm} is below the tensor-core minimum 16x16x16",
              "use channel blocks >= 16 and tiles of >= 16 pixels")
    if max(config.block_out, config.block_in, config.pixels) > TMA_BOX_MAXIMUM:
        error(ConvRule.TILE_MAXIMUM, f"a box of {config.tile_h}x{config.tile_w} pixels and channel blocks "
              f"{config.block_out}, {config.block_in}: TMA moves at most {TMA_BOX_MAXIMUM} rows and columns a box",
              f"use at most {TMA_BOX_MAXIMUM} pixels and channels")
    if config.num_stages not in STAGE_CHOICES:
        error(ConvRule.STAGES, f"num_stages={config.num_stages} must be within 1..{STAGE_CHOICES[-1]}")
    if config.num_warps in WARP_CHOICES and gemm["M"] * gemm["N"] < config.num_warps * 512:
        warning(ConvRule.WARPS_FOR_TILE, f"{config.num_warps} warps share a {gemm['M']}x{gemm['N']} tile: most "
                "would idle", "use fewer warps or a larger tile")
    smem = shared_memory_bytes(config)
    if smem > arch.shared_memory_per_block_optin:
        error(ConvRule.SHARED_MEMORY, f"{config.num_stages} stages of the {gemm['M']}x{gemm['step']} and "
              f"{gemm['step']}x{gemm['N']} boxes need {smem} B of shared memory; {arch.name} allows "
              f"{arch.shared_memory_per_block_optin} B per block", "fewer stages or smaller blocks")
    regs = accumulator_registers(config)
    if register_a_operand(config):  # dy^T in registers, double-buffered (sm_90 ptxas: 128x256 w8 spills)
        regs += math.ceil(config.block_out * config.pixels / (config.num_warps * 32))
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    if regs > budget:
        error(ConvRule.REGISTER_BUDGET, f"the {gemm['M']}x{gemm['N']} accumulator"
              + (" and the A operand" if register_a_operand(config) else "")
              + f" need {regs} registers per thread over {config.num_warps} warps; at most {budget} fit",
              "more warps or a smaller tile")


def _window_findings(config: DirectConfig, error) -> None:
    if not 0 <= config.window <= MAX_WINDOW:
        error(ConvRule.WINDOW, f"window={config.window} must be within 0..{MAX_WINDOW} (0: the per-tap kernel)")
    if not 1 <= config.rows <= MAX_WINDOW:
        error(ConvRule.WINDOW, f"rows={config.rows} must be within 1..{MAX_WINDOW}")
    elif config.rows > 1 and not (config.window and config.signature.direction is Direction.BWD_WEIGHT):
        error(ConvRule.WINDOW, f"rows={config.rows}: only the backward-weight window kernel holds filter rows "
              "(forward and backward-data loop over them)", "use rows=1")
    if not 1 <= config.band <= MAX_RUN:
        error(ConvRule.WINDOW, f"band={config.band} must be within 1..{MAX_RUN}")
    elif config.band > 1 and not (config.window and config.signature.direction is Direction.BWD_WEIGHT):
        error(ConvRule.WINDOW, f"band={config.band}: only the backward-weight window kernel holds several output "
              "rows a thread", "use band=1")
    if not 1 <= config.run <= MAX_RUN:
        error(ConvRule.WINDOW, f"run={config.run} must be within 1..{MAX_RUN}")
    elif config.run > 1 and not config.window:
        error(ConvRule.WINDOW, f"run={config.run} without a window: only the sliding-window kernels hold runs",
              "use run=1, or a window")
    if config.window_stride not in WINDOW_STRIDES:
        error(ConvRule.WINDOW, f"window_stride={config.window_stride} is not one of {WINDOW_STRIDES}")
    elif config.window_stride > 1 and not config.window:
        error(ConvRule.WINDOW, f"window_stride={config.window_stride} without a window: the per-tap kernels take "
              "any stride as it comes", "use window_stride=1, or a window")
    elif config.signature.direction is Direction.BWD_DATA and config.run % config.window_stride:
        error(ConvRule.WINDOW, f"run={config.run} at window_stride={config.window_stride}: a backward-data run starts "
              "where its first dy column's taps begin, which needs runs of a multiple of the stride",
              f"use run={config.run + config.window_stride - config.run % config.window_stride}")


@dataclass(frozen=True)
class ToeplitzWalk:
    """What a forward or backward-data toeplitz walk reads and writes, (H, W) each: backward-data walks
    dy (the source) into dx with the filter flipped and padding F - 1 - P (stride and dilation 1)."""

    source: tuple[int, int]
    output: tuple[int, int]
    padding: tuple[int, int]

    @classmethod
    def of(cls, p: ConvProblem) -> ToeplitzWalk:
        if p.direction is Direction.BWD_DATA:
            return cls(tuple(p.output_size), tuple(p.input_size), p.flipped_padding)
        return cls(tuple(p.input_size), tuple(p.output_size), tuple(p.padding))


def toeplitz_registers(config: ToeplitzConfig) -> int:
    """Registers a thread of the toeplitz kernel holds, for each of its warp's channels. Forward and
    backward-data: the filter_rows accumulators (fp32 [block_m, 8]), filter operands (16-bit pairs
    [16, 8]) and the row operand ([block_m, 16]). Backward-weight: the filter_rows sums (fp32 [16, 8]),
    dy operands ([block_m, 8]) and the x row operand ([16, block_m])."""
    rows, kw, nw, m = config.filter_rows, TOEPLITZ_KW, TOEPLITZ_NW, config.block_m
    channels = max(config.block_c // config.num_warps, 1)
    if config.signature.direction is Direction.BWD_WEIGHT:
        per_channel = rows * kw * nw // 32 + rows * m * nw // 64 + m * kw // 64
    else:
        per_channel = rows * m * nw // 32 + rows * kw * nw // 64 + m * kw // 64
    return channels * per_channel + TOEPLITZ_REGISTER_BASE


def toeplitz_register_cap(config: ToeplitzConfig, registers_per_sm: int) -> int | None:
    """The register cap a forward or backward-data walk compiles with: the most programs an SM can
    hold at the walk's estimated registers, and no fewer (None: one program an SM, ptxas's own).
    Uncapped, ptxas spent what an 8-warp walk did not need: 16x16 over 8 warps took 92 registers at
    3 filter rows (two programs an SM, where 74 had let three share it) and 134 at 7 (one), and ran
    1.28x and 1.07x slower (H100, MobileNet's and ConvNeXt's layers of the suite)."""
    if config.signature.direction is Direction.BWD_WEIGHT:
        return None
    threads = 32 * config.num_warps
    programs = registers_per_sm // (threads * toeplitz_registers(config))
    if programs < 2:
        return None
    cap = _registers_a_thread(programs * threads, registers_per_sm)
    return cap if cap < 255 else None


def _toeplitz_findings(config: ToeplitzConfig, arch, error, warning) -> None:
    sig = config.signature
    if arch.sm is None or arch.sm < TOEPLITZ_MIN_SM:
        where = "the interpreter" if arch.is_interpreter else arch.name
        error(ConvRule.FAMILY_ARCH, f"toeplitz is a Gluon kernel on mma.sync tensor cores (sm_{TOEPLITZ_MIN_SM}+ "
              f"GPUs); {where} cannot run it", "use the direct family")
    if sig.types.dtype not in TOEPLITZ_DTYPES:
        error(ConvRule.FAMILY_DTYPE, f"toeplitz multiplies 16-bit operands; {sig.types.dtype.value} is not one",
              "use fp16 or bf16, or the direct family")
    if not 1 <= config.split_k <= MAX_SPLIT_K:
        error(ConvRule.SPLIT_K, f"split_k={config.split_k} must be within 1..{MAX_SPLIT_K}")
    elif config.split_k > 1 and sig.direction is not Direction.BWD_WEIGHT:
        error(ConvRule.SPLIT_K, f"split_k={config.split_k} on {sig.direction.value}: only backward-weight "
              "splits its reduction (over pixels) across programs", "use split_k=1")
    if config.block_m not in TOEPLITZ_BLOCK_M:
        error(ConvRule.TILE_POWER_OF_TWO, f"block_m={config.block_m} is not one of {TOEPLITZ_BLOCK_M}")
    if config.block_c not in TOEPLITZ_BLOCK_C:
        error(ConvRule.VECTOR_WIDTH, f"block_c={config.block_c} is not one of {TOEPLITZ_BLOCK_C} (1-4 lanes of "
              "16-byte vectors a pixel)")
    if config.num_warps not in WARP_CHOICES:
        error(ConvRule.WARPS, f"num_warps={config.num_warps} is not one of {WARP_CHOICES}")
    elif config.block_c % config.num_warps:
        error(ConvRule.WARPS_FOR_TILE, f"the MMA's batch is the channel, whole channels a warp: block_c="
              f"{config.block_c} is not a multiple of num_warps={config.num_warps}", "use fewer warps")
    elif config.block_c in TOEPLITZ_BLOCK_C and config.block_m < config.num_warps * max(
            1, 32 * 8 // config.block_c // TOEPLITZ_NW):  # a warp's rows: 32 lanes of 8-channel vectors
        warning(ConvRule.WARPS_FOR_TILE, f"{config.num_warps} warps move {config.block_c} channels of a "
                f"{config.block_m}-row block of output rows by 16-byte vectors: some lanes repeat others' loads",
                "a larger block_m or fewer warps")
    if not 1 <= config.filter_rows <= TOEPLITZ_MAX_FILTER_ROWS:
        error(ConvRule.WINDOW, f"filter_rows={config.filter_rows} must be within 1..{TOEPLITZ_MAX_FILTER_ROWS}: "
              "a thread holds one accumulator and one filter operand a filter row")
    if config.rows < 1:
        error(ConvRule.WINDOW, f"rows={config.rows}: a program walks at least one output row", "use rows >= 1")
    registers = toeplitz_registers(config)
    cap = min(arch.registers_per_thread_max, arch.registers_per_sm // (32 * max(config.num_warps, 1)))
    if registers > cap:
        error(ConvRule.REGISTER_BUDGET, f"{config.block_c // max(config.num_warps, 1)} channels a warp of "
              f"{config.filter_rows} filter rows need ~{registers} registers a thread; a program of "
              f"{config.num_warps} warps has {cap} (past that the walk spills)", "a smaller block_c or block_m")


# Fields the corrector may move, with the values it may choose from.
_TUNABLE = {
    ImplicitGemmConfig: {"block_m": BLOCK_CHOICES, "block_n": BLOCK_CHOICES, "block_k": BLOCK_CHOICES,
                         "num_warps": WARP_CHOICES, "num_stages": STAGE_CHOICES},
    DirectConfig: {"block_p": DIRECT_BLOCK_CHOICES, "block_c": DIRECT_BLOCK_CHOICES, "num_warps": WARP_CHOICES},
    TmaConfig: {"tile_h": TMA_TILE_CHOICES, "tile_w": TMA_TILE_CHOICES, "block_out": BLOCK_CHOICES,
                "block_in": BLOCK_CHOICES, "num_warps": WARP_CHOICES, "num_stages": STAGE_CHOICES},
    ToeplitzConfig: {"block_m": TOEPLITZ_BLOCK_M, "block_c": TOEPLITZ_BLOCK_C, "num_warps": WARP_CHOICES},
}
# Rules about what is computed, not how: no tile change fixes them.
_SEMANTIC = {ConvRule.DTYPE_ARCH, ConvRule.TF32, ConvRule.EPILOGUE_DIRECTION, ConvRule.FAMILY_ARCH,
             ConvRule.WINDOW, ConvRule.FAMILY_DIRECTION, ConvRule.FAMILY_DTYPE}


def auto_correct(config: AnyConvConfig, arch) -> tuple[AnyConvConfig, tuple[Correction, ...]]:
    """The valid config nearest to `config` (fewest powers of two moved), and what changed.

    Rules about what is computed (dtype on this arch, tf32, an epilogue off forward)
    cannot be corrected by a tile change; they raise InvalidConfigError naming the rule.
    """
    result = validate(config, arch)
    if result.ok:
        return config, ()
    semantic = result.broken_rules() & _SEMANTIC
    if semantic or isinstance(config, (VendorConfig, PointwiseConfig)):
        semantic = semantic or result.broken_rules()
        raise InvalidConfigError(f"{config.name} cannot be corrected on {arch.name}: "
                                 + "; ".join(str(f) for f in result.errors if f.rule in semantic))
    if isinstance(config, ToeplitzConfig):
        base = config
    else:
        split = min(max(config.split_k, 1), MAX_SPLIT_K)
        if config.signature.direction is not Direction.BWD_WEIGHT:
            split = 1
        base = replace(config, split_k=split)
    if isinstance(config, ImplicitGemmConfig):
        merge = config.groups_per_tile if config.groups_per_tile in MERGE_CHOICES else 1
        base = replace(base, group_m=max(config.group_m, 1),
                       split_mode=SplitMode.WORKSPACE if split == 1 else config.split_mode,
                       groups_per_tile=1 if config.signature.direction is Direction.BWD_WEIGHT else merge)
    elif isinstance(config, TmaConfig):
        base = replace(base, split_mode=SplitMode.WORKSPACE if split == 1 else config.split_mode)
    tunable = _TUNABLE[type(config)]
    # Every tile by its distance (stable: ties keep the product's order), validated nearest first.
    steps = [{v: abs(math.log2(v) - math.log2(max(getattr(config, f), 1))) for v in choices}
             for f, choices in tunable.items()]
    tiles = sorted(itertools.product(*tunable.values()),
                   key=lambda values: sum(step[v] for step, v in zip(steps, values)))
    best = next((c for c in (replace(base, **dict(zip(tunable, values))) for values in tiles)
                 if validate(c, arch).ok), None)
    if best is None:
        raise InvalidConfigError(f"no valid config near {config.name} on {arch.name}: {result.errors[0]}")
    rules = tuple(sorted(r.value for r in result.broken_rules()))
    corrections = tuple(Correction(f.name, getattr(config, f.name), getattr(best, f.name), rules)
                        for f in fields(config) if getattr(config, f.name) != getattr(best, f.name))
    return best, corrections


def supports(config: AnyConvConfig, problem: ConvProblem) -> str | None:
    """None if this kernel computes `problem`; else why not, in words."""
    if isinstance(config, VendorConfig):
        return vendor.supports(config, problem)
    if problem.wide_offsets:  # first: every Triton kernel refuses for this one reason, whatever else differs
        return WIDE_OFFSETS
    want = ConvSignature.of(problem)
    sig = config.signature
    if sig.direction is not want.direction:
        return f"built for {sig.direction.value}, the problem is {want.direction.value}"
    if sig.types != want.types:
        return f"built for {sig.types.name}, the problem is {want.types.name}"
    if sig.epilogue != want.epilogue:
        return f"built for epilogue {sig.epilogue.name}, the problem needs {want.epilogue.name}"
    if isinstance(config, ImplicitGemmConfig) and config.groups_per_tile > 1:
        depth = problem.c_per_group if problem.direction is Direction.FORWARD else problem.k_per_group
        if config.groups_per_tile * depth > config.block_k:
            return (f"{config.groups_per_tile} merged groups of {depth} reduction channels exceed block_k="
                    f"{config.block_k}: a merged tile reads all its groups' channels in one block")
    if isinstance(config, TmaConfig):
        return _tma_refusal(config, problem)
    if isinstance(config, ToeplitzConfig):
        return _toeplitz_refusal(config, problem)
    if isinstance(config, PointwiseConfig):
        return _pointwise_refusal(problem)
    if config.family is Family.IMPLICIT_GEMM_FLAT and problem.c_per_group > FLAT_MAX_CHANNELS_PER_GROUP:
        return (f"igemm-flat serves up to {FLAT_MAX_CHANNELS_PER_GROUP} input channels per group, where igemm "
                f"would pad each tap's channels; this conv has C/G={problem.c_per_group} (igemm serves it)")
    if isinstance(config, ImplicitGemmConfig) and config.pad_channels:
        return _padding_refusal(problem)
    if isinstance(config, DirectConfig):
        per_group = max(problem.c_per_group, problem.k_per_group)
        if per_group > DIRECT_MAX_CHANNELS_PER_GROUP:
            return (f"the direct family serves up to {DIRECT_MAX_CHANNELS_PER_GROUP} channels per group; this "
                    f"conv has C/G={problem.c_per_group}, K/G={problem.k_per_group}")
        if config.window:
            return _window_refusal(config, problem)
    return None


def _padding_refusal(problem: ConvProblem) -> str | None:
    """Why padding the input channels (ImplicitGemmConfig.pad_channels) does not serve `problem` (None: it does)."""
    vector = 16 // problem.types.dtype.itemsize
    if problem.c % vector == 0:
        return f"C={problem.c} is already whole {vector}-channel vectors: there is nothing to pad"
    if problem.groups > 1:
        return f"channel padding serves one group; this conv has G={problem.groups}"
    if not problem.specialization.outputs_aligned:
        return ("channel padding copies x and w into aligned buffers, but this conv's output side (K, y or dy) "
                "is not 16-byte aligned, so the padded kernel would still take element loads there")
    return None


def _window_refusal(config: DirectConfig, problem: ConvProblem) -> str | None:
    """Why the sliding-window kernel of `config` cannot compute `problem` (None: it can)."""
    if not problem.one_channel_per_group:
        return (f"the sliding-window kernel is depthwise only (C/G = K/G = 1); this conv has "
                f"C/G={problem.c_per_group}, K/G={problem.k_per_group}")
    if problem.filter_size[-1] != config.window:
        return f"built for filter width {config.window}, the filter is {problem.filter_size[-1]} wide"
    if problem.stride[-1] != config.window_stride or problem.dilation[-1] != 1:
        return (f"built for stride {config.window_stride} and dilation 1 along W; this conv has stride "
                f"{problem.stride[-1]}, dilation {problem.dilation[-1]} there (a window kernel of its stride along W, "
                f"{' or '.join(map(str, WINDOW_STRIDES))}, or the per-tap direct kernel serves it)")
    _, stride_h, _ = problem.padded3(problem.stride, 1)
    _, dilation_h, _ = problem.padded3(problem.dilation, 1)
    if config.band > 1 and (stride_h != 1 or dilation_h != 1):
        return (f"a band of {config.band} output rows shares its input rows only at stride 1 and dilation 1 along "
                f"H; this conv has stride {stride_h}, dilation {dilation_h} there (a band-1 window kernel serves it)")
    return None


def _tma_refusal(config: TmaConfig, problem: ConvProblem) -> str | None:
    """Why the igemm-tma kernel of `config` cannot compute `problem` (None: it can)."""
    if not problem.unit_stride:
        return (f"igemm-tma reads a tap's input pixels as one box, which holds only at stride 1; this conv has "
                f"stride {problem.stride} (the igemm family serves it)")
    if not problem.specialization.groups_aligned:
        return ("igemm-tma reads through tensor descriptors: base pointers, pixel strides and the channel counts "
                f"C, K, C/G, K/G must be multiples of 16 bytes (of {16 // problem.types.dtype.itemsize} "
                f"{problem.types.dtype.value}); this conv has C={problem.c}, K={problem.k}, G={problem.groups} "
                "or strides that are not (the igemm family serves it)")
    if problem.direction is Direction.FORWARD and problem.c_per_group % config.block_in:
        return (f"igemm-tma's forward steps through the weight's (tap, channel) rows in blocks of block_in="
                f"{config.block_in} channels, which must not cross a tap or a group: C/G={problem.c_per_group} "
                "is not a multiple of it")
    if problem.direction is Direction.BWD_DATA:
        if problem.k_per_group % config.block_in:
            return (f"igemm-tma's backward-data is the forward over dy, stepping through its K/G="
                    f"{problem.k_per_group} channels in blocks of block_in={config.block_in}: K/G is not a multiple "
                    "of it")
        if min(problem.flipped_padding) < 0:
            return (f"igemm-tma's backward-data is the forward over dy padded by dilation x (filter - 1) - padding "
                    f"= {problem.flipped_padding} a side, which must not be negative: padding {problem.padding} "
                    "passes the filter's reach (the igemm family serves it)")
    if problem.spatial_dims == 1 and config.tile_h > 1:
        return (f"a 1-D conv has one row of pixels: a {config.tile_h}x{config.tile_w} tile would compute "
                f"{config.tile_h - 1} rows of zeros; a 1 x tile_w tile serves it")
    return None


def _pointwise_refusal(problem: ConvProblem) -> str | None:
    """Why the GEMM op cannot run `problem` as one matrix product (None: it can)."""
    if problem.groups != 1:
        return f"the gemm family runs dense convs as one GEMM; this conv has {problem.groups} groups"
    if not problem.pointwise:
        return (f"the gemm family runs 1x1 convs of stride 1 and no padding as a GEMM; this conv has filter "
                f"{problem.filter_size}, stride {problem.stride}, padding {problem.padding}")
    return None


def _toeplitz_refusal(config: ToeplitzConfig, problem: ConvProblem) -> str | None:
    """Why the toeplitz kernel of `config` cannot compute `problem` (None: it can)."""
    if not problem.one_channel_per_group:
        return (f"toeplitz is depthwise only (C/G = K/G = 1); this conv has C/G={problem.c_per_group}, "
                f"K/G={problem.k_per_group}")
    if problem.spatial_dims != 2:
        return f"toeplitz walks the rows of 2-D maps; this conv is {problem.spatial_dims}-D (the direct family serves it)"
    if not problem.unit_stride or any(d != 1 for d in problem.dilation):
        return (f"toeplitz needs stride 1 and dilation 1; this conv has stride {problem.stride}, dilation "
                f"{problem.dilation} (the direct family serves it)")
    rows, width = problem.filter_size
    if rows != config.filter_rows:
        return f"built for filters {config.filter_rows} rows tall, the filter is {rows}"
    if width > TOEPLITZ_MAX_WIDTH:
        return (f"toeplitz's banded matrices hold filters up to {TOEPLITZ_MAX_WIDTH} wide; the filter is {width} "
                "(the direct family serves it)")
    if not problem.specialization.aligned:
        return (f"toeplitz moves channels as 16-byte vectors: C and the pointers and pixel strides must be "
                f"multiples of 16 bytes (of {16 // problem.types.dtype.itemsize} {problem.types.dtype.value}); this "
                f"conv has C={problem.c} or strides that are not (the direct family serves it)")
    return None
