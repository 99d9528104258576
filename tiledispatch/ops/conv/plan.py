"""What to compile for a conv config, and how to launch it on checked operands.

Every pointer-based Triton kernel of the op takes one argument list (tensors, 3-D
geometry, strides of the non-channel dims), so one binder serves the igemm and direct
families in all directions; the igemm-tma family takes tensor descriptors instead
(`_tma_unit`, `_tma_bound`), and the toeplitz family (Gluon, depthwise 2-D) a list of its
own (`_toeplitz_units`, `_toeplitz_plan`). A split backward-weight adds the
`conv_weight_reduce` stage; a config with `pad_channels` runs its unpadded twin's stages on
padded copies (`_padded_plan`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import torch
import triton

from ... import arch as arch_facts
from ...core.errors import InvalidProblemError
from ...core.launch import Launch, Plan
from ...core.op import KernelUnit, UnitKind
from ...core.runtime import current_arch
from ..gemm.plan import ACTIVATION_CODES
from . import pointwise
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
from .kernels import toeplitz as toeplitz_kernels
from .operands import ConvOperands, channels_last_empty, to_channels_last
from .problem import ConvSpecialization, Direction
from .rules import ToeplitzWalk, toeplitz_register_cap, weight_window_register_cap, window_register_cap

_KERNELS = "tiledispatch.ops.conv.kernels"
FAMILY_MODULES = {Family.IMPLICIT_GEMM: f"{_KERNELS}.implicit_gemm", Family.DIRECT: f"{_KERNELS}.direct",
                  Family.IMPLICIT_GEMM_FLAT: f"{_KERNELS}.implicit_gemm_flat",
                  Family.IMPLICIT_GEMM_TMA: f"{_KERNELS}.implicit_gemm_tma"}
_REDUCE_MODULE = f"{_KERNELS}.weight_reduce"
_TOEPLITZ_MODULE = f"{_KERNELS}.toeplitz"
_PAD_MODULE = f"{_KERNELS}.channel_pad"
FUNCTIONS = {
    (Family.IMPLICIT_GEMM, Direction.FORWARD): "conv_fwd_igemm",
    (Family.IMPLICIT_GEMM, Direction.BWD_DATA): "conv_bwd_data_igemm",
    (Family.IMPLICIT_GEMM, Direction.BWD_WEIGHT): "conv_bwd_weight_igemm",
    (Family.DIRECT, Direction.FORWARD): "conv_fwd_direct",
    (Family.DIRECT, Direction.BWD_DATA): "conv_bwd_data_direct",
    (Family.DIRECT, Direction.BWD_WEIGHT): "conv_bwd_weight_direct",
    (Family.IMPLICIT_GEMM_FLAT, Direction.FORWARD): "conv_fwd_igemm_flat",
    (Family.IMPLICIT_GEMM_FLAT, Direction.BWD_DATA): "conv_bwd_data_igemm_flat",  # then conv_col2im
    (Family.IMPLICIT_GEMM_FLAT, Direction.BWD_WEIGHT): "conv_bwd_weight_igemm_flat",
    (Family.IMPLICIT_GEMM_TMA, Direction.FORWARD): "conv_fwd_igemm_tma",
    (Family.IMPLICIT_GEMM_TMA, Direction.BWD_DATA): "conv_fwd_igemm_tma",  # over dy, the filter read turned
    (Family.IMPLICIT_GEMM_TMA, Direction.BWD_WEIGHT): "conv_bwd_weight_igemm_tma",
}
# Direct configs with a window (depthwise by sliding windows along W).
WINDOW_FUNCTIONS = {Direction.FORWARD: "conv_fwd_direct_window", Direction.BWD_DATA: "conv_bwd_data_direct_window",
                    Direction.BWD_WEIGHT: "conv_bwd_weight_direct_window"}
TENSORS = ("x_ptr", "w_ptr", "y_ptr", "bias_ptr", "res_ptr", "ws_ptr")
GEOMETRY = ("N", "G", "CG", "KG", "D", "H", "W", "OD", "OH", "OW", "FZ", "FY", "FX",
            "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")
STRIDES = ("sxn", "sxd", "sxh", "sxw", "swk", "swz", "swy", "swx", "syn", "syd", "syh", "syw",
           "srn", "srd", "srh", "srw")
# The split reductions' block: an element a thread. At 1K elements a program the depthwise
# layers' dw (C x taps: 3.5K-19K values) made 4-19 programs, latency-bound (ncu: 5.3 us on the
# suite's 5x5); at 128 their walks ran 4-9 % faster and the dense splits 2-4 % (H100,
# benchmarks/results/h100/conv_reduce_block_ab.csv).
REDUCE_BLOCK = 128
COL2IM_BLOCK_PIXELS = 128  # the flat backward-data's gather: input pixels a program,
COL2IM_BLOCK_CHANNELS = 4  # and channels a pass (the stem's 3 in one)
COL2IM_GEOMETRY = ("N", "G", "CG", "D", "H", "W", "OD", "OH", "OW", "FZ", "FY", "FX",
                   "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")
PAD_BLOCK_ROWS = 128  # channel padding: rows (pixels) of 8 channels per program
MAX_GRID_YZ = 65535
CHANNELS_FASTEST_PIXEL_BYTES = 2048  # pixels this long: window kernels step channel blocks fastest
ALIGNED = ConvSpecialization()


def _main_unit(config: ImplicitGemmConfig | DirectConfig, specialization: ConvSpecialization,
               arch: arch_facts.ArchInfo | None) -> KernelUnit:
    sig = config.signature
    t = sig.types.dtype.triton
    pointer = {"ws_ptr": "*fp32"}
    signature = ([(name, pointer.get(name, f"*{t}")) for name in TENSORS] + [(n, "i32") for n in GEOMETRY]
                 + [(n, "i64") for n in STRIDES])
    epilogue = {"HAS_BIAS": sig.epilogue.bias, "ACTIVATION": ACTIVATION_CODES[sig.epilogue.activation],
                "HAS_RESIDUAL": sig.epilogue.residual}
    vec = specialization.vector(sig.types.dtype, per_group=isinstance(config, ImplicitGemmConfig))
    aligned_pointers = tuple(n for n in TENSORS if n != "bias_ptr") if vec > 1 else ()
    if isinstance(config, ImplicitGemmConfig):
        vec_y = specialization.output_vector(sig.types.dtype)
        if vec == 1 and vec_y > 1:
            aligned_pointers = ("y_ptr",)
        constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                      "GROUP_M": config.group_m, "SPLIT_K": config.split_k,
                      "ATOMIC": config.atomic_split, **epilogue,
                      "DOT_PRECISION": "tf32" if sig.types.allow_tf32 else "ieee", "VEC": vec, "VEC_Y": vec_y,
                      "POINTWISE": specialization.pointwise, "GROUPS_PER_TILE": config.groups_per_tile,
                      "EVEN_K": _even_channels(config, specialization),
                      "UNIT_STRIDE": specialization.unit_stride}
        warps, stages = config.num_warps, config.num_stages
    else:
        constexprs = {"BLOCK_P": config.block_p, "BLOCK_C": config.block_c, "SPLIT_K": config.split_k, **epilogue,
                      "VEC": vec, "DEPTHWISE": specialization.depthwise, "UNIT_STRIDE": specialization.unit_stride}
        if config.window:
            constexprs |= {"RUN": config.run, "WINDOW": config.window}
            if sig.direction is Direction.BWD_WEIGHT:  # each in the kernels' order of parameters
                constexprs |= {"ROWS": config.rows, "BAND": config.band, "WINDOW_STRIDE": config.window_stride}
            else:
                constexprs |= {"WINDOW_STRIDE": config.window_stride, "ONE_ROW": specialization.one_row}
        warps, stages = config.num_warps, 1
    module = FAMILY_MODULES[config.family]
    windowed = isinstance(config, DirectConfig) and config.window > 0
    function = WINDOW_FUNCTIONS[sig.direction] if windowed else FUNCTIONS[(config.family, sig.direction)]
    return KernelUnit(
        stage="main", module=module, function=function,
        signature=tuple(signature + [(name, "constexpr") for name in constexprs]),
        constexprs=tuple(sorted(constexprs.items())), num_warps=warps, num_stages=stages,
        divisible_by_16=aligned_pointers, max_registers=_window_cap(config, vec, arch) if windowed else None,
    )


def _window_cap(config: DirectConfig, vector: int, arch: arch_facts.ArchInfo | None) -> int | None:
    if config.signature.direction is Direction.BWD_WEIGHT:
        return weight_window_register_cap(config, _target(arch).registers_per_sm)
    return window_register_cap(config, vector)


def _target(arch: arch_facts.ArchInfo | None) -> arch_facts.ArchInfo:
    """The arch a unit is built for: `arch`, or where none is named, the one the Gluon families are
    written for (the known arch with warpgroup MMA), whose register file sizes the caps."""
    if arch is not None:
        return arch
    return next(a for a in map(arch_facts.load, arch_facts.available()) if a.has(arch_facts.Feature.WGMMA))


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


def _even_channels(config: ImplicitGemmConfig, specialization: ConvSpecialization) -> bool:
    """Whether the kernel's channel blocks are all whole, so it drops its channel masks.

    Forward and backward-data block the reduction's channels by block_k (merged groups
    keep their own masks); backward-weight blocks K/G by block_m and C/G by block_n.
    """
    if config.signature.direction is Direction.BWD_WEIGHT:
        return specialization.even_channels(max(config.block_m, config.block_n))
    return config.groups_per_tile == 1 and specialization.even_channels(config.block_k)


def _reduce_unit(config, specialization: ConvSpecialization) -> KernelUnit:
    t = config.signature.types.dtype.triton
    constexprs = {"BLOCK": REDUCE_BLOCK, "SPLIT_K": config.workspace_slabs}
    signature = ([("ws_ptr", "*fp32"), ("w_ptr", f"*{t}")]
                 + [(n, "i32") for n in ("TOTAL", "CG", "TAPS", "FY", "FX")]
                 + [(n, "i64") for n in ("swk", "swz", "swy", "swx")] + [(n, "constexpr") for n in constexprs])
    return KernelUnit(
        stage="reduce", module=_REDUCE_MODULE, function="conv_weight_reduce", signature=tuple(signature),
        constexprs=tuple(sorted(constexprs.items())), num_warps=4, num_stages=1,
        divisible_by_16=("ws_ptr", "w_ptr") if specialization.aligned else ("ws_ptr",),
    )


def _col2im_unit(config: ImplicitGemmConfig) -> KernelUnit:
    """The flat backward-data's second stage: its fp32 columns summed into dx (kernels/implicit_gemm_flat.py)."""
    t = config.signature.types.dtype.triton
    constexprs = {"BLOCK_P": COL2IM_BLOCK_PIXELS, "BLOCK_C": COL2IM_BLOCK_CHANNELS}
    signature = ([("ws_ptr", "*fp32"), ("x_ptr", f"*{t}")] + [(n, "i32") for n in COL2IM_GEOMETRY]
                 + [(n, "i64") for n in STRIDES[0:4]] + [(n, "constexpr") for n in constexprs])
    module = FAMILY_MODULES[Family.IMPLICIT_GEMM_FLAT]
    return KernelUnit(
        stage="col2im", module=module, function="conv_col2im", signature=tuple(signature),
        constexprs=tuple(sorted(constexprs.items())), num_warps=4, num_stages=1,
    )


