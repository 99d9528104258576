"""Family `vendor`: cuDNN through PyTorch as a candidate (the call itself: ../vendor.py).

It picks its own algorithm, so its config is only a signature; its score is cuDNN's measured
fraction of the ideal for the kind of conv it runs (dense, grouped, depthwise).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from ....core.family import KernelFamily
from ....core.launch import Launch, Plan
from ....core.op import Score
from ....core.validation import Finding, Severity
from ....heuristics.roofline import dram_bytes_per_s, fma_flops
from ..plan import output_tensor, python_unit
from ..problem import ConvProblem, Direction
from ..ranking import VENDOR_CALL_SECONDS, VENDOR_TRUST, ideal_seconds
from ..rules import ConvRule
from ..signature import FAMILIES, ConvSignature, Family

# cuDNN through PyTorch: ideal / (measured - VENDOR_CALL_SECONDS), geomean over the suite's cases
# of each class, bf16 and fp16, on the H200 conv table that benchmarks/results/h200/README.md names
# for VENDOR_FRACTION, unless an entry names an H100 table. The dense forward and backward-weight
# run 0.41-0.71 and 0.39-0.61; that table's backward-data (0.11-0.24) is timed with torch.nn.grad's
# stand-in for x, so the dense backward-data entry comes from the H100 (below).
FEW_CHANNELS = 8  # dense convs with fewer input channels are their own class (ShapeClass.FEW_CHANNELS)


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
# Its grouped convs with C/G above 16 and not a multiple of it, or above 32, run far below the
# fractions above: on the H200's grouped forward sweep (selection/conv_forward_bf16_sweep.parquet,
# its 50 grouped problems: regnet's C/G = 24 and 56, random ones to 128) they took a median 3.8x
# the time modelled at half the fraction (7.8x at C/G = 64), where the others (C/G 4-32, multiples
# of 16 above 16) took 0.93x. This factor centres the log error of those 26 on 0 (mean absolute
# log error 1.13 -> 0.51). Without it the modelled saving of igemm on regnet's grouped 3x3 convs
# (cuDNN 85 us, igemm 4x faster) was below an eager call's host time. The backward directions keep
# the H100's fit, half the fraction where C/G is uneven (regnet g8, C/G = 56: 0.086 / 0.05 against
# 0.15-0.18 / 0.12-0.18, results/h100/conv_replicate_a00603a.csv); no H200 sweep has timed them.
VENDOR_GROUPED_EVEN = 16
VENDOR_GROUPED_WIDE = 32  # forward: C/G above this is slow however even
VENDOR_GROUPED_SLOW = {Direction.FORWARD: 0.14, Direction.BWD_DATA: 0.5, Direction.BWD_WEIGHT: 0.5}
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
# Its 3-D depthwise backward-weight falls off a cliff the 2-D fit above cannot see: one such conv
# took 50.8 ms on the H200 where the fit modelled 87 us and a direct-family kernel ran in about
# 85 us (issue 41's measurement). Until a sweep measures the class, the fit's time is stretched
# by that ratio, so the vendor is never picked over kernels hundreds of times faster.
VENDOR_DEPTHWISE_3D_WEIGHT_SLOWDOWN = 580.0


@dataclass(frozen=True)
class VendorConfig:
    """cuDNN through PyTorch as a candidate: it picks its own algorithm."""

    signature: ConvSignature
    family: Family = Family.VENDOR

    @property
    def name(self) -> str:
        return f"conv_{self.signature.name}_vendor_{self.signature.epilogue.name}"


def findings(config: VendorConfig, arch) -> tuple[Finding, ...]:
    """The interpreter refuses it: it is a GPU library."""
    if arch.is_interpreter:
        return (Finding(ConvRule.FAMILY_ARCH, Severity.ERROR, "the vendor path is cuDNN, a GPU library; the "
                        "interpreter target runs Triton kernels", "use a GPU arch"),)
    return ()


def supports(config: VendorConfig, problem: ConvProblem) -> str | None:
    want = ConvSignature.of(problem)
    if config.signature != want:
        return f"built for {config.signature.name} {config.signature.epilogue.name}, the problem is {want.name} " \
               f"{want.epilogue.name}"
    return None


def _slow_grouped(p: ConvProblem) -> bool:
    """C/G above 16 and not a multiple of it, or, in a forward, above 32 (see VENDOR_GROUPED_SLOW)."""
    per_group = p.c_per_group
    wide = p.direction is Direction.FORWARD and per_group > VENDOR_GROUPED_WIDE
    return per_group > VENDOR_GROUPED_EVEN and (per_group % VENDOR_GROUPED_EVEN != 0 or wide)


def vendor_score(config: VendorConfig, p: ConvProblem, arch) -> Score:
    ideal = ideal_seconds(p, arch)
    kind = shape_class(p)
    fraction = VENDOR_FRACTION[(kind, p.direction)]
    if kind is ShapeClass.GROUPED and _slow_grouped(p):
        fraction *= VENDOR_GROUPED_SLOW[p.direction]
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
        if p.direction is Direction.BWD_WEIGHT and p.spatial_dims == 3:
            conv_s *= VENDOR_DEPTHWISE_3D_WEIGHT_SLOWDOWN
        if p.direction is Direction.BWD_DATA and not p.unit_stride:
            conv_s *= VENDOR_DEPTHWISE_STRIDED_BWD_DATA
    steps = int(p.epilogue.activation.value != "none") + int(p.epilogue.residual)
    y_bytes = p.n * p.k * math.prod(p.output_size) * p.types.dtype.itemsize
    step_s = 2 * y_bytes / dram_bytes_per_s(arch) + arch.calibration.launch_s
    modelled = conv_s + VENDOR_CALL_SECONDS + steps * step_s
    # Compared with the Triton kernels' models, whose error is up to VENDOR_TRUST.
    return Score(ideal / modelled * VENDOR_TRUST, {"fraction": fraction, "epilogue_steps": float(steps),
                                                   "trust": VENDOR_TRUST, "modelled_us": modelled * 1e6})


_UNIT = python_unit("vendor", "tiledispatch.ops.conv.vendor", "run", ("operands", "out"))


def plan(config: VendorConfig, ops) -> Plan:
    out = output_tensor(ops)
    return Plan((Launch("vendor", (1, 1, 1), (ops, out)),), out)


FAMILY = FAMILIES.register(KernelFamily(
    op="conv", name=Family.VENDOR.value, config_type=VendorConfig, validate=findings, supports=supports,
    score=vendor_score, kernel_units=lambda config, specialization, arch: (_UNIT,), plan=plan,
))
