"""Family `direct`: no tensor cores, channel vectors of fp32 FMAs (kernels/direct.py), for depthwise
convs and few channels a group. The per-tap kernels are here; the sliding-window kernels' own
rules and model (configs with a `window`) are in direct_window.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ....core.arith import cdiv
from ....core.family import CorrectionSpace, KernelFamily
from ....core.op import KernelUnit, Score
from ....heuristics.analytic import blocks_per_sm, tile_efficiency, wave_efficiency
from ....heuristics.roofline import dram_bytes_per_s, fma_flops
from ..plan import ALIGNED_TENSORS, KERNELS, epilogue_constexprs, output_tensor, pointer_plan, pointer_unit
from ..plan import reduce_unit, splits, target
from ..problem import ConvProblem, ConvSpecialization, Direction
from ..ranking import L2_REUSE, SPILL_PENALTY, ideal_seconds
from ..rules import REGISTER_RESERVE, WARP_CHOICES, ConvRule, Findings, corrected_split, program_findings
from ..rules import signature_findings, signature_refusal
from ..signature import FAMILIES, ConvSignature, Family
from .direct_window import (
    DIRECT_FRACTION,
    accumulator_registers,
    weight_window_register_cap,
    weight_window_score,
    window_findings,
    window_refusal,
    window_register_cap,
    window_score,
)

MODULE = f"{KERNELS}.direct"
FUNCTIONS = {Direction.FORWARD: "conv_fwd_direct", Direction.BWD_DATA: "conv_bwd_data_direct",
             Direction.BWD_WEIGHT: "conv_bwd_weight_direct"}
# Direct configs with a window (depthwise by sliding windows along W).
WINDOW_FUNCTIONS = {Direction.FORWARD: "conv_fwd_direct_window", Direction.BWD_DATA: "conv_bwd_data_direct_window",
                    Direction.BWD_WEIGHT: "conv_bwd_weight_direct_window"}
CHANNELS_FASTEST_PIXEL_BYTES = 2048  # pixels this long: window kernels step channel blocks fastest
DIRECT_BLOCK_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# The direct family loops over C/G (forward) or K/G (backward-data) per lane: beyond this
# many channels per group the tensor cores of the implicit GEMM win by far.
DIRECT_MAX_CHANNELS_PER_GROUP = 16
DIRECT_REGISTERS_PER_ACCUMULATOR = 3
DIRECT_REGISTER_BASE = 32
DIRECT_ISSUE_ROWS = 1.0  # rows a thread needs to halve its issue overhead (a guess to calibrate on the H200)
# The direct kernels' rate of output-taps as a fraction of the CUDA-core FMA rate, per
# direction and lane kind (the H200 conv table of VENDOR_FRACTION): each tap of each row costs a load,
# a widening, the border mask and the FMA, ~10 instructions a useful FMA. Depthwise
# forward / bwd_data: mbv2 3x3 4.2 TFLOP/s, 5x5 4.2, 7x7 6.7, mamba 3.6 (0.06-0.11 of 61.75);
# backward-weight 1.1-1.5 TFLOP/s (0.018-0.025: a product, a row sum per tap, split-K);
# C/G > 1 (one lane per channel, a gather per input channel): resnext g32 forward 0.5-1.0
# TFLOP/s, backward-weight 0.23 (0.004).
DIRECT_FMA_FRACTION = {
    (Direction.FORWARD, True): 0.08, (Direction.BWD_DATA, True): 0.08, (Direction.BWD_WEIGHT, True): 0.022,
    (Direction.FORWARD, False): 0.016, (Direction.BWD_DATA, False): 0.016, (Direction.BWD_WEIGHT, False): 0.004,
}


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

    @functools.cached_property  # a window score reads it three times: once a config, not an import each time
    def window_columns(self) -> int:
        """Source columns a window kernel's run loads once each, a filter row: input columns
        (run - 1) x stride + window wide for forward and backward-weight, dy columns that reach the
        run's input columns for backward-data. The kernels' own count (their loops' bound)."""
        from ..kernels.window import window_columns

        return window_columns(self.run, self.window, self.window_stride,
                              self.signature.direction is Direction.BWD_DATA)

    @property
    def workspace_slabs(self) -> int:
        return self.split_k


def findings(config: DirectConfig, arch) -> Findings:
    """The direct family's rules, after the signature's and the program's."""
    out = Findings()
    error, warning = out.error, out.warning
    sig = config.signature
    signature_findings(sig, arch, out)
    program_findings(config, out, split_mode=False)
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    regs = accumulator_registers(config)
    for field in ("block_p", "block_c"):
        value = getattr(config, field)
        if value not in DIRECT_BLOCK_CHOICES:
            error(ConvRule.TILE_POWER_OF_TWO, f"{field}={value} is not one of {DIRECT_BLOCK_CHOICES}")
    window_findings(config, out)
    vector = 16 // sig.types.dtype.itemsize
    if config.block_c < vector:
        warning(ConvRule.VECTOR_WIDTH, f"block_c={config.block_c} channels are less than one 16-byte vector "
                f"({vector} x {sig.types.dtype.value})", f"use block_c >= {vector}")
    if regs > budget:
        error(ConvRule.REGISTER_BUDGET, f"the {config.block_p}x{config.block_c} accumulator needs {regs} "
              f"registers per thread over {config.num_warps} warps; at most {budget} fit",
              "more warps or a smaller tile")
    return out


def correction(config: DirectConfig) -> CorrectionSpace:
    """The tile and warps may move; the split is put right first."""
    return CorrectionSpace(replace(config, split_k=corrected_split(config)),
                           {"block_p": DIRECT_BLOCK_CHOICES, "block_c": DIRECT_BLOCK_CHOICES, "num_warps": WARP_CHOICES})


def supports(config: DirectConfig, problem: ConvProblem) -> str | None:
    """Why the direct kernel of `config` cannot compute `problem` (None: it can)."""
    refusal = signature_refusal(config, problem)
    if refusal is not None:
        return refusal
    per_group = max(problem.c_per_group, problem.k_per_group)
    if per_group > DIRECT_MAX_CHANNELS_PER_GROUP:
        return (f"the direct family serves up to {DIRECT_MAX_CHANNELS_PER_GROUP} channels per group; this "
                f"conv has C/G={problem.c_per_group}, K/G={problem.k_per_group}")
    if config.window:
        return window_refusal(config, problem)
    return None


def _stride_hit_rate(p: ConvProblem) -> float:
    """The direct family's backward-data visits every (input pixel, tap): 1 in prod(stride) meets an output pixel.

    (The igemm family's visits only its phase's taps, which all do.)
    """
    return 1.0 / math.prod(p.stride) if p.direction is Direction.BWD_DATA else 1.0


def score(config: DirectConfig, p: ConvProblem, arch) -> Score:
    """The per-tap kernels' bytes at what their loads keep in flight, or their FMAs if slower (window
    kernels: direct_window.py)."""
    if config.window and p.direction is Direction.BWD_WEIGHT:
        return weight_window_score(config, p, arch)
    if config.window:
        return window_score(config, p, arch)
    item = p.types.dtype.itemsize
    bandwidth = dram_bytes_per_s(arch)
    fma = fma_flops(arch)
    pixels_out = p.n * math.prod(p.output_size)
    pixels_in = p.n * math.prod(p.input_size)
    taps = math.prod(p.filter_size)
    if p.direction is Direction.FORWARD:
        rows, lanes, programs_axis = pixels_out, p.k, 1
    elif p.direction is Direction.BWD_DATA:
        rows, lanes, programs_axis = pixels_in, p.c, 1
    else:
        rows, lanes, programs_axis = pixels_out, p.k * p.c_per_group, config.split_k
    lane_use = tile_efficiency(lanes, config.block_c)
    row_use = tile_efficiency(rows, config.block_p) if p.direction is not Direction.BWD_WEIGHT else 1.0
    threads = config.num_warps * 32
    # Each accumulator row a thread holds also keeps its loaded vector (widened to fp32),
    # its pointer and coordinates: sm_90 builds of the depthwise forward take 72, 123 and 226
    # registers for 16, 32 and 64 accumulators a thread.
    registers = DIRECT_REGISTERS_PER_ACCUMULATOR * accumulator_registers(config) + DIRECT_REGISTER_BASE
    spills = registers > arch.registers_per_thread_max
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=0,
                             registers_per_thread=min(registers, arch.registers_per_thread_max))
    if p.direction is Direction.BWD_WEIGHT:
        programs = math.ceil(lanes / config.block_c) * programs_axis
    else:
        programs = math.ceil(rows / config.block_p) * math.ceil(lanes / config.block_c)
    waves = wave_efficiency(programs, arch.sm_count * resident)
    # Bytes a program has in flight: one channel vector per pixel row, each tap.
    vector = min(config.block_c * item, 16) if p.specialization.aligned else item
    per_program = config.block_p * config.block_c * item * (2 if p.direction is Direction.BWD_WEIGHT else 1)
    programs_per_sm = min(resident, max(programs / arch.sm_count, 1.0))
    in_flight = (min(1.0, per_program * programs_per_sm / arch.calibration.bytes_in_flight_per_sm)
                 * min(1.0, vector / 16))
    # Issue: a thread's per-tap weight loads and tap arithmetic are shared by the rows it
    # holds of one channel vector; with few rows the kernel runs out of instruction slots
    # before it runs out of bandwidth.
    rows_per_thread = max(1.0, config.block_p * config.block_c / (threads * max(16 // item, 1)))
    issue = rows_per_thread / (rows_per_thread + DIRECT_ISSUE_ROWS)
    efficiency = lane_use * row_use * waves * in_flight * issue * DIRECT_FRACTION
    efficiency *= SPILL_PENALTY if spills else 1.0
    bytes_moved = p.bytes()
    if p.direction is Direction.BWD_WEIGHT:
        # Each program re-reads its pixels' dy and x once per tap, mostly from L1/L2.
        bytes_moved += (taps - 1) * (bytes_moved - p.k * p.c_per_group * taps * item) / (4 * L2_REUSE)
    memory_s = bytes_moved / (bandwidth * efficiency)
    hits = _stride_hit_rate(p)
    # Issue-bound side: output-taps at the measured fraction of the FMA rate for this
    # direction and lane kind, less where a thread holds few rows to share its per-tap work.
    rate = fma * DIRECT_FMA_FRACTION[(p.direction, p.one_channel_per_group)]
    compute_s = p.flops() / (rate * lane_use * row_use * waves * hits * issue)
    compute_s /= SPILL_PENALTY if spills else 1.0
    reduce_s = 0.0
    if config.split_k > 1:
        reduce_s = (config.split_k + 1) * p.k * p.c_per_group * taps * 4 / bandwidth + arch.calibration.launch_s
    modelled = max(memory_s, compute_s) + arch.calibration.launch_s + reduce_s
    ideal = ideal_seconds(p, arch)
    terms = {"lanes": lane_use, "rows": row_use, "waves": waves, "in_flight": in_flight,
             "resident": float(resident), "spills": float(spills), "modelled_us": modelled * 1e6}
    return Score(ideal / modelled, terms)


def kernel_units(config: DirectConfig, specialization: ConvSpecialization, arch) -> tuple[KernelUnit, ...]:
    """The main stage (a per-tap or a window kernel), and a split backward-weight's reduce."""
    sig = config.signature
    vec = specialization.vector(sig.types.dtype, per_group=False)
    constexprs = {"BLOCK_P": config.block_p, "BLOCK_C": config.block_c, "SPLIT_K": config.split_k,
                  **epilogue_constexprs(sig), "VEC": vec, "DEPTHWISE": specialization.depthwise,
                  "UNIT_STRIDE": specialization.unit_stride}
    if config.window:
        constexprs |= {"RUN": config.run, "WINDOW": config.window}
        if sig.direction is Direction.BWD_WEIGHT:  # each in the kernels' order of parameters
            constexprs |= {"ROWS": config.rows, "BAND": config.band, "WINDOW_STRIDE": config.window_stride}
        else:
            constexprs |= {"WINDOW_STRIDE": config.window_stride, "ONE_ROW": specialization.one_row}
    function = (WINDOW_FUNCTIONS if config.window else FUNCTIONS)[sig.direction]
    main = pointer_unit(config, MODULE, function, constexprs, aligned_pointers=ALIGNED_TENSORS if vec > 1 else (),
                        num_stages=1, max_registers=_window_cap(config, vec, arch) if config.window else None)
    return (main, reduce_unit(config, specialization)) if splits(config) else (main,)


def _window_cap(config: DirectConfig, vector: int, arch) -> int | None:
    if config.signature.direction is Direction.BWD_WEIGHT:
        return weight_window_register_cap(config, target(arch).registers_per_sm)
    return window_register_cap(config, vector)


def channels_fastest(config: DirectConfig, p) -> bool:
    """Whether a window kernel steps its channel blocks fastest (kernels/direct.py `_program_tile`).

    Measured, not derived (benchmarks/conv_depthwise.py, both orders in turns on the H200):
    the Mamba conv1d, whose pixels are 4 KB (C=2048 in bf16), ran its best tile 1.15x faster
    (167.8 -> 145.9 us, 0.76 -> 0.87 of a copy of its bytes) and its 32-channel tiles up to
    1.41x. The 2-D cases, with 0.75-1.3 KB pixels, kept their best tiles' times within 3 %,
    while some other tiles ran up to 1.4x slower (MobileNet's runs of 7) or faster (5x5's
    short runs): there the order stays pixel blocks first.
    """
    return config.window > 0 and p.c * p.types.dtype.itemsize >= CHANNELS_FASTEST_PIXEL_BYTES


def grid(config: DirectConfig, p, taps: int) -> tuple[int, int, int]:
    """Programs: pixel blocks (window kernels: blocks of runs) by channel blocks, or backward-weight's
    channel blocks by splits."""
    pixels_out = p.n * math.prod(p.output_size)
    pixels_in = p.n * math.prod(p.input_size)
    d = p.direction
    bp, bc = config.block_p, config.block_c
    if config.window and d is Direction.BWD_WEIGHT:  # channel blocks x shares of the runs
        return (cdiv(p.c, bc), config.split_k, 1)
    if config.window:  # rows of the tile are runs of config.run pixels along W
        runs = config.runs(p)
        if channels_fastest(config, p):  # one axis: the kernel steps the channel blocks fastest
            return (cdiv(runs, bp) * cdiv(p.c, bc), 1, 1)
        return (cdiv(runs, bp), cdiv(p.c, bc), 1)
    if d is Direction.FORWARD:
        return (cdiv(pixels_out, bp), cdiv(p.k, bc), 1)
    if d is Direction.BWD_DATA:
        return (cdiv(pixels_in, bp), cdiv(p.c, bc), 1)
    return (cdiv(p.k * p.c_per_group, bc), config.split_k, 1)


def plan(config: DirectConfig, ops):
    # the window kernels read the filter's taps along W as contiguous (kernels/direct.py)
    return pointer_plan(config, ops, output_tensor(ops), grid, contiguous_taps=config.window > 0)


FAMILY = FAMILIES.register(KernelFamily(
    op="conv", name=Family.DIRECT.value, config_type=DirectConfig, validate=findings, supports=supports,
    score=score, kernel_units=kernel_units, plan=plan, correction=correction,
))