def flat_data_gradient(config: AnyConvConfig) -> bool:
    """Whether the config is the flat backward-data: columns by tensor cores, then `conv_col2im`."""
    return (isinstance(config, ImplicitGemmConfig) and config.family is Family.IMPLICIT_GEMM_FLAT
            and config.signature.direction is Direction.BWD_DATA)


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


_UNPAD_UNIT = KernelUnit(
    stage="unpad", module="tiledispatch.ops.conv.plan", function="unpad_weight",
    signature=(("padded", "python"), ("out", "python")), constexprs=(), num_warps=0, num_stages=0,
    kind=UnitKind.PYTHON,
)


def unpad_weight(padded: torch.Tensor, out: torch.Tensor) -> None:
    """The last stage of a padded backward-weight: dw's real input channels out of the padded one's."""
    out.copy_(padded[:, :out.shape[1]])


_POINTWISE_UNIT = KernelUnit(
    stage="gemm", module="tiledispatch.ops.conv.pointwise", function="run",
    signature=tuple((name, "python") for name in ("operands", "out", "dispatcher")),
    constexprs=(), num_warps=0, num_stages=0, kind=UnitKind.PYTHON,
)


_VENDOR_UNIT = KernelUnit(
    stage="vendor", module="tiledispatch.ops.conv.vendor", function="run",
    signature=tuple((name, "python") for name in ("operands", "out")),
    constexprs=(), num_warps=0, num_stages=0, kind=UnitKind.PYTHON,
)


