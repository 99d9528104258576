"""What the igemm and igemm-flat families share: the `ImplicitGemmConfig`, its rules, its GEMM model,
its pointer-kernel unit and its grid.

Both are implicit GEMMs of one config type, told apart by `config.family`: igemm reduces C/G
(or K/G) per filter tap, igemm-flat the filter's (tap, channel) pairs as one flat index, for few
channels a group. Each registers its own family (igemm.py, igemm_flat.py) from these parts; the
flat family adds its backward-data's col2im stage and its channel padding.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ....core.arith import cdiv
from ....core.family import CorrectionSpace
from ....core.op import KernelUnit, Score
from ....heuristics.analytic import blocks_per_sm, tile_efficiency
from ....heuristics.roofline import dram_bytes_per_s, per_problem
from ..plan import ALIGNED_TENSORS, epilogue_constexprs, pointer_unit, reduce_unit, splits
from ..problem import ConvProblem, ConvSpecialization, Direction
from ..ranking import L2_REUSE, NONDETERMINISTIC_PENALTY, SPILL_PENALTY, ideal_seconds, peak_flops, sm_efficiency
from ..rules import (
    BLOCK_CHOICES,
    REGISTER_RESERVE,
    STAGE_CHOICES,
    WARP_CHOICES,
    ConvRule,
    Findings,
    corrected_split,
    pipeline_shared_bytes,
    power_of_two,
    program_findings,
    registers_for,
    signature_findings,
    signature_refusal,
)
from ..signature import ConvSignature, Family, SplitMode, SplitReduction

MERGE_CHOICES = (1, 2, 4, 8, 16)
# The igemm-flat family walks the filter's (tap, channel) pairs flat: it pays where the igemm
# family would pad each tap's few channels to a whole block of 16 or more.
FLAT_MAX_CHANNELS_PER_GROUP = 8
# Fractions of the ideal each path reaches at its best. Tiled Triton GEMMs reached 0.62
# of peak on an H200 (ops/gemm/ranking.py); an implicit GEMM pays its address arithmetic.
TILED_FRACTION = 0.5
# Issue cost of one reduction step of an implicit GEMM besides its MMAs, in instructions a
# warp: sm_90 SASS of the 128x128x64 8-warp tile spends ~199 a step, of
# which 8 are 16-byte loads a thread; the rest is the fixed cost of the step. A load that
# the alignment leaves at one element costs as much as a vector one, for one element.
STEP_INSTRUCTIONS = 100
INSTRUCTIONS_PER_LOAD = 12
# Backward-weight also walks the step's pixels: each pixel row a thread loads (one per vector
# load) carries its coordinates and offsets, ~29 more a load (429 a step for 128x128x64 w8).
WEIGHT_INSTRUCTIONS_PER_LOAD = 29
# igemm-flat gathers the im2col matrix element by element: each adds its column's tap offset
# and checks the borders in three dims (a guess, to be fitted to conv.csv's stem rows).
FLAT_GATHER_INSTRUCTIONS = 6
# The operand bytes one SM's L2 port takes a second, before TILED_FRACTION (so ~100 GB/s in
# the kernel's own time, the machine's arch.calibration.tma_port_bytes_per_s). A kernel term: a
# ranking parameter fitted to this op's kernels with their fractions, not a measured intake. On
# conv.csv (H200) 160-300e9 rank alike: the Triton-only selection 0.962 mean and 0.889 P10 (0.948
# and 0.844 without the term), with cuDNN 0.979; at 140e9 and below that last falls to 0.971 and
# under (benchmarks/evaluate_conv_rules.py).
SM_PORT_BYTES_PER_S = 200e9


@dataclass(frozen=True)
class ImplicitGemmConfig(SplitReduction):
    """An implicit GEMM: block_m x block_n output tile, block_k deep steps of the reduction.

    The GEMM view per group: forward M = output pixels, N = K/G, reduction = taps x C/G;
    backward-data M = input pixels, N = C/G, reduction = taps x K/G; backward-weight
    M = K/G, N = C/G (per tap), reduction = output pixels, split over `split_k` programs.
    Family `igemm-flat` (forward and backward-weight) takes taps x C/G as one flat index
    where the others take C/G per tap: forward's reduction, backward-weight's N. With
    `pad_channels` it first copies x (and forward's w) with C padded to a whole 16-byte
    vector of zeros, so that a C=3 stem's gathers are vectors (igemm_flat.py, name `_pc`).
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

    @functools.cached_property  # a padded score reads it for every problem: one copy a config
    def unpadded(self) -> ImplicitGemmConfig:
        """The kernel a `pad_channels` config runs on the padded copy of the problem."""
        return replace(self, pad_channels=False)


def shared_memory_bytes(config: ImplicitGemmConfig) -> int:
    """Shared memory of the software pipeline: one A and one B tile per stage."""
    return pipeline_shared_bytes(config.num_stages, config.block_m, config.block_n, config.block_k,
                                 config.signature.types.dtype.itemsize)


def accumulator_registers(config: ImplicitGemmConfig) -> int:
    """32-bit registers per thread that the fp32 accumulator tile needs."""
    return registers_for(config.block_m * config.block_n, config.num_warps)


def findings(config: ImplicitGemmConfig, arch) -> Findings:
    """Every rule of an implicit-GEMM config: the signature's, the program's, the tile's."""
    out = Findings()
    error, warning = out.error, out.warning
    sig = config.signature
    signature_findings(sig, arch, out)
    program_findings(config, out, split_mode=True)
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    regs = accumulator_registers(config)

    blocks = {"block_m": config.block_m, "block_n": config.block_n, "block_k": config.block_k}
    for field, value in blocks.items():
        if not power_of_two(value):
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
    return out


def correction(config: ImplicitGemmConfig) -> CorrectionSpace:
    """The tile, warps and stages may move; the split, its mode, group_m and the merge are put right first."""
    split = corrected_split(config)
    merge = config.groups_per_tile if config.groups_per_tile in MERGE_CHOICES else 1
    base = replace(config, split_k=split, group_m=max(config.group_m, 1),
                   split_mode=SplitMode.WORKSPACE if split == 1 else config.split_mode,
                   groups_per_tile=1 if config.signature.direction is Direction.BWD_WEIGHT else merge)
    return CorrectionSpace(base, {"block_m": BLOCK_CHOICES, "block_n": BLOCK_CHOICES, "block_k": BLOCK_CHOICES,
                                  "num_warps": WARP_CHOICES, "num_stages": STAGE_CHOICES})


def supports(config: ImplicitGemmConfig, problem: ConvProblem) -> str | None:
    """None if this kernel computes `problem`; else why not, in words."""
    refusal = signature_refusal(config, problem)
    if refusal is not None:
        return refusal
    if config.groups_per_tile > 1:
        depth = problem.c_per_group if problem.direction is Direction.FORWARD else problem.k_per_group
        if config.groups_per_tile * depth > config.block_k:
            return (f"{config.groups_per_tile} merged groups of {depth} reduction channels exceed block_k="
                    f"{config.block_k}: a merged tile reads all its groups' channels in one block")
    if config.family is Family.IMPLICIT_GEMM_FLAT and problem.c_per_group > FLAT_MAX_CHANNELS_PER_GROUP:
        return (f"igemm-flat serves up to {FLAT_MAX_CHANNELS_PER_GROUP} input channels per group, where igemm "
                f"would pad each tap's channels; this conv has C/G={problem.c_per_group} (igemm serves it)")
    if config.pad_channels:
        return _padding_refusal(problem)
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


@dataclass(frozen=True)
class GemmView:
    """The GEMM one group of the conv is, for a direction: rows, columns, and the reduction (taps x depth)."""

    m: int
    n: int
    taps: int
    depth: int  # channels reduced per tap (C/G or K/G); for backward-weight, the pixels


@per_problem  # every igemm candidate's score reads it: once a problem
def gemm_view(p: ConvProblem) -> GemmView:
    taps = math.prod(p.filter_size)
    pixels_out = p.n * math.prod(p.output_size)
    if p.direction is Direction.FORWARD:
        return GemmView(pixels_out, p.k_per_group, taps, p.c_per_group)
    if p.direction is Direction.BWD_DATA:
        return GemmView(p.n * math.prod(p.input_size), p.c_per_group, taps, p.k_per_group)
    return GemmView(p.k_per_group, p.c_per_group * taps, 1, pixels_out)


def _steps(config: ImplicitGemmConfig, p: ConvProblem, v: GemmView) -> int:
    """Reduction steps of one tile: each loads a block_m x block_k and a block_k x block_n operand tile."""
    if p.direction is Direction.BWD_WEIGHT:
        return math.ceil(math.ceil(v.depth / config.block_k) / config.split_k)
    if config.family is Family.IMPLICIT_GEMM_FLAT:
        return math.ceil(v.taps * v.depth / config.block_k)
    # backward-data visits its stride phase's taps only
    taps = (math.prod(-(-f // s) for f, s in zip(p.filter_size, p.stride))
            if p.direction is Direction.BWD_DATA else v.taps)
    return taps * math.ceil(config.groups_per_tile * v.depth / config.block_k)


@dataclass(frozen=True)
class Occupancy:
    """A program's registers a thread, whether they spill, and how many programs an SM holds."""

    registers: int
    spills: bool
    resident: int


@dataclass(frozen=True)
class TileFacts:
    """What an igemm score reads of its config and arch alone: the registry's configs are scored
    for every problem of their class, and these were a third of each score's work."""

    threads: int
    vector_loads: Occupancy  # operands loaded as 16-byte vectors
    element_loads: Occupancy  # an address and a mask an element (igemm-flat, channels not aligned)
    issue_rate: float  # warp instructions the SMs issue a second

    @staticmethod
    def of(config: ImplicitGemmConfig, arch) -> TileFacts:
        threads = config.num_warps * 32
        shared = shared_memory_bytes(config)
        limit = arch.registers_per_thread_max

        def occupancy(registers: int) -> Occupancy:
            return Occupancy(registers, registers > limit, blocks_per_sm(
                arch, threads=threads, shared_bytes=shared, registers_per_thread=min(registers, limit)))

        registers = accumulator_registers(config) + REGISTER_RESERVE
        elements = registers + 2 * (config.block_m + config.block_n) * config.block_k // threads
        calibration = arch.calibration
        return TileFacts(threads, occupancy(registers), occupancy(elements),
                         calibration.issue_per_sm_cycle * arch.sm_count * calibration.clock_hz)


def tile_facts(config: ImplicitGemmConfig, arch) -> TileFacts:
    """`config`'s TileFacts on `arch`, kept on the config for the last arch asked (configs are
    frozen, so they hold the facts outside their fields, as functools.cached_property would)."""
    kept = config.__dict__.get("_tile_facts")
    if kept is None or kept[0] is not arch:
        kept = (arch, TileFacts.of(config, arch))
        object.__setattr__(config, "_tile_facts", kept)
    return kept[1]


@dataclass(frozen=True)
class ProblemFacts:
    """What every igemm score of a problem reads of the problem and arch alone."""

    view: GemmView
    item: int
    peak: float
    bandwidth: float
    flops: int
    bytes: int
    ideal: float
    aligned: bool  # the groups' channels are 16-byte vectors (ConvSpecialization.groups_aligned)
    x_side: int  # elements a load of x and w (and flat runs) takes
    a_vector: int  # elements a load of the A tile takes (x forward, dy backward)


@per_problem  # every igemm candidate's score reads it: once a problem
def problem_facts(p: ConvProblem, arch) -> ProblemFacts:
    vector = max(16 // p.types.dtype.itemsize, 1)
    x_side = vector if p.specialization.groups_aligned else 1
    y_side = vector if p.specialization.outputs_aligned else 1
    return ProblemFacts(gemm_view(p), p.types.dtype.itemsize, peak_flops(p, arch), dram_bytes_per_s(arch),
                        p.flops(), p.bytes(), ideal_seconds(p, arch), p.specialization.groups_aligned,
                        x_side, x_side if p.direction is Direction.FORWARD else y_side)


def _intake_seconds(config: ImplicitGemmConfig, f: ProblemFacts, steps: int, tiles: int, arch) -> float:
    """The busiest SM's operand intake: every step's A and B tiles, through its own L2 port.

    DRAM serves each byte once, but each tile re-reads its operands from L2: a larger tile
    reads fewer bytes per FLOP. On conv.csv (H200) backward-data's 128x256 tile ran 1.7x the
    128x128 one on dilated_3x3_d2, 256x128 1.24x on unet_3x3, where the other terms tie them.
    """
    per_tile = (config.block_m + config.block_n) * config.block_k * steps * f.item
    return math.ceil(tiles / arch.sm_count) * per_tile / SM_PORT_BYTES_PER_S


def _issue_seconds(config: ImplicitGemmConfig, p: ConvProblem, f: ProblemFacts, facts: TileFacts, steps: int,
                   tiles: int) -> float:
    """Time the SMs spend issuing the loop's instructions besides the MMAs: steps x warps x a step's cost.

    Small tiles (128x16x16, one tap of 16 channels a step) and element loads (channels
    not 16-byte aligned, the C=3 stem) make this, not the tensor cores, the bound: on
    conv.csv the 128x16x16 resnext tiles ran 1.7x their MMA-and-bytes model, the stem's
    element-load tiles 10-40x. igemm-flat gathers im2col runs of C/G (elements unless aligned).
    """
    loads = (config.block_m * config.block_k / f.a_vector + config.block_k * config.block_n / f.x_side) / facts.threads
    if config.family is Family.IMPLICIT_GEMM_FLAT:  # the pixel walk is per row; each element checks its borders
        per_load = INSTRUCTIONS_PER_LOAD + FLAT_GATHER_INSTRUCTIONS
    else:
        per_load = INSTRUCTIONS_PER_LOAD + (WEIGHT_INSTRUCTIONS_PER_LOAD
                                            if p.direction is Direction.BWD_WEIGHT else 0)
    per_step = STEP_INSTRUCTIONS + per_load * max(loads, 1.0)
    warp_instructions = tiles * steps * config.num_warps * per_step
    return warp_instructions / facts.issue_rate


def _tiles(config: ImplicitGemmConfig, p: ConvProblem, v: GemmView, flat: bool) -> int:
    """Programs of the main stage, over all groups and splits."""
    if p.direction is Direction.BWD_WEIGHT and flat:
        return math.ceil(v.m / config.block_m) * math.ceil(v.n / config.block_n) * p.groups * config.split_k
    if p.direction is Direction.BWD_WEIGHT:
        tiles = math.ceil(v.m / config.block_m) * math.ceil(p.c_per_group / config.block_n)
        return tiles * (math.prod(p.filter_size) * p.groups * config.split_k)
    return (math.ceil(v.m / config.block_m) * math.ceil(config.groups_per_tile * v.n / config.block_n)
            * math.ceil(p.groups / config.groups_per_tile))


def _waste(config: ImplicitGemmConfig, p: ConvProblem, v: GemmView, flat: bool) -> tuple[float, float, float]:
    """Useful fractions of the tile's M, N and reduction (K) extents."""
    if p.direction is Direction.BWD_WEIGHT:
        span = config.block_k * config.split_k
        tile_k = tile_efficiency(v.depth, span) if v.depth >= span else v.depth / (
            math.ceil(v.depth / config.block_k) * config.block_k)
        tile_n = tile_efficiency(v.n if flat else p.c_per_group, config.block_n)
    elif flat:
        tile_k = tile_efficiency(v.taps * v.depth, config.block_k)
        tile_n = v.n / (math.ceil(v.n / config.block_n) * config.block_n)
    else:
        merged = config.groups_per_tile
        useful = min(merged, p.groups)  # merging more groups than the conv has only adds empty columns
        # Each tap's channels are padded to block_k; merged groups fill a tile block-diagonally.
        tile_k = tile_efficiency(merged * v.depth, config.block_k) / merged
        tile_n = useful * v.n / (math.ceil(merged * v.n / config.block_n) * config.block_n)
    return tile_efficiency(v.m, config.block_m), tile_n, tile_k


def igemm_score(config: ImplicitGemmConfig, p: ConvProblem, arch) -> Score:
    f = problem_facts(p, arch)
    facts = tile_facts(config, arch)
    v, item, bandwidth = f.view, f.item, f.bandwidth
    flat = config.family is Family.IMPLICIT_GEMM_FLAT  # N (backward-weight) or the reduction is taps x C/G
    tile_m, tile_n, tile_k = _waste(config, p, v, flat)
    occupancy = facts.element_loads if flat or not f.aligned else facts.vector_loads
    resident = occupancy.resident
    tiles = _tiles(config, p, v, flat)
    waves, concurrent = sm_efficiency(tiles, resident, config.num_warps, arch.sm_count)
    intensity = 2 * config.block_m * config.block_n / ((config.block_m + config.block_n) * item)
    feed = min(1.0, intensity * bandwidth * L2_REUSE / f.peak)
    latency = 1.0 if concurrent >= 2 else 0.9 if config.num_stages >= 3 else 0.8
    efficiency = tile_m * tile_n * tile_k * waves * feed * latency
    efficiency *= SPILL_PENALTY if occupancy.spills else 1.0
    compute_s = f.flops / (f.peak * efficiency)
    per_program = (config.block_m + config.block_n) * config.block_k * item * max(config.num_stages - 1, 1)
    programs_per_sm = min(resident, max(tiles / arch.sm_count, 1.0))
    in_flight = min(1.0, per_program * programs_per_sm / arch.calibration.bytes_in_flight_per_sm)
    if not f.aligned:
        in_flight *= 0.25  # element loads instead of 16-byte vectors
    # DRAM moves 32-byte sectors: a channel run shorter than one wastes the rest of it. A flat
    # step's run is a filter row's taps x channels, contiguous in a row of the input.
    run = p.filter_size[-1] * v.depth if flat else config.groups_per_tile * v.depth
    run_bytes = min(run, config.block_k) * item
    sectors = min(1.0, run_bytes / 32) if p.direction is not Direction.BWD_WEIGHT else 1.0
    in_flight *= sectors
    memory_s = f.bytes / (bandwidth * in_flight)
    reduce_s = 0.0
    if config.split_k > 1:
        weights = p.k * p.c_per_group * math.prod(p.filter_size)
        reduce_s = (config.workspace_slabs + 1) * weights * 4 / bandwidth + arch.calibration.launch_s
    steps = _steps(config, p, v)
    issue_s = _issue_seconds(config, p, f, facts, steps, tiles)
    intake_s = _intake_seconds(config, f, steps, tiles, arch)
    bound_s = (compute_s**3 + memory_s**3 + issue_s**3 + intake_s**3) ** (1 / 3)
    modelled = bound_s / TILED_FRACTION + arch.calibration.launch_s + reduce_s
    value = f.ideal / modelled
    if config.atomic_split:
        value *= NONDETERMINISTIC_PENALTY
    terms = {"tile_m": tile_m, "tile_n": tile_n, "tile_k": tile_k, "waves": waves, "feed": feed,
             "latency": latency, "sectors": sectors, "resident": float(resident), "in_flight": in_flight,
             "spills": float(occupancy.spills), "issue_us": issue_s * 1e6, "intake_us": intake_s * 1e6,
             "modelled_us": modelled * 1e6}
    return Score(value, terms)


def main_unit(config: ImplicitGemmConfig, specialization: ConvSpecialization, module: str, function: str) -> KernelUnit:
    """The implicit GEMM's main stage: `function` of kernel module `module`, compiled for `specialization`."""
    sig = config.signature
    vec = specialization.vector(sig.types.dtype, per_group=True)
    aligned_pointers = ALIGNED_TENSORS if vec > 1 else ()
    vec_y = specialization.output_vector(sig.types.dtype)
    if vec == 1 and vec_y > 1:
        aligned_pointers = ("y_ptr",)
    constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                  "GROUP_M": config.group_m, "SPLIT_K": config.split_k,
                  "ATOMIC": config.atomic_split, **epilogue_constexprs(sig),
                  "DOT_PRECISION": "tf32" if sig.types.allow_tf32 else "ieee", "VEC": vec, "VEC_Y": vec_y,
                  "POINTWISE": specialization.pointwise, "GROUPS_PER_TILE": config.groups_per_tile,
                  "EVEN_K": _even_channels(config, specialization),
                  "UNIT_STRIDE": specialization.unit_stride}
    return pointer_unit(config, module, function, constexprs, aligned_pointers=aligned_pointers,
                        num_stages=config.num_stages)


def units(config: ImplicitGemmConfig, specialization: ConvSpecialization, module: str,
          function: str) -> tuple[KernelUnit, ...]:
    """The main stage, and a split backward-weight's reduce."""
    main = main_unit(config, specialization, module, function)
    return (main, reduce_unit(config, specialization)) if splits(config) else (main,)


def _even_channels(config: ImplicitGemmConfig, specialization: ConvSpecialization) -> bool:
    """Whether the kernel's channel blocks are all whole, so it drops its channel masks.

    Forward and backward-data block the reduction's channels by block_k (merged groups
    keep their own masks); backward-weight blocks K/G by block_m and C/G by block_n.
    """
    if config.signature.direction is Direction.BWD_WEIGHT:
        return specialization.even_channels(max(config.block_m, config.block_n))
    return config.groups_per_tile == 1 and specialization.even_channels(config.block_k)


def grid(config: ImplicitGemmConfig, p, taps: int) -> tuple[int, int, int]:
    """Programs of each direction's kernel: tiles of M x N (merged groups share one), groups, and
    backward-data's stride phases or backward-weight's splits."""
    pixels_out = p.n * math.prod(p.output_size)
    d = p.direction
    bm, bn, merged = config.block_m, config.block_n, config.groups_per_tile
    if d is Direction.FORWARD:
        return (cdiv(pixels_out, bm) * cdiv(merged * p.k_per_group, bn), cdiv(p.groups, merged), 1)
    if d is Direction.BWD_DATA:  # axis 2: the stride's phases, each its own share of the input pixels
        per_phase = p.n * math.prod(cdiv(size, s) for size, s in zip(p.input_size, p.stride))
        return (cdiv(per_phase, bm) * cdiv(merged * p.c_per_group, bn), cdiv(p.groups, merged),
                math.prod(p.stride))
    return (taps * cdiv(p.k_per_group, bm) * cdiv(p.c_per_group, bn), p.groups, config.split_k)
