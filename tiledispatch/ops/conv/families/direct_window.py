"""The direct family's sliding-window kernels (`DirectConfig.window` > 0; kernels/direct.py): depthwise,
a thread's run of output pixels along W held in registers. Their rules, register fits and caps, and
their model, which family `direct` (direct.py) calls for its window configs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ....core.dtypes import DType
from ....core.op import Score
from ....heuristics.analytic import blocks_per_sm, tile_efficiency, wave_efficiency
from ....heuristics.roofline import dram_bytes_per_s
from ..problem import ConvProblem, Direction
from ..ranking import L2_REUSE, SPILL_PENALTY, VENDOR_CALL_SECONDS, VENDOR_TRUST, ideal_seconds
from ..rules import ConvRule, Findings, registers_a_thread, registers_for

if TYPE_CHECKING:
    from .direct import DirectConfig

# The sliding-window kernels unroll the filter width and a thread's run of output pixels:
# every window x run pair is one FMA per channel in the unrolled body.
MAX_WINDOW = 11
MAX_RUN = 16
WINDOW_STRIDES = (1, 2)  # strides along W the window kernels are built for
DIRECT_FRACTION = 0.75  # of copy bandwidth, for a well-fed streaming kernel
# The sliding-window kernels (DirectConfig.window > 0), fitted to sm_90 SASS of bf16 forward
# builds (the loop over filter rows; 45 builds: windows 3/5/7, runs 4/8/14, 2-8 channels a
# thread, compiled offline): besides its run x window x channels FMAs, a thread spends per
# filter row ~6.2 instructions a loaded source vector, ~2.0 a source element (widening, zero
# fill), ~2.25 a weight element and ~44 fixed. Registers: window_registers; ptxas holds
# builds the fit puts up to ~300 within 255 with a few bytes of stack (16x64 w4 window 7 run 14:
# 16 bytes), and such builds were among the fastest on the H200, so only a fit past
# WINDOW_SPILL_REGISTERS is taken to spill. Those it puts at <= 200 compile capped
# (window_register_cap), so their blocks an SM follow the cap.
WINDOW_LOAD_INSTRUCTIONS = 6.2  # a source vector, besides its elements
WINDOW_SOURCE_ELEMENT_INSTRUCTIONS = 2.0  # a 16-bit source element (1.0 an fp32 one: no widening)
WINDOW_WEIGHT_INSTRUCTIONS = 2.25  # a weight element of the filter row
WINDOW_ROW_INSTRUCTIONS = 44  # a filter row's fixed cost a thread
WINDOW_STORE_INSTRUCTIONS = 8  # an output vector: narrowing, address, mask, store
WINDOW_ISSUE_EFFICIENCY = 0.6  # of the SM's issue rate: convnext 7x7 on the H200 (modelled 60 us, ran 56)
# Fitted on 18 depthwise forward shapes, 7x7 to 112x112 maps (H200: conv.csv, conv_depthwise_extra.csv
# and conv_depthwise_shapes.csv, the two best window tiles of each): measured ~ max(memory side x 0.64,
# issue side x 0.98) + 2 us, within -18 % .. +19 %. The memory side unscaled, with 4 us of launch,
# reads 1.0-1.8x slow, most on the small maps, and keeps cuDNN on MobileNet's 14x14 3x3 (window 1.30x)
# and EfficientNet's 7x7 5x5 (1.66x). The memory side's terms overstate its time, and the launch is one
# kernel's in the graph replays the benchmark times, as cuDNN's VENDOR_CALL_SECONDS.
WINDOW_MEMORY_FIT = 0.64
WINDOW_LAUNCH_SECONDS = VENDOR_CALL_SECONDS
WINDOW_SPILL_REGISTERS = 320
# This model's error on the H200 sweep of these kernels (conv_depthwise.csv: 4 cases x 2
# directions, ~58 tiles each): the picks' modelled / measured time 0.95-1.2, against the 0.8-1.9
# of the models VENDOR_TRUST guards against. Its scores are raised to match, so the dispatcher
# takes a window kernel over cuDNN when it is modelled faster by more than this. With
# WINDOW_MEMORY_FIT cuDNN models 1.11x the window kernel on MobileNet's 112x112 3x3, where the
# kernel ran 0.98x (71.0 against 69.4 us); 1.15 keeps cuDNN there and takes the window kernel on
# MobileNet's 28x28 and 14x14 and EfficientNet's 7x7, cuDNN modelled 1.20-1.33x it (the kernel ran
# 1.13-1.54x). MobileNet's 7x7 (cuDNN modelled 0.91x, the kernel ran 1.22x) is a miss.
WINDOW_MODEL_ERROR = 1.15


def accumulator_registers(config) -> int:
    """32-bit registers per thread that a direct tile's fp32 accumulators need (a DirectConfig's)."""
    if config.window and config.signature.direction is Direction.BWD_WEIGHT:
        elements = config.block_p * config.block_c * config.rows * config.window  # the taps are the sums
    else:
        elements = config.block_p * config.block_c * config.run
    return registers_for(elements, config.num_warps)


# The sliding-window kernels' registers a thread, fitted to sm_90 SASS of 45 bf16 forward builds
# (windows 3/5/7, runs 4/8/14, 2-8 channels a thread; window_score has the instruction side):
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
    cap = registers_a_thread(WEIGHT_WINDOW_WARPS_TO_OVERLAP * 32, registers_per_sm)
    return cap if weight_window_registers(config) <= cap else None


def window_findings(config: DirectConfig, out: Findings) -> None:
    """The window fields: within their ranges, and each only where its kernel holds it."""
    error = out.error
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


def window_refusal(config: DirectConfig, problem: ConvProblem) -> str | None:
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


def _window_issue(config: DirectConfig, p: ConvProblem, vector: int) -> tuple[float, int]:
    """Instructions a thread issues for the sliding-window kernel, and its registers (its cap if capped).

    A thread holds `elements` = block_p x block_c / threads channel values of each run
    position, in vectors of up to `vector`. Per filter row (FZ x FY of them) it loads the
    run's source columns once (config.window_columns: run + window - 1 at stride 1) and makes
    run x window x elements FMAs (backward-data at stride 2: each output takes the half of
    the taps of its parity); the row's weights are loaded once for all of them. Then each
    run position stores.
    """
    threads = config.num_warps * 32
    elements = max(1.0, config.block_p * config.block_c / threads)
    loads = math.ceil(elements / min(vector, elements))
    channels = min(elements, vector)  # distinct channels a thread holds: the weights it loads
    element_cost = WINDOW_SOURCE_ELEMENT_INSTRUCTIONS / (2 if p.types.dtype is DType.FP32 else 1)
    taps = config.window / (config.window_stride if p.direction is Direction.BWD_DATA else 1)
    per_row = (config.window_columns * (loads * WINDOW_LOAD_INSTRUCTIONS + elements * element_cost)
               + config.window * channels * WINDOW_WEIGHT_INSTRUCTIONS + WINDOW_ROW_INSTRUCTIONS
               + config.run * taps * elements)
    filter_rows = math.prod(p.filter_size[:-1])
    per_thread = filter_rows * per_row + loads * config.run * WINDOW_STORE_INSTRUCTIONS
    registers, cap = window_registers(config, vector), window_register_cap(config, vector)
    return per_thread, registers if cap is None else min(registers, cap)


def window_score(config: DirectConfig, p: ConvProblem, arch) -> Score:
    """The sliding-window kernel: the bytes at what its loads keep in flight, or its issue time if longer."""
    item = p.types.dtype.itemsize
    bandwidth = dram_bytes_per_s(arch)
    spatial = p.output_size if p.direction is Direction.FORWARD else p.input_size
    width = spatial[-1]
    runs = config.runs(p)
    lanes = p.c
    vector = min(16 // item, config.block_c) if p.specialization.aligned else 1
    threads = config.num_warps * 32
    per_thread, registers = _window_issue(config, p, vector)
    spills = registers > WINDOW_SPILL_REGISTERS
    registers = min(registers, arch.registers_per_thread_max)
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=0, registers_per_thread=registers)
    programs = math.ceil(runs / config.block_p) * math.ceil(lanes / config.block_c)
    waves = wave_efficiency(programs, arch.sm_count * resident)
    lane_use = tile_efficiency(lanes, config.block_c)
    row_use = tile_efficiency(width, config.run)  # run positions past the row's end are idle
    # Bytes in flight: a program issues a filter row's source vectors at once.
    per_program = config.block_p * config.window_columns * config.block_c * item
    programs_per_sm = min(resident, max(programs / arch.sm_count, 1.0))
    in_flight = min(1.0, per_program * programs_per_sm / arch.calibration.bytes_in_flight_per_sm)
    # A thread loads its channels of a column as one vector: 4-8-byte loads when it holds
    # 2-4 (mamba's 1-D k4: 16x64 w4, 8 channels a thread, 167 us; 16x16 w4, 2 channels, 239 us).
    load_bytes = min(vector, config.block_p * config.block_c / threads) * item
    in_flight *= min(1.0, load_bytes / 16) ** 0.5
    # and a row's channels as one contiguous segment: 64 bytes ran ~20 % slower than 128 there
    # (32x32 against 16x64 tiles, the same bytes per program).
    in_flight *= min(1.0, config.block_c * item / 128) ** 0.3
    efficiency = lane_use * row_use * waves * in_flight * DIRECT_FRACTION
    efficiency *= SPILL_PENALTY if spills else 1.0
    # Each source element is loaded once a filter row, and again where neighbouring runs' columns
    # overlap (window - stride of them): the loads past the first come from L1/L2, so short runs
    # cost (mamba's 1-D k4 on the H200: run 4 210 us, run 14 167).
    source_bytes = p.n * p.c * math.prod(p.input_size if p.direction is Direction.FORWARD else p.output_size) * item
    if p.direction is Direction.BWD_DATA:  # source columns a run's outputs span: dy's at 1 / stride
        spanned = config.run / config.window_stride
    else:
        spanned = config.run * config.window_stride
    reloads = math.prod(p.filter_size[:-1]) * config.window_columns / spanned - 1
    memory_s = (p.bytes() + source_bytes * reloads / L2_REUSE) / (bandwidth * efficiency) * WINDOW_MEMORY_FIT
    # Issue time follows the busiest SM, whose resident programs share its schedulers: it
    # issues ceil(programs / SMs) programs' instructions, however many run at once.
    busiest = math.ceil(programs / arch.sm_count)
    calibration = arch.calibration
    issue_s = busiest * config.num_warps * per_thread / (calibration.issue_per_sm_cycle * calibration.clock_hz
                                                         * WINDOW_ISSUE_EFFICIENCY)
    issue_s /= SPILL_PENALTY if spills else 1.0
    modelled = max(memory_s, issue_s) + WINDOW_LAUNCH_SECONDS
    ideal = ideal_seconds(p, arch)
    terms = {"lanes": lane_use, "rows": row_use, "waves": waves, "in_flight": in_flight,
             "resident": float(resident), "spills": float(spills), "registers": float(registers),
             "instructions_per_fma": per_thread * threads / max(p.flops() / 2 / programs, 1.0),
             "issue_us": issue_s * 1e6, "memory_us": memory_s * 1e6, "modelled_us": modelled * 1e6}
    return Score(ideal / modelled * VENDOR_TRUST / WINDOW_MODEL_ERROR, terms)


# The backward-weight window kernel (kernels/direct.py, conv_bwd_weight_direct_window), counted on
# sm_90 SASS of bf16 builds (the loop over a program's tiles; a thread's block is band x run outputs
# of e = block_p * block_c / threads channels): 3x3 16x64 w4 run 7: 1181 instructions for 504 FMAs,
# run 4 band 2: 1218 for 576; 7x7 4x64 w4 run 7 band 2: 2580 for 1372, run 4 band 4: 2760 for 1568;
# 5x5 8x64 w4 run 4 band 2: 1556 for 800; mamba k4 16x64 w4 run 16: 1254 for 512. They fit ~7 a
# loaded vector (load, zero fill, two border compares, a 64-bit address) plus one a widened element,
# ~60 a tile, and the FMAs. Outside the loop, the sums across the tile's threads: ~15 an accumulator.
WEIGHT_WINDOW_LOAD_INSTRUCTIONS = 7
WEIGHT_WINDOW_TILE_INSTRUCTIONS = 60
WEIGHT_WINDOW_SUM_INSTRUCTIONS = 15


def weight_window_score(config: DirectConfig, p: ConvProblem, arch) -> Score:
    """The backward-weight window kernel: issue (FMAs plus per-load cost) and bytes, overlapped as far
    as the resident warps allow, plus the workspace's reduction stage."""
    item = p.types.dtype.itemsize
    bandwidth = dram_bytes_per_s(arch)
    threads = config.num_warps * 32
    per_thread = max(1.0, config.block_p * config.block_c / threads)  # channels of a thread's block
    vector = min(16 // item, per_thread) if p.specialization.aligned else 1
    widen = 0 if p.types.dtype is DType.FP32 else 1
    fz, fy, fx = p.padded3(p.filter_size, 1)
    od, oh, ow = p.padded3(p.output_size, 1)
    runs = math.ceil(ow / config.run)
    blocks = p.n * od * math.ceil(oh / config.band) * runs
    tiles = math.ceil(blocks / config.block_p)
    per_split = math.ceil(tiles / config.split_k)
    passes = fz * math.ceil(fy / config.rows)
    loads = ((config.band + config.rows - 1) * config.window_columns + config.band * config.run) * (
        per_thread / vector)
    fmas = config.band * config.run * config.rows * config.window * per_thread
    per_tile = loads * (WEIGHT_WINDOW_LOAD_INSTRUCTIONS + widen * vector) + fmas + WEIGHT_WINDOW_TILE_INSTRUCTIONS
    accumulators = config.rows * config.window * per_thread
    per_program = passes * (per_split * per_tile + accumulators * WEIGHT_WINDOW_SUM_INSTRUCTIONS)
    registers = weight_window_registers(config)
    spills = registers > arch.registers_per_thread_max
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=0,
                             registers_per_thread=min(registers, arch.registers_per_thread_max))
    programs = math.ceil(p.c / config.block_c) * config.split_k
    per_sm = math.ceil(programs / arch.sm_count)  # the busiest SM's programs
    warps = min(resident, per_sm) * config.num_warps
    calibration = arch.calibration
    issue_s = (per_sm * config.num_warps * per_program
               / (calibration.issue_per_sm_cycle * calibration.clock_hz * WINDOW_ISSUE_EFFICIENCY
                  * min(1.0, warps / calibration.issue_per_sm_cycle)))
    issue_s /= SPILL_PENALTY if spills else 1.0
    workspace = config.split_k * p.k * math.prod(p.filter_size) * 4 if config.split_k > 1 else 0
    busy = min(1.0, programs / arch.sm_count)  # SMs with a program to stream for
    # A warp's load is 32 lanes' adjacent channels: 64-512 contiguous bytes, whole sectors at any vector.
    memory_s = (p.bytes() + workspace) / (bandwidth * DIRECT_FRACTION * busy)
    overlap = min(1.0, warps / WEIGHT_WINDOW_WARPS_TO_OVERLAP)
    kernel_s = max(memory_s, issue_s) + (1.0 - overlap) * min(memory_s, issue_s)
    reduce_s = 0.0
    if config.split_k > 1:
        reduce_s = (config.split_k + 1) * p.k * math.prod(p.filter_size) * 4 / bandwidth + arch.calibration.launch_s
    modelled = kernel_s + arch.calibration.launch_s + reduce_s
    ideal = ideal_seconds(p, arch)
    terms = {"passes": float(passes), "tiles_per_program": float(per_split), "programs": float(programs),
             "resident": float(resident), "warps_per_sm": float(warps), "registers": float(registers),
             "spills": float(spills), "instructions_per_fma": per_tile / fmas, "issue_us": issue_s * 1e6,
             "memory_us": memory_s * 1e6, "reduce_us": reduce_s * 1e6, "modelled_us": modelled * 1e6}
    return Score(ideal / modelled, terms)