def splits(config: AnyConvConfig) -> bool:
    """Whether the config adds a reduction stage (backward-weight split over pixels)."""
    return (not isinstance(config, (VendorConfig, PointwiseConfig))
            and config.signature.direction is Direction.BWD_WEIGHT and config.split_k > 1)


@functools.lru_cache(maxsize=4096)  # called on every launch: the plan reads the signature
def kernel_units(config: AnyConvConfig, specialization: ConvSpecialization = ALIGNED,
                 arch: arch_facts.ArchInfo | None = None) -> tuple[KernelUnit, ...]:
    """What `config` compiles and runs for `specialization` on `arch` (None: `_target`'s)."""
    if isinstance(config, VendorConfig):
        return (_VENDOR_UNIT,)
    if isinstance(config, PointwiseConfig):
        return (_POINTWISE_UNIT,)
    if isinstance(config, ToeplitzConfig):
        return _toeplitz_units(config, specialization, arch)
    if isinstance(config, ImplicitGemmConfig) and config.pad_channels:  # pad, the padded problem's units, unpad
        padded = specialization.channels_padded(config.signature.types.dtype)
        inner = kernel_units(replace(config, pad_channels=False), padded, arch)
        weight = config.signature.direction is Direction.BWD_WEIGHT
        return (_pad_unit(config), *inner) + ((_UNPAD_UNIT,) if weight else ())
    if flat_data_gradient(config):
        return (_main_unit(config, specialization, arch), _col2im_unit(config))
    main = (_tma_unit(config, specialization) if isinstance(config, TmaConfig)
            else _main_unit(config, specialization, arch))
    return (main, _reduce_unit(config, specialization)) if splits(config) else (main,)


