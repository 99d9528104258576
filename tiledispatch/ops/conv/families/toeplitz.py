"""Family `toeplitz`: depthwise 2-D convolution on tensor cores, every direction (kernels/toeplitz.py).

Each filter row is a banded (Toeplitz) matrix that mma.sync multiplies by a row of pixels; a
program walks down its output rows. Gluon, 16-bit data in 16-byte vectors of channels, the
filter height compiled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ....core.arith import cdiv
from ....core.dtypes import DType
from ....core.family import CorrectionSpace, KernelFamily
from ....core.launch import Launch, Plan
from ....core.op import KernelUnit, Score, UnitKind
from ....heuristics.roofline import dram_bytes_per_s
from ..operands import ConvOperands
from ..plan import KERNELS, bound_values, dim_strides, epilogue_constexprs, output_tensor, reduce_launch, reduce_unit
from ..plan import kernel_units as op_kernel_units
from ..plan import target
from ..problem import ConvProblem, ConvSpecialization, Direction
from ..ranking import VENDOR_TRUST, ideal_seconds
from ..rules import WARP_CHOICES, ConvRule, Findings, registers_a_thread, signature_findings, signature_refusal
from ..rules import split_k_findings
from ..signature import FAMILIES, ConvSignature, Family
from .direct_window import WINDOW_MODEL_ERROR

NW = 8  # output columns of a chunk: the MMA's N (kernels/toeplitz.py reads these three)
KW = 16  # input columns a chunk reads: the MMA's K; a filter up to KW - NW + 1 wide fits
MAX_WIDTH = KW - NW + 1

MODULE = f"{KERNELS}.toeplitz"
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
# The toeplitz kernel (kernels/toeplitz.py), fitted to 36 H100 timings (bf16 forward, its two default
# tiles on 18 depthwise shapes from 7x7 to 112x112 maps, 3x3 to 7x7; benchmarks/results/h100/
# conv_toeplitz_fit_*.csv): a program's time is its rows walked (its band plus the filter's rows of
# halo) at a rate set by the row's load, staging and store latency, not by its MMAs; an SM runs its
# share of the programs one after another. A row takes 0.53 us for a block of 16 (image, chunk) rows
# x 32 channels on 16 warps, and scales as the block's size to the 0.78th power (16 x 16 on 8 warps:
# 0.31). Where many programs walk at once the bytes set the time instead: the walks move them at a
# third of the bandwidth (MobileNet's 112x112 3x3 ran 88 us, its rows alone would take 48). Within
# 0.74-1.27x of the timings (launch included).
TOEPLITZ_ROW_SECONDS = 0.53e-6  # a program's row of a 16 x 32 block
TOEPLITZ_FRACTION = 0.34  # of the bandwidth, where the walks' bytes bound them
TOEPLITZ_ROW_BLOCK = 16 * 32
TOEPLITZ_BLOCK_EXPONENT = 0.78
# Its margin against cuDNN, the same as the window kernel's, so that between the two only their
# modelled times decide: at 1.25 the window model keeps the window kernel on EfficientNet's
# 28x28 5x5 (22.6 against the walk's 18.4 us), at 1.1 (window 1.15) the walk takes EfficientNet's
# 14x14 5x5 (1.18x cuDNN, the window kernel 1.45x). On the 18 shapes of the fit the two agree with
# the faster but on MobileNet's 112x112 (32 channels) and 56x56 3x3, where the walk ran 2 % faster.
TOEPLITZ_MODEL_ERROR = WINDOW_MODEL_ERROR
# Backward-weight walks its rows as the forward does (an x and a dy row loaded and converted a row,
# no store), each program its share of the blocks one after another, then the sum of the slabs:
# a row costs the forward's x (TOEPLITZ_WEIGHT_ROW_FACTOR + TOEPLITZ_WEIGHT_MMA_FACTOR x its
# filter_rows MMAs). Fitted on the H100, the slabs' sum taking 128 elements a program (plan.py's
# REDUCE_BLOCK), to the default tiles' 72 timings on 18 depthwise layers, 3x3 to 7x7 on 7x7 to
# 112x112 maps (benchmarks/results/h100/conv_toeplitz_weight_refit.csv): within 0.87-1.23x of them.
# Its margin against cuDNN is none (TOEPLITZ_WEIGHT_MODEL_ERROR): cuDNN's model, within 0.84-1.25x,
# is the comparison's error. On those layers the rules pick within 0.96-1.0 of the faster of the
# two (mean 0.998); the 0.96 is MobileNet's 28x28 3x3, where cuDNN is kept at 26.6 us and the
# walk ran 25.6. At 1.15, the forward's margin, the rules keep cuDNN on the suite's 5x5, where the
# walk ran 1.5x faster.
TOEPLITZ_WEIGHT_ROW_FACTOR = 0.88
TOEPLITZ_WEIGHT_MMA_FACTOR = 0.02
TOEPLITZ_WEIGHT_MODEL_ERROR = 1.0
# The forward's walk skips the steps only padding feeds, and finishes the output rows it leaves in
# its slots after the walk (kernels/toeplitz.py): such a finish (a row's staging and store, no load
# or MMA) counts as TOEPLITZ_FINISH_STEPS of a step, a guess that the timings cannot pin down. The
# rates above come from tables whose walk ran the padding's steps too (conv_toeplitz_fit_*.csv); on
# the default tiles' 36 timings of the walk that skips them the model is within 0.81-1.39x
# (benchmarks/results/h100/conv_toeplitz_trim_shapes.csv); the 1.39 is 16 x 16 over 8 warps on
# ConvNeXt's 7x7, which the rules do not pick.
TOEPLITZ_FINISH_STEPS = 0.65


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
    rows, kw, nw, m = config.filter_rows, KW, NW, config.block_m
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
    cap = registers_a_thread(programs * threads, registers_per_sm)
    return cap if cap < 255 else None


def findings(config: ToeplitzConfig, arch) -> Findings:
    """The toeplitz family's rules, after the signature's."""
    out = Findings()
    error, warning = out.error, out.warning
    signature_findings(config.signature, arch, out)
    sig = config.signature
    if arch.sm is None or arch.sm < TOEPLITZ_MIN_SM:
        where = "the interpreter" if arch.is_interpreter else arch.name
        error(ConvRule.FAMILY_ARCH, f"toeplitz is a Gluon kernel on mma.sync tensor cores (sm_{TOEPLITZ_MIN_SM}+ "
              f"GPUs); {where} cannot run it", "use the direct family")
    if sig.types.dtype not in TOEPLITZ_DTYPES:
        error(ConvRule.FAMILY_DTYPE, f"toeplitz multiplies 16-bit operands; {sig.types.dtype.value} is not one",
              "use fp16 or bf16, or the direct family")
    split_k_findings(config, out)
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
            1, 32 * 8 // config.block_c // NW):  # a warp's rows: 32 lanes of 8-channel vectors
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
    return out


def correction(config: ToeplitzConfig) -> CorrectionSpace:
    """The block of rows and channels and the warps may move."""
    return CorrectionSpace(config, {"block_m": TOEPLITZ_BLOCK_M, "block_c": TOEPLITZ_BLOCK_C,
                                    "num_warps": WARP_CHOICES})


def supports(config: ToeplitzConfig, problem: ConvProblem) -> str | None:
    """Why the toeplitz kernel of `config` cannot compute `problem` (None: it can)."""
    refusal = signature_refusal(config, problem)
    if refusal is not None:
        return refusal
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
    if width > MAX_WIDTH:
        return (f"toeplitz's banded matrices hold filters up to {MAX_WIDTH} wide; the filter is {width} "
                "(the direct family serves it)")
    if not problem.specialization.aligned:
        return (f"toeplitz moves channels as 16-byte vectors: C and the pointers and pixel strides must be "
                f"multiples of 16 bytes (of {16 // problem.types.dtype.itemsize} {problem.types.dtype.value}); this "
                f"conv has C={problem.c} or strides that are not (the direct family serves it)")
    return None


def toeplitz_walk_steps(config: ToeplitzConfig, p: ConvProblem) -> float:
    """The longest band's walk in steps of one input row (backward-weight: an item's walk), as
    kernels/toeplitz.py takes them: whole unrolled turns of filter_rows steps."""
    fy = config.filter_rows
    if p.direction is Direction.BWD_WEIGHT:
        return math.ceil((min(config.rows, p.output_size[0]) + fy - 1) / fy) * fy
    walk = ToeplitzWalk.of(p)
    source_h, out_h, pad = walk.source[0], walk.output[0], walk.padding[0]
    longest = 0.0
    for first in range(0, out_h, config.rows):
        end = min(first + config.rows, out_h)
        u_first = first + min(max(pad - first, 0), fy - 1)
        u_real = min(max(source_h + pad, end), end + fy - 1)
        steps = math.ceil((u_real - u_first) / fy) * fy
        finishes = max(end - (u_first + steps - fy + 1), 0)  # rows the walk left in its slots
        longest = max(longest, steps + TOEPLITZ_FINISH_STEPS * finishes)
    return longest


def toeplitz_score(config: ToeplitzConfig, p: ConvProblem, arch) -> Score:
    """The busiest SM's programs, one after another, each walking its rows (backward-weight: its
    items' rows, then the sum of the slabs)."""
    oh, ow = p.output_size if p.direction is Direction.BWD_WEIGHT else ToeplitzWalk.of(p).output
    blocks = math.ceil(p.n * math.ceil(ow / NW) / config.block_m) * math.ceil(oh / config.rows)
    channel_blocks = math.ceil(p.c / config.block_c)
    row_s = TOEPLITZ_ROW_SECONDS * (config.block_m * config.block_c / TOEPLITZ_ROW_BLOCK)**TOEPLITZ_BLOCK_EXPONENT
    walked = toeplitz_walk_steps(config, p)
    if p.direction is Direction.BWD_WEIGHT:  # a program walks its share of the blocks one after another
        programs, walks = channel_blocks * min(config.split_k, blocks), math.ceil(blocks / config.split_k)
        row_s *= TOEPLITZ_WEIGHT_ROW_FACTOR + TOEPLITZ_WEIGHT_MMA_FACTOR * config.filter_rows
        reduce_s = ((config.split_k + 1) * p.c * math.prod(p.filter_size) * 4 / dram_bytes_per_s(arch)
                    + arch.calibration.launch_s)
        error = TOEPLITZ_WEIGHT_MODEL_ERROR
    else:
        programs, walks, reduce_s, error = channel_blocks * blocks, 1, 0.0, TOEPLITZ_MODEL_ERROR
    busiest = max(walks, math.ceil(channel_blocks * blocks / arch.sm_count))  # the busiest SM's walks
    walk_s = busiest * walked * row_s
    terms = {"programs": float(programs), "busiest_sm_walks": float(busiest), "rows_walked": float(walked)}
    memory_s = p.bytes() / (dram_bytes_per_s(arch) * TOEPLITZ_FRACTION)
    modelled = max(walk_s, memory_s) + arch.calibration.launch_s + reduce_s
    ideal = ideal_seconds(p, arch)
    terms |= {"walk_us": walk_s * 1e6, "memory_us": memory_s * 1e6, "reduce_us": reduce_s * 1e6,
              "modelled_us": modelled * 1e6}
    return Score(ideal / modelled * VENDOR_TRUST / error, terms)


