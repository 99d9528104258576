"""What to compile for a conv config, and how to launch it on checked operands.

`kernel_units` and `plan` ask the config's family (`FAMILIES`). What several families
share is here: every pointer-based Triton kernel of the op takes one argument list
(tensors, 3-D geometry, strides of the non-channel dims), so one unit builder
(`pointer_unit`) and one plan (`pointer_plan`) serve the igemm, igemm-flat and direct
families in all directions; a split backward-weight adds the `conv_weight_reduce` stage
(`reduce_unit`, `reduce_launch`) whatever family wrote its slabs.
"""

from __future__ import annotations

import functools
import math

import torch

from ... import arch as arch_facts
from ...core.arith import cdiv
from ...core.errors import InvalidProblemError
from ...core.launch import Launch, Plan
from ...core.op import KernelUnit, UnitKind
from ..gemm import ACTIVATION_CODES
from .operands import ConvOperands, channels_last_empty
from .problem import ConvSpecialization, Direction
from .signature import FAMILIES, ConvSignature

KERNELS = "tiledispatch.ops.conv.kernels"
_REDUCE_MODULE = f"{KERNELS}.weight_reduce"
TENSORS = ("x_ptr", "w_ptr", "y_ptr", "bias_ptr", "res_ptr", "ws_ptr")
ALIGNED_TENSORS = tuple(n for n in TENSORS if n != "bias_ptr")  # 16-byte aligned where the data is
GEOMETRY = ("N", "G", "CG", "KG", "D", "H", "W", "OD", "OH", "OW", "FZ", "FY", "FX",
            "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW")
STRIDES = ("sxn", "sxd", "sxh", "sxw", "swk", "swz", "swy", "swx", "syn", "syd", "syh", "syw",
           "srn", "srd", "srh", "srw")
# The split reductions' block: an element a thread. At 1K elements a program the depthwise
# layers' dw (C x taps: 3.5K-19K values) made 4-19 programs, latency-bound (ncu: 5.3 us on the
# suite's 5x5); at 128 their walks ran 4-9 % faster and the dense splits 2-4 % (H100,
# benchmarks/results/h100/conv_reduce_block_ab.csv).
REDUCE_BLOCK = 128
MAX_GRID_YZ = 65535
ALIGNED = ConvSpecialization()


def target(arch: arch_facts.ArchInfo | None) -> arch_facts.ArchInfo:
    """The arch a unit is built for: `arch`, or where none is named, the one the Gluon families are
    written for (the known arch with warpgroup MMA), whose register file sizes the caps."""
    if arch is not None:
        return arch
    return next(a for a in map(arch_facts.load, arch_facts.available()) if a.has(arch_facts.Feature.WGMMA))


def epilogue_constexprs(sig: ConvSignature) -> dict:
    """The forward epilogue's flags, as every kernel with one takes them (in this order)."""
    return {"HAS_BIAS": sig.epilogue.bias, "ACTIVATION": ACTIVATION_CODES[sig.epilogue.activation],
            "HAS_RESIDUAL": sig.epilogue.residual}


def pointer_unit(config, module: str, function: str, constexprs: dict, *, aligned_pointers: tuple,
                 num_stages: int, max_registers: int | None = None) -> KernelUnit:
    """The main stage of a pointer-based kernel: the op's argument list, then `constexprs` in the
    kernel's parameter order."""
    t = config.signature.types.dtype.triton
    pointer = {"ws_ptr": "*fp32"}
    signature = ([(name, pointer.get(name, f"*{t}")) for name in TENSORS] + [(n, "i32") for n in GEOMETRY]
                 + [(n, "i64") for n in STRIDES])
    return KernelUnit(
        stage="main", module=module, function=function,
        signature=tuple(signature + [(name, "constexpr") for name in constexprs]),
        constexprs=tuple(sorted(constexprs.items())), num_warps=config.num_warps, num_stages=num_stages,
        divisible_by_16=aligned_pointers, max_registers=max_registers,
    )


def reduce_unit(config, specialization: ConvSpecialization) -> KernelUnit:
    """A split backward-weight's second stage: its fp32 slabs summed into dw (kernels/weight_reduce.py)."""
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


def python_unit(stage: str, module: str, function: str, arguments: tuple[str, ...]) -> KernelUnit:
    """A stage that runs a Python function (`module.function(*arguments)`) instead of a kernel."""
    return KernelUnit(stage=stage, module=module, function=function,
                      signature=tuple((name, "python") for name in arguments),
                      constexprs=(), num_warps=0, num_stages=0, kind=UnitKind.PYTHON)


def splits(config) -> bool:
    """Whether a config with a split adds a reduction stage (backward-weight split over pixels)."""
    return config.signature.direction is Direction.BWD_WEIGHT and config.split_k > 1


@functools.lru_cache(maxsize=4096)  # called on every launch: the plan reads the signature
def kernel_units(config, specialization: ConvSpecialization = ALIGNED,
                 arch: arch_facts.ArchInfo | None = None) -> tuple[KernelUnit, ...]:
    """What `config` compiles and runs for `specialization` on `arch` (None: `target`'s)."""
    return FAMILIES.of(config).kernel_units(config, specialization, arch)


