"""The `rules` score of a conv config for a problem: a small time model, no timing.

Each family sees the problem as what it computes:
- igemm: a GEMM per group (`gemm_view`), stretched by the padding of edge tiles, the
  channel padding of each tap's reduction step and the idle slots of the last wave;
  igemm-flat the same GEMM with the (tap, channel) pairs padded as one run, gathered
  element by element;
- igemm-tma: the same GEMM in boxes of pixels, stretched by the boxes' overhang past the
  output's edges (in H and W apart), with a step's issue cost of its own (`tma_score`);
- direct: a stream of the bytes, at the bandwidth a tile's vector loads can keep in
  flight, or the CUDA-core FMA rate if that is slower;
- toeplitz: its programs' walks down the rows, a row at a time (`toeplitz_score`);
- vendor: cuDNN at the fraction of the ideal that ANCHORS.md measured for its kind of
  problem (dense, grouped, depthwise).
Score = ideal time / modelled time, in (0, 1].
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.analytic import blocks_per_sm, tile_efficiency, wave_efficiency
from ...heuristics.roofline import dram_bytes_per_s, fma_flops, tensor_flops
from ...heuristics.roofline import ideal_seconds as roofline_seconds
from .config import (
    AnyConvConfig,
    DirectConfig,
    Family,
    ImplicitGemmConfig,
    PointwiseConfig,
    TmaConfig,
    ToeplitzConfig,
    VendorConfig,
)
from .kernels.toeplitz import NW as TOEPLITZ_NW
from .problem import ConvProblem, Direction
from .rules import (
    REGISTER_RESERVE,
    WEIGHT_WINDOW_WARPS_TO_OVERLAP,
    ToeplitzWalk,
    accumulator_registers,
    register_a_operand,
    shared_memory_bytes,
    weight_window_registers,
    window_register_cap,
    window_registers,
)

# igemm-flat's backward-data streams its fp32 column matrix out and back. On the stem (H100, results/h100/
# conv_sweep_igemm-flat_bwd_data.csv) its best tile took 205 us to write the 236 MB and 208 to gather
# them (the bf16 columns of a scratch probe ran only 1.1-1.25x faster: neither stage is bandwidth-bound),
# 0.27 of the bandwidth modelled; tiles whose one step covers K/G ran their GEMM stage 1.5-2.1x slower,
# those of 64x64 1.3x (FLAT_DATA_TILE: the output tile below which a stage pays more per byte).
FLAT_DATA_BANDWIDTH_FRACTION = 0.27
FLAT_DATA_TILE = 128 * 64
# The GEMM op's model of its best Triton kernel, against that kernel's time on the suite's 1x1 conv
# (resnet50_1x1, 3.3 GFLOP a direction, H100, a scratch probe's graphs): forward 10.0 us modelled 12.65,
# backward-data 10.3 / 11.2, backward-weight 15.8-16.4 / 20.9. Fitted on larger GEMMs, it over-models
# these by about this much; without it the conv's own TMA kernels, 9-26 % slower, ranked first.
POINTWISE_GEMM_FIT = 0.83
# Fractions of the ideal each path reaches at its best. Tiled Triton GEMMs reached 0.62
# of peak on an H200 (ops/gemm/ranking.py); an implicit GEMM pays its address arithmetic.
TILED_FRACTION = 0.5
# cuDNN through PyTorch: ideal / (measured - VENDOR_CALL_SECONDS), geomean over the suite's cases
# of each class, bf16 and fp16, on the H200 conv table that benchmarks/results/h200/README.md names
# for VENDOR_FRACTION, unless an entry names an H100 table. The dense forward and backward-weight
# run 0.41-0.71 and 0.39-0.61; that table's backward-data (0.11-0.24) is timed with torch.nn.grad's
# stand-in for x, so the dense backward-data entry comes from the H100 (below).
FEW_CHANNELS = 8  # dense convs with fewer input channels are their own class (ShapeClass.FEW_CHANNELS)
VENDOR_CALL_SECONDS = 2e-6  # GPU-side fixed cost of a cuDNN call (the benchmark times graph replays)


class ShapeClass(enum.Enum):
    """What cuDNN runs a conv as: its measured efficiency follows this, then the direction."""

    DENSE = "dense"  # G = 1
    FEW_CHANNELS = "few-channels"  # G = 1 and C < FEW_CHANNELS: an image model's stem
    GROUPED = "grouped"  # 1 < G, C/G or K/G > 1, 2-D and 3-D
    GROUPED_1D = "grouped-1d"  # grouped or depthwise 1-D (conv1d_g16, mamba): 0.045-0.061 in every direction
    DEPTHWISE = "depthwise"  # C/G = K/G = 1, 2-D and 3-D: CUDA-core bound, see VENDOR_DEPTHWISE_FMA


def shape_class(p: ConvProblem) -> ShapeClass:
    if p.groups == 1:
        return ShapeClass.FEW_CHANNELS if p.c < FEW_CHANNELS else ShapeClass.DENSE
    if p.spatial_dims == 1:
        return ShapeClass.GROUPED_1D
    return ShapeClass.DEPTHWISE if p.one_channel_per_group else ShapeClass.GROUPED


VENDOR_FRACTION = {
    # dense: resnet50 3x3 and 1x1, unet, dilated, conv3d video (forward 0.41-0.71; bwd_data
    # 0.39-0.71; bwd_weight 0.39-0.61). Backward-data as vendor.py calls it, with a channels-last
    # stand-in for x (H100, results/h100/conv_replicate_b13d5aa.csv); the expanded one-element stand-in that
    # torch.nn.grad passes ran 2.2-7x slower (0.11-0.24 here). cuDNN's backward-data runs within 0.94-1.08x
    # of its forward on these five, so it shares the forward's fraction: at 0.5 the dispatcher took
    # igemm-tma's turned-filter kernel on unet_3x3 at 0.89x cuDNN (results/h100/conv_tma_turned_bwd_data.csv).
    (ShapeClass.DENSE, Direction.FORWARD): 0.55,
    (ShapeClass.DENSE, Direction.BWD_DATA): 0.55,
    (ShapeClass.DENSE, Direction.BWD_WEIGHT): 0.46,
    # the C=3 stem, 7x7 stride 2 (H100, results/h100/conv_replicate_89e2bea.csv): forward 0.15 in fp16, 0.057 in
    # bf16 (the faster one here: the dispatcher errs towards cuDNN), backward-data 0.026, backward-weight 0.082.
    (ShapeClass.FEW_CHANNELS, Direction.FORWARD): 0.15,
    (ShapeClass.FEW_CHANNELS, Direction.BWD_DATA): 0.026,
    (ShapeClass.FEW_CHANNELS, Direction.BWD_WEIGHT): 0.082,
    # grouped 2-D/3-D: resnext g32 (C/G=8, 16), regnet g8 (56), conv3d g4 (32): forward 0.09-0.23,
    # bwd_data 0.09-0.19, bwd_weight 0.05-0.22.
    (ShapeClass.GROUPED, Direction.FORWARD): 0.17,
    (ShapeClass.GROUPED, Direction.BWD_DATA): 0.16,
    (ShapeClass.GROUPED, Direction.BWD_WEIGHT): 0.12,
    (ShapeClass.GROUPED_1D, Direction.FORWARD): 0.055,
    (ShapeClass.GROUPED_1D, Direction.BWD_DATA): 0.035,
    (ShapeClass.GROUPED_1D, Direction.BWD_WEIGHT): 0.047,
    # depthwise 2-D: the memory side of its model (mbv2 3x3 forward reaches 0.40 of the ideal).
    (ShapeClass.DEPTHWISE, Direction.FORWARD): 0.45,
    (ShapeClass.DEPTHWISE, Direction.BWD_DATA): 0.45,
    (ShapeClass.DEPTHWISE, Direction.BWD_WEIGHT): 0.45,
}
# Its grouped convs with C/G above 16 and not a multiple of it ran at half the fraction of the others:
# regnet_g8 (C/G = 56) 0.086 / 0.086 / 0.05 by direction, where resnext g32 (C/G = 8, 16) and conv3d_g4
# (32) ran 0.17-0.18 / 0.15-0.18 / 0.12-0.18 (H100, results/h100/conv_replicate_a00603a.csv). One case: a guess
# at the rule, which kept the dispatcher on the Triton kernels (2.4x cuDNN) for regnet's backward-weight.
VENDOR_GROUPED_EVEN = 16
VENDOR_GROUPED_UNEVEN = 0.5
# cuDNN's depthwise kernels are bound by CUDA-core issue, not bytes: the time grows with the
# taps (mbv2 3x3, 5x5, convnext 7x7 forward: 4.2, 4.9, 5.8 T output-taps/s). As fractions
# of the CUDA-core FMA rate (roofline.fma_flops, 2 FLOPs a tap):
# (Backward-data 0.1: 0.096-0.119 on the suite's 3x3, 5x5 and 7x7 with x given channels-last, H100.)
VENDOR_DEPTHWISE_FMA = {Direction.FORWARD: 0.16, Direction.BWD_DATA: 0.1, Direction.BWD_WEIGHT: 0.11}
# Its backward-weight amortises each pixel's loads over the taps and over a map's pixels, so its
# rate grows with both: 4-8 TFLOP/s at 3x3, 7-11 at 5x5, 7-18 at 7x7, the small maps slowest
# (7x7 at 7x7 pixels 7.2, at 28x28 13-18). A rate of VENDOR_DEPTHWISE_WEIGHT_FMA x taps / (taps +
# VENDOR_DEPTHWISE_WEIGHT_HALF_TAPS) x pixels / (pixels + VENDOR_DEPTHWISE_WEIGHT_HALF_PIXELS),
# after VENDOR_DEPTHWISE_WEIGHT_SECONDS, fits 18 timings (3x3 to 7x7 on 7x7 to 112x112 maps:
# H200 conv_toeplitz_weight_shapes.csv, H100 conv.csv) within 0.84-1.25x but one (0.66x, 32
# channels at 112x112). The fit on taps alone put the suite's 5x5 (14x14) at 0.58x its time,
# so the dispatcher kept cuDNN there against kernels 1.07-1.4x faster.
VENDOR_DEPTHWISE_WEIGHT_FMA = 0.32
VENDOR_DEPTHWISE_WEIGHT_HALF_TAPS = 15
VENDOR_DEPTHWISE_WEIGHT_HALF_PIXELS = 25
VENDOR_DEPTHWISE_WEIGHT_SECONDS = 3e-6  # besides VENDOR_CALL_SECONDS
# At stride 2 its depthwise forward ran 1.0-1.7x (mean 1.41x) the time the stride-1 fit above
# models, on the 7 downsampling layers of suites/conv_depthwise_strided.json (H100, in turns), where
# the stride-2 window kernels' best ran 0.8-1.3x (mean 1.07x) theirs: its strided forward's bytes
# take this much longer. On the two 5x5 layers, FMA-bound in the fit, it ran 1.9x and 2.3x the
# fit's FMA time: there it makes FMAs at half its stride-1 rate. (Fitted on the H100: no H200
# timing of these layers yet.)
VENDOR_DEPTHWISE_STRIDED_FORWARD = 1.4
VENDOR_DEPTHWISE_STRIDED_FMA = 0.5
# Its stride-2 depthwise backward-data ran 2.5-3.7x (geomean 2.9x) the stride-1 model's time on the same
# 7 layers (H100, results/h100/conv_depthwise_strided_bwd_data.csv, x given channels-last), where the
# stride-2 window kernels ran 2.0-3.6x faster than it.
VENDOR_DEPTHWISE_STRIDED_BWD_DATA = 2.9
# The dispatcher takes a Triton kernel over cuDNN only when the model says it is faster by
# more than its own error: modelled / measured of the Triton kernels the rules pick on
# conv.csv spans 0.8-1.9x (grouped implicit GEMMs with narrow N run 1.2-1.9x slower than
# modelled), so the vendor's modelled time is divided by this before they are compared.
VENDOR_TRUST = 1.3
DIRECT_FRACTION = 0.75  # of copy bandwidth, for a well-fed streaming kernel
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
# The sliding-window kernels (DirectConfig.window > 0), fitted to sm_90 SASS of bf16 forward
# builds (the loop over filter rows; 45 builds: windows 3/5/7, runs 4/8/14, 2-8 channels a
# thread, compiled offline): besides its run x window x channels FMAs, a thread spends per
# filter row ~6.2 instructions a loaded source vector, ~2.0 a source element (widening, zero
# fill), ~2.25 a weight element and ~44 fixed. Registers: rules.window_registers; ptxas holds
# builds the fit puts up to ~300 within 255 with a few bytes of stack (16x64 w4 window 7 run 14:
# 16 bytes), and such builds were among the fastest on the H200, so only a fit past
# WINDOW_SPILL_REGISTERS is taken to spill. Those it puts at <= 200 compile capped
# (rules.window_register_cap), so their blocks an SM follow the cap.
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
# Operand re-reads served from L2, as a multiple of DRAM bandwidth. A kernel term, not a machine
# fact: the multiple follows the kernels' tile order and re-reads (the GEMM op's grouped tile order
# takes 5.0).
L2_REUSE = 4.0
SPILL_PENALTY = 0.15
# Warps an SM needs issuing wgmma/mma to keep its tensor cores busy: two warpgroups (the
# 8-warp 128x128 and 128x256 tiles of the GEMM op's fastest H200 kernels).
WARPS_TO_FILL_SM = 8
# The igemm-tma kernels' wgmma is one warpgroup's: a 4-warp 128 x 128 tile alone on its SM ran
# ResNet's 3x3 forward at 15.8 us on the H100, where two 4-warp programs an SM over 64-pixel boxes
# took 18.2 (results/h100/conv_sweep_igemm-tma_forward_dense.csv).
TMA_WARPS_TO_FILL_SM = 4
# Atomic split-K sums in a different order each run: taken only when clearly faster.
NONDETERMINISTIC_PENALTY = 0.97
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
# (rules.register_a_operand): ldmatrix of the fragment and two CTA barriers a step in the PTX,
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
class GemmView:
    """The GEMM one group of the conv is, for a direction: rows, columns, and the reduction (taps x depth)."""

    m: int
    n: int
    taps: int
    depth: int  # channels reduced per tap (C/G or K/G); for backward-weight, the pixels


def gemm_view(p: ConvProblem) -> GemmView:
    taps = math.prod(p.filter_size)
    pixels_out = p.n * math.prod(p.output_size)
    if p.direction is Direction.FORWARD:
        return GemmView(pixels_out, p.k_per_group, taps, p.c_per_group)
    if p.direction is Direction.BWD_DATA:
        return GemmView(p.n * math.prod(p.input_size), p.c_per_group, taps, p.k_per_group)
    return GemmView(p.k_per_group, p.c_per_group * taps, 1, pixels_out)


def _peak_flops(p: ConvProblem, arch) -> float:
    t = p.types
    if t.dtype is DType.FP32 and not t.allow_tf32:
        return fma_flops(arch)
    return tensor_flops(arch, t.dtype)


def ideal_seconds(p: ConvProblem, arch) -> float:
    return roofline_seconds(p.flops(), p.bytes(), _peak_flops(p, arch), arch)


def vendor_score(config: VendorConfig, p: ConvProblem, arch) -> Score:
    ideal = ideal_seconds(p, arch)
    kind = shape_class(p)
    fraction = VENDOR_FRACTION[(kind, p.direction)]
    if kind is ShapeClass.GROUPED and p.c_per_group > VENDOR_GROUPED_EVEN and p.c_per_group % VENDOR_GROUPED_EVEN:
        fraction *= VENDOR_GROUPED_UNEVEN
    conv_s = ideal / fraction
    if kind is ShapeClass.DEPTHWISE:
        fraction_of_fma, fixed_s = VENDOR_DEPTHWISE_FMA[p.direction], 0.0
        if p.direction is Direction.BWD_WEIGHT:
            taps, pixels = math.prod(p.filter_size), math.prod(p.output_size)
            fraction_of_fma = (VENDOR_DEPTHWISE_WEIGHT_FMA * taps / (taps + VENDOR_DEPTHWISE_WEIGHT_HALF_TAPS)
                               * pixels / (pixels + VENDOR_DEPTHWISE_WEIGHT_HALF_PIXELS))
            fixed_s = VENDOR_DEPTHWISE_WEIGHT_SECONDS
        if p.direction is Direction.FORWARD and not p.unit_stride:
            conv_s *= VENDOR_DEPTHWISE_STRIDED_FORWARD
            fraction_of_fma *= VENDOR_DEPTHWISE_STRIDED_FMA
        conv_s = max(conv_s, fixed_s + p.flops() / (fma_flops(arch) * fraction_of_fma))
        if p.direction is Direction.BWD_DATA and not p.unit_stride:
            conv_s *= VENDOR_DEPTHWISE_STRIDED_BWD_DATA
    steps = int(p.epilogue.activation.value != "none") + int(p.epilogue.residual)
    y_bytes = p.n * p.k * math.prod(p.output_size) * p.types.dtype.itemsize
    step_s = 2 * y_bytes / dram_bytes_per_s(arch) + arch.calibration.launch_s
    modelled = conv_s + VENDOR_CALL_SECONDS + steps * step_s
    # Compared with the Triton kernels' models, whose error is up to VENDOR_TRUST.
    return Score(ideal / modelled * VENDOR_TRUST, {"fraction": fraction, "epilogue_steps": float(steps),
                                                   "trust": VENDOR_TRUST, "modelled_us": modelled * 1e6})


def sm_efficiency(tiles: int, resident: int, num_warps: int, sm_count: int,
                  warps_to_fill: int = WARPS_TO_FILL_SM) -> tuple[float, int]:
    """Busy fraction of the tensor cores, and the programs each SM runs at once.

    Time follows the busiest SM: it runs ceil(tiles / SMs) tiles, min(that, resident) at
    a time, and its tensor cores are full once WARPS_TO_FILL_SM warps issue MMAs. So 98
    tiles of 128x128 (8 warps) on 132 SMs keep 98 SMs full (0.74), where counting slots
    of two resident programs would say 0.37 and prefer twice as many half-size tiles.
    """
    per_sm = math.ceil(tiles / sm_count)
    concurrent = min(resident, per_sm)
    balance = tiles / (sm_count * per_sm)
    return balance * min(1.0, concurrent * num_warps / warps_to_fill), concurrent


def _stride_hit_rate(p: ConvProblem) -> float:
    """The direct family's backward-data visits every (input pixel, tap): 1 in prod(stride) meets an output pixel.

    (The igemm family's visits only its phase's taps, which all do.)
    """
    return 1.0 / math.prod(p.stride) if p.direction is Direction.BWD_DATA else 1.0


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


def _intake_seconds(config: ImplicitGemmConfig, p: ConvProblem, v: GemmView, tiles: int, arch) -> float:
    """The busiest SM's operand intake: every step's A and B tiles, through its own L2 port.

    DRAM serves each byte once, but each tile re-reads its operands from L2: a larger tile
    reads fewer bytes per FLOP. On conv.csv (H200) backward-data's 128x256 tile ran 1.7x the
    128x128 one on dilated_3x3_d2, 256x128 1.24x on unet_3x3, where the other terms tie them.
    """
    per_tile = (config.block_m + config.block_n) * config.block_k * _steps(config, p, v) * p.types.dtype.itemsize
    return math.ceil(tiles / arch.sm_count) * per_tile / SM_PORT_BYTES_PER_S


def _issue_seconds(config: ImplicitGemmConfig, p: ConvProblem, v: GemmView, tiles: int, arch) -> float:
    """Time the SMs spend issuing the loop's instructions besides the MMAs: steps x warps x a step's cost.

    Small tiles (128x16x16, one tap of 16 channels a step) and element loads (channels
    not 16-byte aligned, the C=3 stem) make this, not the tensor cores, the bound: on
    conv.csv the 128x16x16 resnext tiles ran 1.7x their MMA-and-bytes model, the stem's
    element-load tiles 10-40x.
    """
    threads = config.num_warps * 32
    flat = config.family is Family.IMPLICIT_GEMM_FLAT  # gathers im2col runs of C/G (elements unless aligned)
    vector = max(16 // p.types.dtype.itemsize, 1)
    x_side = vector if p.specialization.groups_aligned else 1  # x and w (flat: a run of C/G a tap)
    y_side = vector if p.specialization.outputs_aligned else 1  # dy: the backward directions' A tile
    a_vector = x_side if p.direction is Direction.FORWARD else y_side
    loads = (config.block_m * config.block_k / a_vector + config.block_k * config.block_n / x_side) / threads
    steps = _steps(config, p, v)
    if flat:  # the pixel walk is per row of the tile; each element adds its own border checks
        per_load = INSTRUCTIONS_PER_LOAD + FLAT_GATHER_INSTRUCTIONS
    else:
        per_load = INSTRUCTIONS_PER_LOAD + (WEIGHT_INSTRUCTIONS_PER_LOAD
                                            if p.direction is Direction.BWD_WEIGHT else 0)
    per_step = STEP_INSTRUCTIONS + per_load * max(loads, 1.0)
    warp_instructions = tiles * steps * config.num_warps * per_step
    calibration = arch.calibration
    return warp_instructions / (calibration.issue_per_sm_cycle * arch.sm_count * calibration.clock_hz)


def padded_score(config: ImplicitGemmConfig, p: ConvProblem, arch) -> Score:
    """igemm-flat on the problem with C padded to 16-byte vectors, plus the copies that pad x (and
    forward's w) and cut backward-weight's dw back: each a pass over its bytes and a launch."""
    padded = p.channels_padded()
    inner = igemm_score(replace(config, pad_channels=False), padded, arch)
    item = p.types.dtype.itemsize
    pixels = p.n * math.prod(p.input_size)
    copies = pixels * (p.c + padded.c) * item
    launches = 2  # pad x, then pad w (forward) or cut dw back (backward-weight); the inner score has the rest
    copies += p.k * math.prod(p.filter_size) * (p.c + padded.c) * item
    pad_s = copies / dram_bytes_per_s(arch) + launches * arch.calibration.launch_s
    modelled = inner.terms["modelled_us"] * 1e-6 + pad_s
    return Score(ideal_seconds(p, arch) / modelled,
                 {**inner.terms, "pad_us": pad_s * 1e6, "modelled_us": modelled * 1e6})


def igemm_score(config: ImplicitGemmConfig, p: ConvProblem, arch) -> Score:
    v = gemm_view(p)
    item = p.types.dtype.itemsize
    peak, bandwidth = _peak_flops(p, arch), dram_bytes_per_s(arch)
    flat = config.family is Family.IMPLICIT_GEMM_FLAT  # N (backward-weight) or the reduction is taps x C/G
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
    waste = {"tile_m": tile_efficiency(v.m, config.block_m), "tile_n": tile_n, "tile_k": tile_k}
    threads = config.num_warps * 32
    registers = accumulator_registers(config) + REGISTER_RESERVE
    if flat or not p.specialization.groups_aligned:  # an address and a mask an element
        registers += 2 * (config.block_m + config.block_n) * config.block_k // threads
    spills = registers > arch.registers_per_thread_max
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=min(registers, arch.registers_per_thread_max))
    if p.direction is Direction.BWD_WEIGHT and flat:
        tiles = math.ceil(v.m / config.block_m) * math.ceil(v.n / config.block_n) * p.groups * config.split_k
    elif p.direction is Direction.BWD_WEIGHT:
        tiles = math.ceil(v.m / config.block_m) * math.ceil(p.c_per_group / config.block_n)
        tiles *= math.prod(p.filter_size) * p.groups * config.split_k
    else:
        tiles = (math.ceil(v.m / config.block_m) * math.ceil(config.groups_per_tile * v.n / config.block_n)
                 * math.ceil(p.groups / config.groups_per_tile))
    waves, concurrent = sm_efficiency(tiles, resident, config.num_warps, arch.sm_count)
    intensity = 2 * config.block_m * config.block_n / ((config.block_m + config.block_n) * item)
    feed = min(1.0, intensity * bandwidth * L2_REUSE / peak)
    latency = 1.0 if concurrent >= 2 else 0.9 if config.num_stages >= 3 else 0.8
    efficiency = waste["tile_m"] * waste["tile_n"] * waste["tile_k"] * waves * feed * latency
    efficiency *= SPILL_PENALTY if spills else 1.0
    compute_s = p.flops() / (peak * efficiency)
    per_program = (config.block_m + config.block_n) * config.block_k * item * max(config.num_stages - 1, 1)
    programs_per_sm = min(resident, max(tiles / arch.sm_count, 1.0))
    in_flight = min(1.0, per_program * programs_per_sm / arch.calibration.bytes_in_flight_per_sm)
    if not p.specialization.groups_aligned:
        in_flight *= 0.25  # element loads instead of 16-byte vectors
    # DRAM moves 32-byte sectors: a channel run shorter than one wastes the rest of it. A flat
    # step's run is a filter row's taps x channels, contiguous in a row of the input.
    run = p.filter_size[-1] * v.depth if flat else config.groups_per_tile * v.depth
    run_bytes = min(run, config.block_k) * item
    sectors = min(1.0, run_bytes / 32) if p.direction is not Direction.BWD_WEIGHT else 1.0
    in_flight *= sectors
    memory_s = p.bytes() / (bandwidth * in_flight)
    reduce_s = 0.0
    if config.split_k > 1:
        weights = p.k * p.c_per_group * math.prod(p.filter_size)
        reduce_s = (config.workspace_slabs + 1) * weights * 4 / bandwidth + arch.calibration.launch_s
    issue_s = _issue_seconds(config, p, v, tiles, arch)
    intake_s = _intake_seconds(config, p, v, tiles, arch)
    bound_s = (compute_s**3 + memory_s**3 + issue_s**3 + intake_s**3) ** (1 / 3)
    modelled = bound_s / TILED_FRACTION + arch.calibration.launch_s + reduce_s
    ideal = ideal_seconds(p, arch)
    value = ideal / modelled
    if config.atomic_split:
        value *= NONDETERMINISTIC_PENALTY
    terms = {**waste, "waves": waves, "feed": feed, "latency": latency, "sectors": sectors,
             "resident": float(resident), "in_flight": in_flight, "spills": float(spills),
             "issue_us": issue_s * 1e6, "intake_us": intake_s * 1e6, "modelled_us": modelled * 1e6}
    return Score(value, terms)


def tma_score(config: TmaConfig, p: ConvProblem, arch) -> Score:
    """The igemm-tma kernels: boxes of pixels on the tensor cores (constants: see TMA_FRACTION)."""
    if p.direction is Direction.BWD_DATA:  # the forward kernel over dy, reading the filter turned
        return tma_score(config.as_forward(), p.data_gradient_as_forward(), arch)
    peak, bandwidth = _peak_flops(p, arch), dram_bytes_per_s(arch)
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


def direct_score(config: DirectConfig, p: ConvProblem, arch) -> Score:
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
    blocks = math.ceil(p.n * math.ceil(ow / TOEPLITZ_NW) / config.block_m) * math.ceil(oh / config.rows)
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


def flat_data_score(config: ImplicitGemmConfig, p: ConvProblem, arch) -> Score:
    """igemm-flat's backward-data: the fp32 column matrix written by a GEMM, then read back by col2im.

    For the few channels a group it serves, both stages move the columns (4 bytes a (pixel,
    tap, channel)) and little else, at a fraction of the bandwidth (FLAT_DATA_BANDWIDTH_FRACTION).
    The GEMM stage loses its overlap of loads and MMAs when one step covers K/G, and small
    tiles pay more per byte (FLAT_DATA_TILE).
    """
    item = p.types.dtype.itemsize
    taps, pixels = math.prod(p.filter_size), p.n * math.prod(p.output_size)
    columns = p.groups * pixels * taps * p.c_per_group * 4
    dy, dx = p.n * p.k * math.prod(p.output_size) * item, p.n * p.c * math.prod(p.input_size) * item
    weights = p.k * p.c_per_group * taps * item
    bandwidth = dram_bytes_per_s(arch) * FLAT_DATA_BANDWIDTH_FRACTION
    steps = math.ceil(p.k_per_group / config.block_k)
    terms = {"pipelined": min(1.0, steps / 2),
             "tile": min(1.0, math.sqrt(config.block_m * config.block_n / FLAT_DATA_TILE))}
    gemm_s = (dy + weights + columns) / bandwidth / math.prod(terms.values())
    col2im_s = (columns + dx) / bandwidth
    modelled = gemm_s + col2im_s + 2 * arch.calibration.launch_s
    return Score(ideal_seconds(p, arch) / modelled,
                 {**terms, "gemm_us": gemm_s * 1e6, "col2im_us": col2im_s * 1e6, "modelled_us": modelled * 1e6})


def pointwise_score(config: PointwiseConfig, p: ConvProblem, arch) -> Score:
    """The gemm family: the device time the GEMM op's own ranking models for its best Triton kernel."""
    from . import pointwise

    ranked = pointwise.gemm_dispatcher(arch).explain(pointwise.gemm_problem(p)).ranked
    if not ranked:
        return Score(0.0, {"gemm_kernels": 0.0})
    modelled = ranked[0].score.terms["modelled_us"] * 1e-6 * POINTWISE_GEMM_FIT
    return Score(ideal_seconds(p, arch) / modelled, {"modelled_us": modelled * 1e6})


def rule_score(config: AnyConvConfig, problem: ConvProblem, arch) -> Score:
    if isinstance(config, VendorConfig):
        return vendor_score(config, problem, arch)
    if isinstance(config, PointwiseConfig):
        return pointwise_score(config, problem, arch)
    if isinstance(config, ToeplitzConfig):
        return toeplitz_score(config, problem, arch)
    if isinstance(config, DirectConfig):
        return direct_score(config, problem, arch)
    if isinstance(config, TmaConfig):
        return tma_score(config, problem, arch)
    if config.pad_channels:
        return padded_score(config, problem, arch)
    if config.family is Family.IMPLICIT_GEMM_FLAT and problem.direction is Direction.BWD_DATA:
        return flat_data_score(config, problem, arch)
    return igemm_score(config, problem, arch)