# The Gluon walk's arguments (and, for backward-weight, the sum of its slabs).
TOEPLITZ_STRIDES = ("sxn", "sxh", "sxw", "syn", "syh", "syw", "srn", "srh", "srw")
TOEPLITZ_FILTER_STRIDES = ("swk", "swy", "swx")  # the weight [C, 1, FY, FX]


def kernel_units(config: ToeplitzConfig, specialization: ConvSpecialization, arch) -> tuple[KernelUnit, ...]:
    """Forward and backward-data: the walk, which builds its banded filters itself. Backward-weight:
    the walk into the workspace, then weight_reduce's sum of its slabs."""
    from ..kernels import toeplitz as k  # Triton's and Gluon's import comes with it

    t = config.signature.types.dtype.triton
    direction = config.signature.direction
    vector = 16 // config.signature.types.dtype.itemsize
    walk = {"BLOCK_M": config.block_m, "BLOCK_C": config.block_c, "ROWS": config.rows,
            "FILTER_ROWS": config.filter_rows, "KW": KW, "NW": NW, "VEC": vector}
    if direction is Direction.BWD_WEIGHT:
        walk |= {"SPLIT_K": config.split_k}
        tensors = [("x_ptr", f"*{t}"), ("y_ptr", f"*{t}"), ("ws_ptr", "*fp32")]
        scalars = ("N", "C", "H", "W", "OH", "OW", "FX", "PH", "PW")
        strides = TOEPLITZ_STRIDES[:6]
        aligned = (("x_ptr", 16), ("y_ptr", 16))
        function = "conv_depthwise_toeplitz_weight"
    else:
        walk |= {"FLIP": direction is Direction.BWD_DATA, **epilogue_constexprs(config.signature)}
        tensors = [(n, f"*{t}") for n in ("x_ptr", "w_ptr", "y_ptr", "bias_ptr", "res_ptr")]
        scalars = ("N", "C", "H", "W", "OH", "OW", "FX", "PH", "PW")
        strides = TOEPLITZ_FILTER_STRIDES + TOEPLITZ_STRIDES
        aligned = (("x_ptr", 16), ("y_ptr", 16), ("res_ptr", 16))
        function = "conv_depthwise_toeplitz"
    signature = (tensors + [(n, "i32") for n in scalars] + [(n, "i64") for n in strides]
                 + [(n, "constexpr") for n in walk])
    # Unaligned data is refused (`supports`): channels move as 16-byte vectors.
    divisibility = (aligned + tuple((n, vector) for n in strides if n not in TOEPLITZ_FILTER_STRIDES)
                    + (("C", vector),)) if specialization.aligned else ()
    main = KernelUnit(
        stage="main", module=MODULE, function=function, signature=tuple(signature),
        constexprs=tuple(sorted(walk.items())), num_warps=config.num_warps, num_stages=1,
        divisibility=divisibility, kind=UnitKind.GLUON,
        max_registers=toeplitz_register_cap(config, target(arch).registers_per_sm))
    if direction is Direction.BWD_WEIGHT:
        return main, reduce_unit(config, specialization)
    return (main,)


