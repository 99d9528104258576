"""Family `igemm-flat`: the implicit GEMM over the filter's (tap, channel) pairs as one flat index, for
few channels a group (kernels/implicit_gemm_flat.py). Its config and GEMM model are the implicit
GEMM's (implicit_gemm.py); here are its own stages: backward-data's fp32 column matrix summed into dx
by `conv_col2im`, and `pad_channels`, which runs the unpadded config's stages on copies of x (and
forward's w) with C padded to a whole 16-byte vector.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ....core.arith import cdiv
from ....core.family import KernelFamily
from ....core.launch import Launch, Plan
from ....core.op import KernelUnit, Score
from ....heuristics.roofline import dram_bytes_per_s, per_problem
from ..operands import ConvOperands, channels_last_empty
from ..plan import (
    KERNELS,
    STRIDES,
    bound_values,
    dim_strides,
    kernel_units as op_kernel_units,
    made,
    output_tensor,
    plan as op_plan,
    pointer_plan,
    python_unit,
)
from ..problem import ConvProblem, ConvSpecialization, Direction
from ..ranking import ideal_seconds
from ..signature import FAMILIES, Family
from . import implicit_gemm
from .implicit_gemm import ImplicitGemmConfig, igemm_score

MODULE = f"{KERNELS}.implicit_gemm_flat"
FUNCTIONS = {Direction.FORWARD: "conv_fwd_igemm_flat", Direction.BWD_DATA: "conv_bwd_data_igemm_flat",
             Direction.BWD_WEIGHT: "conv_bwd_weight_igemm_flat"}
_PAD_MODULE = f"{KERNELS}.channel_pad"
COL2IM_BLOCK_PIXELS = 128  # the flat backward-data's gather: input pixels a program,
COL2IM_BLOCK_CHANNELS = 4  # and channels a pass (the stem's 3 in one)
COL2IM_GEOMETRY = ("N", "G", "CG", "D", "H", "W", "OD", "OH", "OW", "FZ", "FY", "FX",
                   "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")
PAD_BLOCK_ROWS = 128  # channel padding: rows (pixels) of 8 channels per program
# igemm-flat's backward-data streams its fp32 column matrix out and back. On the stem (H100, results/h100/
# conv_sweep_igemm-flat_bwd_data.csv) its best tile took 205 us to write the 236 MB and 208 to gather
# them (the bf16 columns of a scratch probe ran only 1.1-1.25x faster: neither stage is bandwidth-bound),
# 0.27 of the bandwidth modelled; tiles whose one step covers K/G ran their GEMM stage 1.5-2.1x slower,
# those of 64x64 1.3x (FLAT_DATA_TILE: the output tile below which a stage pays more per byte).
FLAT_DATA_BANDWIDTH_FRACTION = 0.27
FLAT_DATA_TILE = 128 * 64
_UNPAD_UNIT = python_unit("unpad", "tiledispatch.ops.conv.families.igemm_flat", "unpad_weight", ("padded", "out"))


def unpad_weight(padded: torch.Tensor, out: torch.Tensor) -> None:
    """The last stage of a padded backward-weight: dw's real input channels out of the padded one's."""
    out.copy_(padded[:, :out.shape[1]])


def data_gradient(config: ImplicitGemmConfig) -> bool:
    """Whether the config is the flat backward-data: columns by tensor cores, then `conv_col2im`."""
    return config.signature.direction is Direction.BWD_DATA


def score(config: ImplicitGemmConfig, p: ConvProblem, arch) -> Score:
    if config.pad_channels:
        return padded_score(config, p, arch)
    if p.direction is Direction.BWD_DATA:
        return flat_data_score(config, p, arch)
    return igemm_score(config, p, arch)


@per_problem  # each padded config's score reads it: a copy of the problem, validated anew when made
def _padded_problem(p: ConvProblem) -> ConvProblem:
    return p.channels_padded()


def padded_score(config: ImplicitGemmConfig, p: ConvProblem, arch) -> Score:
    """igemm-flat on the problem with C padded to 16-byte vectors, plus the copies that pad x (and
    forward's w) and cut backward-weight's dw back: each a pass over its bytes and a launch."""
    padded = _padded_problem(p)
    inner = igemm_score(config.unpadded, padded, arch)
    item = p.types.dtype.itemsize
    pixels = p.n * math.prod(p.input_size)
    copies = pixels * (p.c + padded.c) * item
    launches = 2  # pad x, then pad w (forward) or cut dw back (backward-weight); the inner score has the rest
    copies += p.k * math.prod(p.filter_size) * (p.c + padded.c) * item
    pad_s = copies / dram_bytes_per_s(arch) + launches * arch.calibration.launch_s
    modelled = inner.terms["modelled_us"] * 1e-6 + pad_s
    return Score(ideal_seconds(p, arch) / modelled,
                 {**inner.terms, "pad_us": pad_s * 1e6, "modelled_us": modelled * 1e6})


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


def kernel_units(config: ImplicitGemmConfig, specialization: ConvSpecialization, arch) -> tuple[KernelUnit, ...]:
    if config.pad_channels:  # pad, the padded problem's units, unpad
        padded = specialization.channels_padded(config.signature.types.dtype)
        inner = op_kernel_units(config.unpadded, padded, arch)
        weight = config.signature.direction is Direction.BWD_WEIGHT
        return (_pad_unit(config), *inner) + ((_UNPAD_UNIT,) if weight else ())
    function = FUNCTIONS[config.signature.direction]
    if data_gradient(config):
        return (implicit_gemm.main_unit(config, specialization, MODULE, function), _col2im_unit(config))
    return implicit_gemm.units(config, specialization, MODULE, function)


def _col2im_unit(config: ImplicitGemmConfig) -> KernelUnit:
    """The flat backward-data's second stage: its fp32 columns summed into dx (kernels/implicit_gemm_flat.py)."""
    t = config.signature.types.dtype.triton
    constexprs = {"BLOCK_P": COL2IM_BLOCK_PIXELS, "BLOCK_C": COL2IM_BLOCK_CHANNELS}
    signature = ([("ws_ptr", "*fp32"), ("x_ptr", f"*{t}")] + [(n, "i32") for n in COL2IM_GEOMETRY]
                 + [(n, "i64") for n in STRIDES[0:4]] + [(n, "constexpr") for n in constexprs])
    return KernelUnit(
        stage="col2im", module=MODULE, function="conv_col2im", signature=tuple(signature),
        constexprs=tuple(sorted(constexprs.items())), num_warps=4, num_stages=1,
    )


def _pad_unit(config: ImplicitGemmConfig) -> KernelUnit:
    t = config.signature.types.dtype.triton
    constexprs = {"BLOCK_R": PAD_BLOCK_ROWS, "BLOCK_C": 16 // config.signature.types.dtype.itemsize}
    signature = ([("src_ptr", f"*{t}"), ("dst_ptr", f"*{t}")]
                 + [(n, "i32") for n in ("ROWS", "D", "H", "W", "C", "CP")]
                 + [(n, "i64") for n in ("ssn", "ssd", "ssh", "ssw", "sdn", "sdd", "sdh", "sdw")]
                 + [(n, "constexpr") for n in constexprs])
    return KernelUnit(
        stage="pad", module=_PAD_MODULE, function="pad_channels", signature=tuple(signature),
        constexprs=tuple(sorted(constexprs.items())), num_warps=4, num_stages=1,
    )


def grid(config: ImplicitGemmConfig, p, taps: int) -> tuple[int, int, int]:
    """The implicit GEMM's grid, but for the flat reductions' tiles of every tap's channels."""
    if p.direction is Direction.BWD_DATA:  # M = output pixels, N = j
        return (cdiv(p.n * math.prod(p.output_size), config.block_m) * cdiv(taps * p.c_per_group, config.block_n),
                p.groups, 1)
    if p.direction is Direction.BWD_WEIGHT:  # N = every tap's channels
        return (cdiv(p.k_per_group, config.block_m) * cdiv(taps * p.c_per_group, config.block_n), p.groups,
                config.split_k)
    return implicit_gemm.grid(config, p, taps)


def plan(config: ImplicitGemmConfig, ops: ConvOperands) -> Plan:
    out = output_tensor(ops)
    if config.pad_channels:
        return _padded_plan(config, ops, out)
    if not data_gradient(config):
        return pointer_plan(config, ops, out, grid)
    p = ops.problem
    taps = math.prod(p.filter_size)

    def col2im(units, bound) -> Launch:
        phase_pixels = p.n * math.prod(cdiv(size, s) for size, s in zip(p.input_size, p.stride))
        return Launch("col2im", (cdiv(phase_pixels, COL2IM_BLOCK_PIXELS), p.groups, math.prod(p.stride)),
                      bound_values(units[1], bound))

    # the column matrix [G, taps x C/G, output pixels]
    columns = p.groups * p.n * math.prod(p.output_size) * taps * p.c_per_group
    return pointer_plan(config, ops, out, grid, columns=columns, then=col2im)


def _padded_plan(config: ImplicitGemmConfig, ops: ConvOperands, out: torch.Tensor) -> Plan:
    """x (and forward's w) copied with C padded to whole 16-byte vectors, the unpadded config's plan on
    the copies, and backward-weight's dw cut back to the real channels."""
    p = ops.problem
    padded = p.channels_padded()
    pad = op_kernel_units(config, p.specialization)[0]
    dtype, device = p.types.dtype.torch, ops.device
    x = channels_last_empty((p.n, padded.c, *p.input_size), dtype, device)
    launches = [_pad_launch(pad, ops.x, x)]
    w, inner_out = ops.w, out
    if p.direction is Direction.FORWARD:
        w = channels_last_empty((p.k, padded.c, *p.filter_size), dtype, device)
        launches.append(_pad_launch(pad, ops.w, w))
    else:
        inner_out = channels_last_empty((p.k, padded.c, *p.filter_size), dtype, device)
    inner = op_plan(config.unpadded, replace(ops, problem=padded, x=x, w=w, out=inner_out))
    launches += inner.launches
    if p.direction is Direction.BWD_WEIGHT:
        launches.append(Launch("unpad", (1, 1, 1), (inner_out, out)))
    copies = (x, w if p.direction is Direction.FORWARD else inner_out)
    return Plan(tuple(launches), out, inner.zeroed, made(*copies) + inner.scratch)


def _pad_launch(unit: KernelUnit, src: torch.Tensor, dst: torch.Tensor) -> Launch:
    """A pad stage: src (A, C, *spatial) into dst (A, CP, *spatial), both channel stride 1."""
    d, h, w = (1,) * (5 - src.dim()) + tuple(src.shape[2:])
    rows = src.shape[0] * d * h * w
    bound = {"src_ptr": src, "dst_ptr": dst, "ROWS": rows, "D": d, "H": h, "W": w, "C": src.shape[1],
             "CP": dst.shape[1], **dict(zip(("ssn", "ssd", "ssh", "ssw"), dim_strides(src))),
             **dict(zip(("sdn", "sdd", "sdh", "sdw"), dim_strides(dst)))}
    return Launch("pad", (cdiv(rows, PAD_BLOCK_ROWS), 1, 1), bound_values(unit, bound))


FAMILY = FAMILIES.register(KernelFamily(
    op="conv", name=Family.IMPLICIT_GEMM_FLAT.value, config_type=ImplicitGemmConfig,
    validate=implicit_gemm.findings, supports=implicit_gemm.supports, score=score,
    kernel_units=kernel_units, plan=plan, correction=implicit_gemm.correction,
))