def plan(config, ops: ConvOperands) -> Plan:
    """The launches of `config` over checked operands, by its family."""
    return FAMILIES.of(config).plan(config, ops)


def bound_values(unit: KernelUnit, bound: dict) -> tuple:
    """A unit's arguments in its signature's order: `bound` by name, the rest its constexprs."""
    constants = dict(unit.constexprs)
    return tuple(bound[name] if name in bound else constants[name] for name, _ in unit.signature)


def dim_strides(t: torch.Tensor | None) -> tuple[int, int, int, int]:
    """(outer, d, h, w) strides of an (A, B, *spatial) tensor; a missing spatial dim has index 0 and stride 0."""
    if t is None:
        return (0, 0, 0, 0)
    spatial = tuple(t.stride()[2:])
    return (t.stride(0), *((0,) * (3 - len(spatial)) + spatial))


def output_tensor(ops: ConvOperands) -> torch.Tensor:
    return ops.out if ops.out is not None else channels_last_empty(
        ops.output_shape(), ops.problem.types.dtype.torch, ops.device)


def made(*tensors) -> tuple:
    """The plan's scratch (`Plan.scratch`): the tensors it made, None for those it did not need."""
    return tuple(t for t in tensors if t is not None)


def split_workspace(config, p, taps: int, device) -> tuple[torch.Tensor, tuple]:
    """A split backward-weight's fp32 workspace, and the plan's `zeroed`. A split into one slab is
    atomic adds, which need it made as zeros (on every replay too); slabs written whole need nothing."""
    slabs = config.workspace_slabs
    size = slabs * p.k * taps * p.c_per_group
    if slabs == 1:
        workspace = torch.zeros(size, dtype=torch.float32, device=device)
        return workspace, (workspace,)
    return torch.empty(size, dtype=torch.float32, device=device), ()


def reduce_launch(unit: KernelUnit, workspace: torch.Tensor, w: torch.Tensor, p, taps: int) -> Launch:
    """The second stage of a split backward-weight: the workspace slabs summed into dw."""
    total = p.k * taps * p.c_per_group
    _fz, fy, fx = p.padded3(p.filter_size, 1)
    bound = {"ws_ptr": workspace, "w_ptr": w, "TOTAL": total, "CG": p.c_per_group, "TAPS": taps,
             "FY": fy, "FX": fx, **dict(zip(("swk", "swz", "swy", "swx"), dim_strides(w)))}
    return Launch("reduce", (cdiv(total, REDUCE_BLOCK), 1, 1), bound_values(unit, bound))


def checked_grid(config, grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """`grid`, refused where its axes 1 or 2 pass what CUDA launches."""
    if grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
        raise InvalidProblemError(f"{config.name} needs a grid of {grid} programs for this conv; axes 1 and 2 "
                                  f"are limited to {MAX_GRID_YZ}: use fewer groups or another kernel")
    return grid


def pointer_plan(config, ops: ConvOperands, out: torch.Tensor, grid_of, *, contiguous_taps: bool = False,
                 columns: int = 0, then=None) -> Plan:
    """The plan of a pointer-based kernel: its main launch over `grid_of(config, p, taps)`, and a
    split's reduce. `contiguous_taps`: the kernel reads the filter's taps along W as contiguous (a
    filter that is not is copied). `columns`: fp32 elements of a scratch the main stage writes for a
    later one, `then(units, bound)` that stage's launch."""
    p = ops.problem
    direction = p.direction
    x = out if direction is Direction.BWD_DATA else ops.x
    w = out if direction is Direction.BWD_WEIGHT else ops.w
    reads_taps = direction is not Direction.BWD_WEIGHT  # backward-weight's window kernel stores dw by its strides
    if contiguous_taps and w.stride(-1) != 1 and reads_taps:
        w = w.contiguous()
    y = out if direction is Direction.FORWARD else ops.dy
    dims = {"D": p.padded3(p.input_size, 1), "O": p.padded3(p.output_size, 1), "F": p.padded3(p.filter_size, 1)}
    stride, pad, dil = p.padded3(p.stride, 1), p.padded3(p.padding, 0), p.padded3(p.dilation, 1)
    taps = math.prod(p.filter_size)
    split = splits(config)
    workspace, zeroed = split_workspace(config, p, taps, out.device) if split else (None, ())
    if columns:
        workspace = torch.empty(columns, dtype=torch.float32, device=out.device)
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
        **dict(zip(STRIDES[0:4], dim_strides(x))), **dict(zip(STRIDES[4:8], dim_strides(w))),
        **dict(zip(STRIDES[8:12], dim_strides(y))), **dict(zip(STRIDES[12:16], dim_strides(ops.residual))),
    }
    units = kernel_units(config, p.specialization)
    grid = checked_grid(config, grid_of(config, p, taps))
    launches = [Launch("main", grid, bound_values(units[0], bound))]
    if split:
        launches.append(reduce_launch(units[1], workspace, w, p, taps))
    if then is not None:
        launches.append(then(units, bound))
    return Plan(tuple(launches), out, zeroed, made(workspace))