# -- the igemm-tma family: tensor descriptors ------------------------------------------------------
TMA_GEOMETRY = ("N", "G", "CG", "KG", "OD", "OH", "OW", "FZ", "FY", "FX", "PD", "PH", "PW", "DD", "DH", "DW")
# (descriptor or pointer arguments, the stride arguments) of each direction's kernel
_TMA_FORWARD_ARGUMENTS = (("x_desc", "w_desc", "y_ptr", "bias_ptr", "res_ptr"),
                          ("syn", "syd", "syh", "syw", "srn", "srd", "srh", "srw"))
TMA_ARGUMENTS = {
    Direction.FORWARD: _TMA_FORWARD_ARGUMENTS,
    Direction.BWD_DATA: _TMA_FORWARD_ARGUMENTS,
    Direction.BWD_WEIGHT: (("x_desc", "dy_desc", "w_ptr", "ws_ptr"), ("swk", "swz", "swy", "swx")),
}


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
        constexprs |= {"BLOCK_N": config.block_out, "BLOCK_K": config.block_in, "HAS_BIAS": sig.epilogue.bias,
                       "ACTIVATION": ACTIVATION_CODES[sig.epilogue.activation],
                       "HAS_RESIDUAL": sig.epilogue.residual, "TURNED_WEIGHT": direction is Direction.BWD_DATA}
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
    module = FAMILY_MODULES[Family.IMPLICIT_GEMM_TMA]
    return KernelUnit(
        stage="main", module=module, function=FUNCTIONS[(Family.IMPLICIT_GEMM_TMA, direction)],
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
            strides[i] = triton.cdiv(strides[i + 1] * shape[i + 1], unit) * unit
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
                        **dict(zip(("swk", "swz", "swy", "swx"), _strides(out)))}
    dummy = out  # stands in for absent pointers; the kernel never reads them (constexpr flags off)
    return bound | {"w_desc": weight_matrix_descriptor(ops.w, blocks["w_desc"]), "y_ptr": out,
                    "bias_ptr": ops.bias if ops.bias is not None else dummy,
                    "res_ptr": ops.residual if ops.residual is not None else dummy,
                    **dict(zip(("syn", "syd", "syh", "syw"), _strides(out))),
                    **dict(zip(("srn", "srd", "srh", "srw"), _strides(ops.residual)))}


def _values(unit: KernelUnit, bound: dict) -> tuple:
    constants = dict(unit.constexprs)
    return tuple(bound[name] if name in bound else constants[name] for name, _ in unit.signature)


def _strides(t: torch.Tensor | None) -> tuple[int, int, int, int]:
    """(outer, d, h, w) strides of an (A, B, *spatial) tensor; a missing spatial dim has index 0 and stride 0."""
    if t is None:
        return (0, 0, 0, 0)
    spatial = tuple(t.stride()[2:])
    return (t.stride(0), *((0,) * (3 - len(spatial)) + spatial))


