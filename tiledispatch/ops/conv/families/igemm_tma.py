"""Family `igemm-tma`: implicit GEMMs over boxes of pixels that TMA moves (kernels/implicit_gemm_tma.py),
stride 1 on sm_90+ in fp16 and bf16; backward-data is the forward kernel over dy reading the filter
turned in place. Its kernels take tensor descriptors, so its units and plan are its own."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ....arch import Feature
from ....core.arith import cdiv
from ....core.dtypes import DType
from ....core.family import CorrectionSpace, KernelFamily
from ....core.launch import Launch, Plan
from ....core.op import KernelUnit, Score
from ....heuristics.analytic import blocks_per_sm, tile_efficiency
from ....heuristics.roofline import dram_bytes_per_s
from ..operands import ConvOperands, to_channels_last
from ..plan import KERNELS, bound_values, checked_grid, dim_strides, epilogue_constexprs, made, output_tensor
from ..plan import kernel_units as op_kernel_units
from ..plan import reduce_launch, reduce_unit, split_workspace, splits
from ..problem import ConvProblem, ConvSpecialization, Direction
from ..ranking import NONDETERMINISTIC_PENALTY, ideal_seconds, peak_flops, sm_efficiency
from ..rules import BLOCK_CHOICES, REGISTER_RESERVE, STAGE_CHOICES, WARP_CHOICES, ConvRule, Findings
from ..rules import corrected_split, pipeline_shared_bytes, power_of_two, program_findings, registers_for
from ..rules import signature_findings, signature_refusal
from ..signature import FAMILIES, ConvSignature, Family, SplitMode, SplitReduction

MODULE = f"{KERNELS}.implicit_gemm_tma"
FUNCTIONS = {Direction.FORWARD: "conv_fwd_igemm_tma", Direction.BWD_DATA: "conv_fwd_igemm_tma",  # over dy
             Direction.BWD_WEIGHT: "conv_bwd_weight_igemm_tma"}
# The igemm-tma family: a box dim of a tensor descriptor holds at most 256 elements (TMA's limit),
# and a box of pixels is a power-of-two tile of 1..256 rows and columns.
TMA_TILE_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TMA_BOX_MAXIMUM = 256
TMA_DTYPES = (DType.FP16, DType.BF16)
# The igemm-tma kernels' wgmma is one warpgroup's: a 4-warp 128 x 128 tile alone on its SM ran
# ResNet's 3x3 forward at 15.8 us on the H100, where two 4-warp programs an SM over 64-pixel boxes
# took 18.2 (results/h100/conv_sweep_igemm-tma_forward_dense.csv).
TMA_WARPS_TO_FILL_SM = 4
# igemm-tma (kernels/implicit_gemm_tma.py). Fraction of the tensor-core peak at its best, after
# its own terms, per direction. Forward: fitted to the H200 (benchmarks/results/h200/conv_tma.csv, 5
# dense and 2 grouped cases, bf16, 97 TMA tiles timed). Backward-weight: fitted with the intake and
# latency terms below to the H100 sweeps of every backward-weight kernel (results/h100/
# conv_sweep_igemm-tma_bwd_weight_dense.csv and _grouped.csv): with 0.8 the measured time of each
# case's 15 fastest kernels is 0.68-1.36x the modelled (median by case; 0.82 over the five dense
# cases, 1.09 over the four grouped). Without those terms the fit gives 0.52.
TMA_FRACTION = {Direction.FORWARD: 0.74, Direction.BWD_WEIGHT: 0.8}
TMA_SWIZZLE_BYTES = 128
# A step's issue cost a warp besides its MMAs: the barrier wait, the carried (tap, channel block)
# or pixel box, and two TMA issues (one thread). sm_90 PTX of the 8x16x128x64 forward: ~40.
TMA_STEP_INSTRUCTIONS = 40
# Backward-weight boxes taller than one row feed wgmma's A (dy^T) from registers
# (register_a_operand): ldmatrix of the fragment and two CTA barriers a step in the PTX,
# and wgmma waits on them: a guess at their cost.
TMA_REGISTER_A_INSTRUCTIONS = 24
TMA_REGISTER_A_EFFICIENCY = 0.85
TMA_BANDWIDTH_FRACTION = 0.80  # gemm's tma-persistent streamed 3.8-4.0 of 4.8 TB/s
# Backward-weight reads two boxes a step from L2 (TMA has no L1 to share a tap's rows) for one
# block_out x block_in x pixels MMA, so 64x64 channel blocks take twice the bytes a FLOP of 128x128
# ones; and a program's steps are a pipeline's latency each, which the 16- and 32-channel boxes of
# grouped convs (a few MFLOP a step) do not hide: 2x16x32x32 ran conv3d_g4's 896 steps in 243 us.
# Without these two terms the model ranked 64x64 tiles first on the five dense suite convs (1.2-1.5x
# slower than the best 128x128 tile) and the narrow boxes first on conv3d_g4 and resnext g32 (2.5-2.8x
# slower than the best). Fitted to the sweeps above with cuDNN's and the igemm family's default
# kernels (conv_sweep_igemm_bwd_weight.csv): over nine cases the Triton pick ran at 0.91 of the best
# measured kernel (geomean; 0.78 without the terms), 0.95x cuDNN (0.81x). The forward's boxes pay the
# same port: fitted to backward-weight alone, it also ranks ResNet's 3x3 forward right, one 128-pixel
# box an SM (15.8 us) before two 64-pixel ones sharing it (18.2; conv_sweep_igemm-tma_forward_dense.csv).
TMA_PORT_BYTES_PER_S = 150e9
# At 0.5e-6 the model ranks the 3-D video conv's 8x16x64x64 over 14 splits first: its 378 programs,
# two a round on an SM, took two rounds and 161 us, where 8 splits (216 programs: one round of twice
# the steps) took 145 (conv_sweep_igemm-tma_bwd_weight_dense.csv; 0.64 us a step). Over the committed
# sweeps and suite tables 0.6e-6 against 0.5e-6 moves that pick and regnet's (16 -> 14 splits, 96.0 ->
# 95.4 us), no other.
TMA_WEIGHT_STEP_SECONDS = 0.6e-6
# A forward whose input channels fit one box (C/G <= block_in) moves to the next tap every step: the
# C/G = 64 convs ran 1.4-1.6x their model (2-D and 3-D alike, every box shape of `full`: ncu has the
# warps waiting on memory 60 % of the time), where C/G >= 256 ran at 0.9-1.05x. Fitted there
# (results/h100/conv_sweep_tma_c64_probe.csv): the 3-D video conv and ResNet's 56x56 C=64 layer
# take igemm's 128x64x64 (129 us against TMA's 144; 31.8 against 33.7); the probe's N=64 twin of that
# layer, where TMA ran 54 us and igemm 62, takes igemm too: igemm's model is 1.2-1.3x fast on the 2-D
# convs and 0.9x on the 3-D one, which this term does not separate.
TMA_TAP_STEP_EFFICIENCY = 0.69
# fp32 atomic adds into dw a second (split_k x dw's elements): the dense sweep's 8-way atomic splits
# ran 10-37 us slower than their workspace twins, 1.1-1.5e11 adds a second.
ATOMIC_ADDS_PER_S = 1.2e11
# wgmma computes 64 rows a warpgroup: a forward box of fewer pixels pays for 64. conv3d_g4's
# forward took the 2x16x32x32 box, modelled 30 us, and ran 59 on the H200 (128x32x32 igemm: 32);
# with this term the Triton-only selection on the H200's conv.csv is 0.970 mean, its minimum 0.757
# (0.962 and 0.536 without). Not backward-weight, whose rows are K/G channels: there it would move
# resnext g32 c512 from 2x16x32x32 (70.8 us on the H100) to 8x16x64x64 (90.8; conv_tma_rows.csv).
WGMMA_ROWS = 64


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


def shared_memory_bytes(config: TmaConfig) -> int:
    """Shared memory of the software pipeline: one A and one B box per stage."""
    block_m, block_n, block_k = config.gemm_tile
    return pipeline_shared_bytes(config.num_stages, block_m, block_n, block_k, config.signature.types.dtype.itemsize)


# Fewer pixels a step, read from registers over 3+ stages, sum wrong on sm_90 (docs/selection.md).
RELIABLE_REGISTER_A_STEP = 128


def register_a_operand(config: TmaConfig) -> bool:
    """Whether wgmma reads this backward-weight's A operand (dy^T) from registers, not shared memory.

    Triton 3.6 feeds wgmma's A from shared memory only when it is a descriptor load as
    loaded (leading unit dims dropped, transposed at most): a box of several pixel rows,
    merged into one reduction dim, is copied into registers each step (ldmatrix, and a
    barrier to free its buffer). Forward takes its pixels as the B operand, which may be
    reshaped in shared memory, so only backward-weight boxes taller than one row pay this.
    """
    return config.signature.direction is Direction.BWD_WEIGHT and config.tile_h > 1


def accumulator_registers(config: TmaConfig) -> int:
    """32-bit registers per thread that the fp32 accumulator tile needs."""
    elements = config.block_out * config.pixels if config.signature.direction is Direction.FORWARD else (
        config.block_out * config.block_in)
    return registers_for(elements, config.num_warps)


def findings(config: TmaConfig, arch) -> Findings:
    """The igemm-tma family's rules, after the signature's and the program's."""
    out = Findings()
    error, warning = out.error, out.warning
    signature_findings(config.signature, arch, out)
    program_findings(config, out, split_mode=True)
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
        if not power_of_two(value):
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
    few_pixels = config.pixels < RELIABLE_REGISTER_A_STEP
    if register_a_operand(config) and few_pixels and config.num_stages > 2 and arch.has(Feature.WGMMA):
        error(ConvRule.REGISTER_A_PIPELINE, f"a {config.tile_h}x{config.tile_w} box read from registers over "
              f"{config.num_stages} stages sums wrong on sm_90 (Triton 3.6)",
              f"use 2 stages, a box of >= {RELIABLE_REGISTER_A_STEP} pixels, or a one-row box")
    regs = accumulator_registers(config)
    if register_a_operand(config):  # dy^T in registers, double-buffered (sm_90 ptxas: 128x256 w8 spills)
        regs += math.ceil(config.block_out * config.pixels / (config.num_warps * 32))
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    if regs > budget:
        error(ConvRule.REGISTER_BUDGET, f"the {gemm['M']}x{gemm['N']} accumulator"
              + (" and the A operand" if register_a_operand(config) else "")
              + f" need {regs} registers per thread over {config.num_warps} warps; at most {budget} fit",
              "more warps or a smaller tile")

    return out