def plan(config: ToeplitzConfig, ops: ConvOperands) -> Plan:
    """Forward: the walk over x. Backward-data walks dy into dx with the filter flipped (the walk's
    FLIP) and padding F - 1 - P (stride and dilation are 1). Backward-weight walks x and dy into
    fp32 slabs, then sums them into dw."""
    p = ops.problem
    out = output_tensor(ops)
    from ..kernels import toeplitz as k
    fy, fx = p.filter_size
    units = op_kernel_units(config, p.specialization)
    if p.direction is Direction.BWD_WEIGHT:
        (out_h, out_w), (in_h, in_w), (pad_h, pad_w) = p.output_size, p.input_size, p.padding
        workspace = torch.empty(config.split_k * p.c * fy * fx, dtype=torch.float32, device=out.device)
        bound = {"x_ptr": ops.x, "y_ptr": ops.dy, "ws_ptr": workspace, "N": p.n, "C": p.c, "H": in_h, "W": in_w,
                 "OH": out_h, "OW": out_w, "FX": fx, "PH": pad_h, "PW": pad_w,
                 **dict(zip(TOEPLITZ_STRIDES, (ops.x.stride(0), ops.x.stride(2), ops.x.stride(3),
                                               ops.dy.stride(0), ops.dy.stride(2), ops.dy.stride(3))))}
        grid = (cdiv(p.c, config.block_c), config.split_k, 1)
        return Plan((Launch("main", grid, bound_values(units[0], bound)),
                     reduce_launch(units[1], workspace, out, p, fy * fx)), out, scratch=(workspace,))
    walk = ToeplitzWalk.of(p)
    src = ops.x if p.direction is Direction.FORWARD else ops.dy
    w = ops.w
    (in_h, in_w), (out_h, out_w), (pad_h, pad_w) = walk.source, walk.output, walk.padding
    res_n, _, res_h, res_w = dim_strides(ops.residual)
    walk_bound = {"x_ptr": src, "w_ptr": w, "y_ptr": out, "bias_ptr": ops.bias, "res_ptr": ops.residual,
                  "N": p.n, "C": p.c, "H": in_h, "W": in_w, "OH": out_h, "OW": out_w, "FX": fx,
                  "PH": pad_h, "PW": pad_w, "swk": w.stride(0), "swy": w.stride(2), "swx": w.stride(3),
                  **dict(zip(TOEPLITZ_STRIDES, (src.stride(0), src.stride(2), src.stride(3), out.stride(0),
                                                out.stride(2), out.stride(3), res_n, res_h, res_w)))}
    grid = (cdiv(p.n * cdiv(out_w, NW), config.block_m), cdiv(p.c, config.block_c),
            cdiv(out_h, config.rows))
    return Plan((Launch("main", grid, bound_values(units[0], walk_bound)),), out)


FAMILY = FAMILIES.register(KernelFamily(
    op="conv", name=Family.TOEPLITZ.value, config_type=ToeplitzConfig, validate=findings, supports=supports,
    score=toeplitz_score, kernel_units=kernel_units, plan=plan, correction=correction,
))