def output_tensor(ops: ConvOperands) -> torch.Tensor:
    return ops.out if ops.out is not None else channels_last_empty(
        ops.output_shape(), ops.problem.types.dtype.torch, ops.device)


def plan(config: AnyConvConfig, ops: ConvOperands) -> Plan:
    p = ops.problem
    out = output_tensor(ops)
    if isinstance(config, VendorConfig):
        return Plan((Launch("vendor", (1, 1, 1), (ops, out)),), out)
    if isinstance(config, PointwiseConfig):  # the GEMM op's call, which plans and launches its own kernel
        return Plan((Launch("gemm", (1, 1, 1), (ops, out, pointwise.gemm_dispatcher(current_arch()))),), out)
    if isinstance(config, TmaConfig):
        return _tma_plan(config, ops, out)
    if isinstance(config, ToeplitzConfig):
        return _toeplitz_plan(config, ops, out)
    if isinstance(config, ImplicitGemmConfig) and config.pad_channels:
        return _padded_plan(config, ops, out)
    direction = p.direction
    x = out if direction is Direction.BWD_DATA else ops.x
    w = out if direction is Direction.BWD_WEIGHT else ops.w
    reads_taps = direction is not Direction.BWD_WEIGHT  # backward-weight's window kernel stores dw by its strides
    if isinstance(config, DirectConfig) and config.window and w.stride(-1) != 1 and reads_taps:
        w = w.contiguous()  # the window kernels read the filter's taps along W as contiguous (kernels/direct.py)
    y = out if direction is Direction.FORWARD else ops.dy
    dims = {"D": p.padded3(p.input_size, 1), "O": p.padded3(p.output_size, 1), "F": p.padded3(p.filter_size, 1)}
    stride, pad, dil = p.padded3(p.stride, 1), p.padded3(p.padding, 0), p.padded3(p.dilation, 1)
    taps = math.prod(p.filter_size)
    split = splits(config)
    workspace, zeroed = _workspace(config, p, taps, out.device) if split else (None, ())
    if flat_data_gradient(config):  # the column matrix [G, taps x C/G, output pixels]
        workspace = torch.empty(p.groups * p.n * math.prod(p.output_size) * taps * p.c_per_group,
                                dtype=torch.float32, device=out.device)
    dummy = out  # stands in for absent pointers; the kernel never reads them (constexpr flags off)
    bound = {
        "x_ptr": x, "w_ptr": w, "y_ptr": y,
        "bias_ptr": ops.bias if ops.bias is not None else dummy,
        "res_ptr": ops.residual if ops.residual is not None else dummy,
        "ws_ptr": workspace if workspace is not None else dummy,
        "N": p.n, "G": p.groups, "CG": p.c_per_group, "KG": p.k_per_group,
        **dict(zip(("D", "H", "W"), dims["D"])), **dict(zip(("OD", "OH", "OW"), dims["O"])),
        **dict(zip(("FZ", "FY", "FX"), dims["F"])), **dict(zip(("SD", "SH", "SW"), stride)),
        **dict(zip(("PD", "PH", "PW"), pad)), **dict(zip(("DD", "DH", "DW"), dil)),
        **dict(zip(STRIDES[0:4], _strides(x))), **dict(zip(STRIDES[4:8], _strides(w))),
        **dict(zip(STRIDES[8:12], _strides(y))), **dict(zip(STRIDES[12:16], _strides(ops.residual))),
    }
    units = kernel_units(config, p.specialization)
    grid = _grid(config, p, taps)
    if grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
        raise InvalidProblemError(f"{config.name} needs a grid of {grid} programs for this conv; axes 1 and 2 "
                                  f"are limited to {MAX_GRID_YZ}: use fewer groups or another kernel")
    launches = [Launch("main", grid, _values(units[0], bound))]
    if split:
        launches.append(_reduce_launch(units[1], workspace, w, p, taps))
    if flat_data_gradient(config):
        phase_pixels = p.n * math.prod(triton.cdiv(size, s) for size, s in zip(p.input_size, p.stride))
        launches.append(Launch("col2im", (triton.cdiv(phase_pixels, COL2IM_BLOCK_PIXELS), p.groups,
                                          math.prod(p.stride)), _values(units[1], bound)))
    return Plan(tuple(launches), out, zeroed, _made(workspace))