def correction(config: TmaConfig) -> CorrectionSpace:
    """The box, channel blocks, warps and stages may move; the split and its mode are put right first."""
    split = corrected_split(config)
    base = replace(config, split_k=split, split_mode=SplitMode.WORKSPACE if split == 1 else config.split_mode)
    return CorrectionSpace(base, {"tile_h": TMA_TILE_CHOICES, "tile_w": TMA_TILE_CHOICES, "block_out": BLOCK_CHOICES,
                                  "block_in": BLOCK_CHOICES, "num_warps": WARP_CHOICES, "num_stages": STAGE_CHOICES})


def supports(config: TmaConfig, problem: ConvProblem) -> str | None:
    """Why the igemm-tma kernel of `config` cannot compute `problem` (None: it can)."""
    refusal = signature_refusal(config, problem)
    if refusal is not None:
        return refusal
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


def tma_score(config: TmaConfig, p: ConvProblem, arch) -> Score:
    """The igemm-tma kernels: boxes of pixels on the tensor cores (constants: see TMA_FRACTION)."""
    if p.direction is Direction.BWD_DATA:  # the forward kernel over dy, reading the filter turned
        return tma_score(config.as_forward(), p.data_gradient_as_forward(), arch)
    peak, bandwidth = peak_flops(p, arch), dram_bytes_per_s(arch)
    od, oh, ow = p.padded3(p.output_size, 1)
    boxes = p.n * od * math.ceil(oh / config.tile_h) * math.ceil(ow / config.tile_w)
    # A box past the output's edge computes its overhang all the same (zeros read, or rows masked out).
    waste = {"box": tile_efficiency(oh, config.tile_h) * tile_efficiency(ow, config.tile_w)}
    taps = math.prod(p.filter_size)
    if p.direction is Direction.FORWARD:
        waste["tile_n"] = tile_efficiency(p.k_per_group, config.block_out)
        tiles = boxes * math.ceil(p.k_per_group / config.block_out) * p.groups
        steps = taps * math.ceil(p.c_per_group / config.block_in)
    else:
        per_split = math.ceil(boxes / config.split_k)
        waste |= {"tile_m": tile_efficiency(p.k_per_group, config.block_out),
                  "tile_n": tile_efficiency(p.c_per_group, config.block_in),
                  "split": boxes / (per_split * config.split_k)}
        tiles = (taps * math.ceil(p.k_per_group / config.block_out) * math.ceil(p.c_per_group / config.block_in)
                 * p.groups * config.split_k)
        steps = per_split
    threads = config.num_warps * 32
    register_a = register_a_operand(config)
    registers = accumulator_registers(config) + REGISTER_RESERVE
    if register_a:
        registers += math.ceil(config.block_out * config.pixels / threads)
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=min(registers, arch.registers_per_thread_max))
    waves, concurrent = sm_efficiency(tiles, resident, config.num_warps, arch.sm_count, TMA_WARPS_TO_FILL_SM)
    latency = 1.0 if concurrent >= 2 else 0.9 if config.num_stages >= 3 else 0.8
    # A box row narrower than a 128-byte swizzle line moves and feeds wgmma at a fraction of the
    # rate: the 16-channel test tiles ran 2-29 TFLOP/s on the H200 where 64-channel ones ran 300-690.
    inner = min(config.block_in, config.block_out) * p.types.dtype.itemsize
    narrow = min(1.0, inner / TMA_SWIZZLE_BYTES)
    wgmma_rows = min(1.0, config.pixels / WGMMA_ROWS) if p.direction is Direction.FORWARD else 1.0
    efficiency = (math.prod(waste.values()) * waves * latency * narrow * wgmma_rows
                  * (TMA_REGISTER_A_EFFICIENCY if register_a else 1.0))
    compute_s = p.flops() / (peak * efficiency)
    memory_s = p.bytes() / (bandwidth * TMA_BANDWIDTH_FRACTION * narrow)
    per_step = TMA_STEP_INSTRUCTIONS + (TMA_REGISTER_A_INSTRUCTIONS if register_a else 0)
    issue_rate = arch.calibration.issue_per_sm_cycle * arch.sm_count * arch.calibration.clock_hz
    issue_s = tiles * steps * config.num_warps * per_step / issue_rate
    reduce_s = 0.0
    if config.split_k > 1:
        weights = p.k * p.c_per_group * taps
        reduce_s = (config.workspace_slabs + 1) * weights * 4 / bandwidth + arch.calibration.launch_s
        if config.atomic_split:
            reduce_s += config.split_k * weights / ATOMIC_ADDS_PER_S
    # The busiest SM's two boxes a step, every one read from L2 (TMA has no L1 to share them through).
    if p.direction is Direction.BWD_WEIGHT:  # dy's pixels x block_out and x's pixels x block_in
        box_elements = config.pixels * (config.block_out + config.block_in)
    else:  # x's pixels x block_in and the filter's block_out x block_in
        box_elements = (config.pixels + config.block_out) * config.block_in
    box_bytes = box_elements * p.types.dtype.itemsize
    intake_s = math.ceil(tiles / arch.sm_count) * steps * box_bytes / TMA_PORT_BYTES_PER_S
    bound_s = (compute_s**3 + memory_s**3 + issue_s**3 + intake_s**3) ** (1 / 3)
    core_s = bound_s / TMA_FRACTION[p.direction]
    if p.direction is Direction.FORWARD and taps > 1 and p.c_per_group <= config.block_in:
        core_s /= TMA_TAP_STEP_EFFICIENCY  # every step a new tap: see TMA_TAP_STEP_EFFICIENCY
    if p.direction is Direction.BWD_WEIGHT:  # the busiest SM's rounds of programs, each step a pipeline's latency
        latency_s = math.ceil(tiles / (arch.sm_count * concurrent)) * steps * TMA_WEIGHT_STEP_SECONDS
        core_s = (core_s**3 + latency_s**3) ** (1 / 3)
    modelled = core_s + arch.calibration.launch_s + reduce_s
    value = ideal_seconds(p, arch) / modelled
    if config.atomic_split:
        value *= NONDETERMINISTIC_PENALTY
    terms = {**waste, "waves": waves, "latency": latency, "narrow": narrow, "wgmma_rows": wgmma_rows,
             "register_a": float(register_a),
             "resident": float(resident), "issue_us": issue_s * 1e6, "intake_us": intake_s * 1e6,
             "modelled_us": modelled * 1e6}
    return Score(value, terms)


TMA_GEOMETRY = ("N", "G", "CG", "KG", "OD", "OH", "OW", "FZ", "FY", "FX", "PD", "PH", "PW", "DD", "DH", "DW")
# (descriptor or pointer arguments, the stride arguments) of each direction's kernel
_TMA_FORWARD_ARGUMENTS = (("x_desc", "w_desc", "y_ptr", "bias_ptr", "res_ptr"),
                          ("syn", "syd", "syh", "syw", "srn", "srd", "srh", "srw"))
TMA_ARGUMENTS = {Direction.FORWARD: _TMA_FORWARD_ARGUMENTS, Direction.BWD_DATA: _TMA_FORWARD_ARGUMENTS,
                 Direction.BWD_WEIGHT: (("x_desc", "dy_desc", "w_ptr", "ws_ptr"), ("swk", "swz", "swy", "swx"))}


def tma_blocks(config: TmaConfig) -> dict[str, tuple[int, ...]]:
    """The box each descriptor moves: activations 5-D [N, D, H, W, channels], the weight 2-D (backward-data's
    is the conv's own filter, read turned: its box is [reduction channels, output channels])."""
    box = lambda channels: (1, 1, config.tile_h, config.tile_w, channels)
    direction = config.signature.direction
    if direction is Direction.FORWARD:
        return {"x_desc": box(config.block_in), "w_desc": (config.block_out, config.block_in)}
    if direction is Direction.BWD_DATA:
        return {"x_desc": box(config.block_in), "w_desc": (config.block_in, config.block_out)}
    return {"x_desc": box(config.block_in), "dy_desc": box(config.block_out)}