def _made(*tensors) -> tuple:
    """The plan's scratch (`Plan.scratch`): the tensors it made, None for those it did not need."""
    return tuple(t for t in tensors if t is not None)


def _workspace(config: ImplicitGemmConfig | TmaConfig | DirectConfig, p, taps: int,
               device) -> tuple[torch.Tensor, tuple]:
    """A split backward-weight's fp32 workspace, and the plan's `zeroed`. A split into one slab is
    atomic adds, which need it made as zeros (on every replay too); slabs written whole need nothing."""
    slabs = config.workspace_slabs
    size = slabs * p.k * taps * p.c_per_group
    if slabs == 1:
        workspace = torch.zeros(size, dtype=torch.float32, device=device)
        return workspace, (workspace,)
    return torch.empty(size, dtype=torch.float32, device=device), ()


def _padded_plan(config: ImplicitGemmConfig, ops: ConvOperands, out: torch.Tensor) -> Plan:
    """x (and forward's w) copied with C padded to whole 16-byte vectors, the unpadded config's plan on
    the copies, and backward-weight's dw cut back to the real channels."""
    p = ops.problem
    padded = p.channels_padded()
    pad = kernel_units(config, p.specialization)[0]
    dtype, device = p.types.dtype.torch, ops.device
    x = channels_last_empty((p.n, padded.c, *p.input_size), dtype, device)
    launches = [_pad_launch(pad, ops.x, x)]
    w, inner_out = ops.w, out
    if p.direction is Direction.FORWARD:
        w = channels_last_empty((p.k, padded.c, *p.filter_size), dtype, device)
        launches.append(_pad_launch(pad, ops.w, w))
    else:
        inner_out = channels_last_empty((p.k, padded.c, *p.filter_size), dtype, device)
    inner = plan(replace(config, pad_channels=False), replace(ops, problem=padded, x=x, w=w, out=inner_out))
    launches += inner.launches
    if p.direction is Direction.BWD_WEIGHT:
        launches.append(Launch("unpad", (1, 1, 1), (inner_out, out)))
    made = (x, w if p.direction is Direction.FORWARD else inner_out)
    return Plan(tuple(launches), out, inner.zeroed, _made(*made) + inner.scratch)


def _pad_launch(unit: KernelUnit, src: torch.Tensor, dst: torch.Tensor) -> Launch:
    """A pad stage: src (A, C, *spatial) into dst (A, CP, *spatial), both channel stride 1."""
    d, h, w = (1,) * (5 - src.dim()) + tuple(src.shape[2:])
    rows = src.shape[0] * d * h * w
    bound = {"src_ptr": src, "dst_ptr": dst, "ROWS": rows, "D": d, "H": h, "W": w, "C": src.shape[1],
             "CP": dst.shape[1], **dict(zip(("ssn", "ssd", "ssh", "ssw"), _strides(src))),
             **dict(zip(("sdn", "sdd", "sdh", "sdw"), _strides(dst)))}
    return Launch("pad", (triton.cdiv(rows, PAD_BLOCK_ROWS), 1, 1), _values(unit, bound))


def _reduce_launch(unit: KernelUnit, workspace: torch.Tensor, w: torch.Tensor, p, taps: int) -> Launch:
    """The second stage of a split backward-weight: the workspace slabs summed into dw."""
    total = p.k * taps * p.c_per_group
    _fz, fy, fx = p.padded3(p.filter_size, 1)
    bound = {"ws_ptr": workspace, "w_ptr": w, "TOTAL": total, "CG": p.c_per_group, "TAPS": taps,
             "FY": fy, "FX": fx, **dict(zip(("swk", "swz", "swy", "swx"), _strides(w)))}
    return Launch("reduce", (triton.cdiv(total, REDUCE_BLOCK), 1, 1), _values(unit, bound))


def _tma_plan(config: TmaConfig, ops: ConvOperands, out: torch.Tensor) -> Plan:
    p = ops.problem
    taps = math.prod(p.filter_size)
    split = splits(config)
    workspace, zeroed = _workspace(config, p, taps, out.device) if split else (None, ())
    units = kernel_units(config, p.specialization)
    grid = _tma_grid(config, p, taps)
    if grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
        raise InvalidProblemError(f"{config.name} needs a grid of {grid} programs for this conv; axes 1 and 2 "
                                  f"are limited to {MAX_GRID_YZ}: use fewer groups or another kernel")
    launches = [Launch("main", grid, _values(units[0], _tma_bound(config, ops, out, workspace)))]
    if split:
        launches.append(_reduce_launch(units[1], workspace, out, p, taps))
    return Plan(tuple(launches), out, zeroed, _made(workspace))