def _tma_unit(config: TmaConfig, specialization: ConvSpecialization) -> KernelUnit:
    sig = config.signature
    direction = sig.direction
    t = sig.types.dtype.triton
    tensors, strides = TMA_ARGUMENTS[direction]
    blocks = tma_blocks(config)
    kinds = {name: f"tensordesc<{t}[{','.join(map(str, blocks[name]))}]>" for name in blocks} | {"ws_ptr": "*fp32"}
    signature = ([(name, kinds.get(name, f"*{t}")) for name in tensors] + [(n, "i32") for n in TMA_GEOMETRY]
                 + [(n, "i64") for n in strides])
    constexprs = {"TILE_H": config.tile_h, "TILE_W": config.tile_w}  # in the kernel's parameter order
    if direction is not Direction.BWD_WEIGHT:
        constexprs |= {"BLOCK_N": config.block_out, "BLOCK_K": config.block_in, **epilogue_constexprs(sig),
                       "TURNED_WEIGHT": direction is Direction.BWD_DATA}
    else:
        constexprs |= {"BLOCK_M": config.block_out, "BLOCK_N": config.block_in, "SPLIT_K": config.split_k,
                       "ATOMIC": config.atomic_split}
    constexprs["DOT_PRECISION"] = "tf32" if sig.types.allow_tf32 else "ieee"
    # `supports` takes only 16-byte aligned data (TMA's rule): pointers, strides and C/G, K/G counts
    # are multiples of 16 bytes, which lets the epilogue store 16-byte vectors.
    divisibility = ()
    if specialization.groups_aligned:
        vector = 16 // sig.types.dtype.itemsize
        divisibility = tuple((name, 16) for name in tensors if name.endswith("_ptr") and name != "bias_ptr")
        divisibility += tuple((name, vector) for name in (*strides, "CG", "KG"))
    return KernelUnit(
        stage="main", module=MODULE, function=FUNCTIONS[direction],
        signature=tuple(signature + [(name, "constexpr") for name in constexprs]),
        constexprs=tuple(sorted(constexprs.items())), num_warps=config.num_warps, num_stages=config.num_stages,
        divisibility=divisibility,
    )


def activation_descriptor(t: torch.Tensor, block: tuple[int, ...]):
    """A 5-D descriptor [N, D, H, W, channels] of a channels-last (N, C, *spatial) tensor.

    1-D and 2-D tensors get unit D (and H) dims. A dim of size one is never stepped
    over, so its stride is set to one TMA accepts: the packed stride, rounded up to a
    multiple of 16 bytes. The copy engine zero-fills what a box reads outside the shape.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    spatial = (1,) * (5 - t.dim()) + tuple(t.shape[2:])
    spatial_strides = (0,) * (5 - t.dim()) + tuple(t.stride()[2:])
    shape = [t.shape[0], *spatial, t.shape[1]]
    strides = [t.stride(0), *spatial_strides, 1]
    unit = 16 // t.element_size()
    for i in range(3, -1, -1):
        if shape[i] == 1:
            strides[i] = cdiv(strides[i + 1] * shape[i + 1], unit) * unit
    return TensorDescriptor(t, shape, strides, list(block))


def weight_matrix_descriptor(w: torch.Tensor, block: tuple[int, int]):
    """The weight (K, C/G, *filter) as a 2-D descriptor [K, taps * C/G]: row k is GKZYXC's (tap, c) run.

    A weight that is not dense in that order (a view with other strides) is copied into
    it first: weights are small beside the activations.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    k, cg, taps = w.shape[0], w.shape[1], math.prod(w.shape[2:])
    dense = to_channels_last(w) if not _dense_weight(w) else w
    return TensorDescriptor(dense, [k, taps * cg], [taps * cg, 1], list(block))