def _tma_grid(config: TmaConfig, p, taps: int) -> tuple[int, int, int]:
    cdiv = triton.cdiv
    if p.direction is Direction.BWD_DATA:  # the forward's grid over dx
        p = p.data_gradient_as_forward()
    od, oh, ow = p.padded3(p.output_size, 1)
    if p.direction is Direction.FORWARD:
        boxes = p.n * od * cdiv(oh, config.tile_h) * cdiv(ow, config.tile_w)
        return (boxes * cdiv(p.k_per_group, config.block_out), p.groups, 1)
    tiles = cdiv(p.k_per_group, config.block_out) * cdiv(p.c_per_group, config.block_in)
    return (taps * tiles, p.groups, config.split_k)


# -- the toeplitz family: the Gluon walk (and, for backward-weight, the sum of its slabs) ----------
TOEPLITZ_STRIDES = ("sxn", "sxh", "sxw", "syn", "syh", "syw", "srn", "srh", "srw")
TOEPLITZ_FILTER_STRIDES = ("swk", "swy", "swx")  # the weight [C, 1, FY, FX]


def _toeplitz_units(config: ToeplitzConfig, specialization: ConvSpecialization,
                    arch: arch_facts.ArchInfo | None) -> tuple[KernelUnit, ...]:
    """Forward and backward-data: the walk, which builds its banded filters itself. Backward-weight:
    the walk into the workspace, then weight_reduce's sum of its slabs."""
    t = config.signature.types.dtype.triton
    k = toeplitz_kernels
    direction = config.signature.direction
    vector = 16 // config.signature.types.dtype.itemsize
    walk = {"BLOCK_M": config.block_m, "BLOCK_C": config.block_c, "ROWS": config.rows,
            "FILTER_ROWS": config.filter_rows, "KW": k.KW, "NW": k.NW, "VEC": vector}
    if direction is Direction.BWD_WEIGHT:
        walk |= {"SPLIT_K": config.split_k}
        tensors = [("x_ptr", f"*{t}"), ("y_ptr", f"*{t}"), ("ws_ptr", "*fp32")]
        scalars = ("N", "C", "H", "W", "OH", "OW", "FX", "PH", "PW")
        strides = TOEPLITZ_STRIDES[:6]
        aligned = (("x_ptr", 16), ("y_ptr", 16))
        function = "conv_depthwise_toeplitz_weight"
    else:
        epilogue = config.signature.epilogue
        walk |= {"FLIP": direction is Direction.BWD_DATA,
                 "HAS_BIAS": epilogue.bias, "ACTIVATION": ACTIVATION_CODES[epilogue.activation],
                 "HAS_RESIDUAL": epilogue.residual}
        tensors = [(n, f"*{t}") for n in ("x_ptr", "w_ptr", "y_ptr", "bias_ptr", "res_ptr")]
        scalars = ("N", "C", "H", "W", "OH", "OW", "FX", "PH", "PW")
        strides = TOEPLITZ_FILTER_STRIDES + TOEPLITZ_STRIDES
        aligned = (("x_ptr", 16), ("y_ptr", 16), ("res_ptr", 16))
        function = "conv_depthwise_toeplitz"
    signature = (tensors + [(n, "i32") for n in scalars] + [(n, "i64") for n in strides]
                 + [(n, "constexpr") for n in walk])
    # Unaligned data is refused (rules.supports): channels move as 16-byte vectors.
    divisibility = (aligned + tuple((n, vector) for n in strides if n not in TOEPLITZ_FILTER_STRIDES)
                    + (("C", vector),)) if specialization.aligned else ()
    main = KernelUnit(
        stage="main", module=_TOEPLITZ_MODULE, function=function, signature=tuple(signature),
        constexprs=tuple(sorted(walk.items())), num_warps=config.num_warps, num_stages=1,
        divisibility=divisibility, kind=UnitKind.GLUON,
        max_registers=toeplitz_register_cap(config, _target(arch).registers_per_sm))
    if direction is Direction.BWD_WEIGHT:
        return main, _reduce_unit(config, specialization)
    return (main,)