def _dense_weight(w: torch.Tensor) -> bool:
    """Whether w (K, C/G, *filter) is laid out as GKZYXC with no gaps (channels-last, packed)."""
    expected, stride = {}, 1
    for dim in (1, *range(w.dim() - 1, 1, -1), 0):
        expected[dim] = stride
        stride *= w.shape[dim]
    return all(w.shape[d] == 1 or w.stride(d) == expected[d] for d in range(w.dim()))


def _tma_bound(config: TmaConfig, ops: ConvOperands, out: torch.Tensor, workspace) -> dict:
    """The arguments of an igemm-tma kernel by name: descriptors, geometry, output and residual strides.

    Backward-data runs the forward kernel over dy, so its geometry is that forward's
    (`data_gradient_as_forward`); its weight descriptor is over the conv's own filter.
    """
    p = ops.problem
    blocks = tma_blocks(config)
    turned = p.direction is Direction.BWD_DATA
    g = p.data_gradient_as_forward() if turned else p
    bound = {"x_desc": activation_descriptor(ops.dy if turned else ops.x, blocks["x_desc"]),
             **dict(zip(("OD", "OH", "OW"), g.padded3(g.output_size, 1))),
             **dict(zip(("FZ", "FY", "FX"), g.padded3(g.filter_size, 1))),
             **dict(zip(("PD", "PH", "PW"), g.padded3(g.padding, 0))),
             **dict(zip(("DD", "DH", "DW"), g.padded3(g.dilation, 1))),
             "N": g.n, "G": g.groups, "CG": g.c_per_group, "KG": g.k_per_group}
    if p.direction is Direction.BWD_WEIGHT:
        return bound | {"dy_desc": activation_descriptor(ops.dy, blocks["dy_desc"]), "w_ptr": out,
                        "ws_ptr": workspace if workspace is not None else out,
                        **dict(zip(("swk", "swz", "swy", "swx"), dim_strides(out)))}
    dummy = out  # stands in for absent pointers; the kernel never reads them (constexpr flags off)
    return bound | {"w_desc": weight_matrix_descriptor(ops.w, blocks["w_desc"]), "y_ptr": out,
                    "bias_ptr": ops.bias if ops.bias is not None else dummy,
                    "res_ptr": ops.residual if ops.residual is not None else dummy,
                    **dict(zip(("syn", "syd", "syh", "syw"), dim_strides(out))),
                    **dict(zip(("srn", "srd", "srh", "srw"), dim_strides(ops.residual)))}