def _toeplitz_plan(config: ToeplitzConfig, ops: ConvOperands, out: torch.Tensor) -> Plan:
    """Forward: the walk over x. Backward-data walks dy into dx with the filter flipped (the walk's
    FLIP) and padding F - 1 - P (stride and dilation are 1). Backward-weight walks x and dy into
    fp32 slabs, then sums them into dw."""
    p = ops.problem
    k = toeplitz_kernels
    fy, fx = p.filter_size
    units = kernel_units(config, p.specialization)
    if p.direction is Direction.BWD_WEIGHT:
        (out_h, out_w), (in_h, in_w), (pad_h, pad_w) = p.output_size, p.input_size, p.padding
        workspace = torch.empty(config.split_k * p.c * fy * fx, dtype=torch.float32, device=out.device)
        bound = {"x_ptr": ops.x, "y_ptr": ops.dy, "ws_ptr": workspace, "N": p.n, "C": p.c, "H": in_h, "W": in_w,
                 "OH": out_h, "OW": out_w, "FX": fx, "PH": pad_h, "PW": pad_w,
                 **dict(zip(TOEPLITZ_STRIDES, (ops.x.stride(0), ops.x.stride(2), ops.x.stride(3),
                                               ops.dy.stride(0), ops.dy.stride(2), ops.dy.stride(3))))}
        grid = (triton.cdiv(p.c, config.block_c), config.split_k, 1)
        return Plan((Launch("main", grid, _values(units[0], bound)),
                     _reduce_launch(units[1], workspace, out, p, fy * fx)), out, scratch=(workspace,))
    walk = ToeplitzWalk.of(p)
    src = ops.x if p.direction is Direction.FORWARD else ops.dy
    w = ops.w
    (in_h, in_w), (out_h, out_w), (pad_h, pad_w) = walk.source, walk.output, walk.padding
    res_n, _, res_h, res_w = _strides(ops.residual)
    walk_bound = {"x_ptr": src, "w_ptr": w, "y_ptr": out, "bias_ptr": ops.bias, "res_ptr": ops.residual,
                  "N": p.n, "C": p.c, "H": in_h, "W": in_w, "OH": out_h, "OW": out_w, "FX": fx,
                  "PH": pad_h, "PW": pad_w, "swk": w.stride(0), "swy": w.stride(2), "swx": w.stride(3),
                  **dict(zip(TOEPLITZ_STRIDES, (src.stride(0), src.stride(2), src.stride(3), out.stride(0),
                                                out.stride(2), out.stride(3), res_n, res_h, res_w)))}
    grid = (triton.cdiv(p.n * triton.cdiv(out_w, k.NW), config.block_m), triton.cdiv(p.c, config.block_c),
            triton.cdiv(out_h, config.rows))
    return Plan((Launch("main", grid, _values(units[0], walk_bound)),), out)


def _grid(config: ImplicitGemmConfig | DirectConfig, p, taps: int) -> tuple[int, int, int]:
    cdiv = triton.cdiv
    pixels_out = p.n * math.prod(p.output_size)
    pixels_in = p.n * math.prod(p.input_size)
    d = p.direction
    if isinstance(config, ImplicitGemmConfig):
        bm, bn, merged = config.block_m, config.block_n, config.groups_per_tile
        if config.family is Family.IMPLICIT_GEMM_FLAT and d is Direction.BWD_DATA:  # M = output pixels, N = j
            return (cdiv(pixels_out, bm) * cdiv(taps * p.c_per_group, bn), p.groups, 1)
        if config.family is Family.IMPLICIT_GEMM_FLAT and d is Direction.BWD_WEIGHT:  # N = every tap's channels
            return (cdiv(p.k_per_group, bm) * cdiv(taps * p.c_per_group, bn), p.groups, config.split_k)
        if d is Direction.FORWARD:
            return (cdiv(pixels_out, bm) * cdiv(merged * p.k_per_group, bn), cdiv(p.groups, merged), 1)
        if d is Direction.BWD_DATA:  # axis 2: the stride's phases, each its own share of the input pixels
            per_phase = p.n * math.prod(cdiv(size, s) for size, s in zip(p.input_size, p.stride))
            return (cdiv(per_phase, bm) * cdiv(merged * p.c_per_group, bn), cdiv(p.groups, merged),
                    math.prod(p.stride))
        return (taps * cdiv(p.k_per_group, bm) * cdiv(p.c_per_group, bn), p.groups, config.split_k)
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