def plan(config: TmaConfig, ops: ConvOperands) -> Plan:
    """The kernel over descriptors of the operands, and a split's reduce."""
    p = ops.problem
    out = output_tensor(ops)
    taps = math.prod(p.filter_size)
    split = splits(config)
    workspace, zeroed = split_workspace(config, p, taps, out.device) if split else (None, ())
    units = op_kernel_units(config, p.specialization)
    grid = checked_grid(config, _tma_grid(config, p, taps))
    launches = [Launch("main", grid, bound_values(units[0], _tma_bound(config, ops, out, workspace)))]
    if split:
        launches.append(reduce_launch(units[1], workspace, out, p, taps))
    return Plan(tuple(launches), out, zeroed, made(workspace))


def _tma_grid(config: TmaConfig, p, taps: int) -> tuple[int, int, int]:
    if p.direction is Direction.BWD_DATA:  # the forward's grid over dx
        p = p.data_gradient_as_forward()
    od, oh, ow = p.padded3(p.output_size, 1)
    if p.direction is Direction.FORWARD:
        boxes = p.n * od * cdiv(oh, config.tile_h) * cdiv(ow, config.tile_w)
        return (boxes * cdiv(p.k_per_group, config.block_out), p.groups, 1)
    tiles = cdiv(p.k_per_group, config.block_out) * cdiv(p.c_per_group, config.block_in)
    return (taps * tiles, p.groups, config.split_k)


def kernel_units(config: TmaConfig, specialization: ConvSpecialization, arch) -> tuple[KernelUnit, ...]:
    main = _tma_unit(config, specialization)
    return (main, reduce_unit(config, specialization)) if splits(config) else (main,)


FAMILY = FAMILIES.register(KernelFamily(
    op="conv", name=Family.IMPLICIT_GEMM_TMA.value, config_type=TmaConfig, validate=findings,
    supports=supports, score=tma_score, kernel_units=kernel_units, plan=plan, correction=correction,
))
