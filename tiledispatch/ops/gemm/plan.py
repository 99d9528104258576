"""What to compile for a GEMM config, and how to launch it on given operands.

`kernel_units` and `plan` ask the config's family (``families/``). The helpers below are what
the families share: a compiled signature in which a stride that the layout makes 1 becomes a
compile-time constant (contiguous loads) and every other stride is a 64-bit argument (no
overflow on large tensors); what the data's alignment lets the compiler assume; split-K's
workspace and reduction stage; tensor descriptors and the persistent grid of the TMA families.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable

import torch

from ... import arch as arch_facts
from ...core.arith import cdiv
from ...core.errors import InvalidProblemError
from ...core.launch import Launch, Plan
from ...core.op import KernelUnit
from .config import AnyGemmConfig, GemmConfig
from .family import FAMILIES
from .operands import GemmOperands
from .problem import VECTOR_BYTES, Activation, Align, Alignment, GemmProblem, GemmTypes, Layout

ACTIVATION_CODES = {Activation.NONE: 0, Activation.RELU: 1, Activation.GELU: 2, Activation.SILU: 3}
KERNELS = "tiledispatch.ops.gemm.kernels"  # the package of the kernel files
_REDUCE_MODULE = f"{KERNELS}.splitk_reduce"
MAX_GRID_YZ = 65535
EPILOGUE_STRIDES = (("stride_bias", "i64"), ("stride_rb", "i64"), ("stride_rm", "i64"), ("stride_rn", "i64"))


@functools.lru_cache(maxsize=4096)  # called on every launch: the plan reads the signature
def kernel_units(config: AnyGemmConfig, alignment: Alignment = Alignment(),
                 arch: arch_facts.ArchInfo | None = None) -> tuple[KernelUnit, ...]:
    """What `config` compiles and runs for `alignment` on `arch` (None: the arch its family is written for)."""
    return FAMILIES.of(config).kernel_units(config, alignment, arch)


def plan(config: AnyGemmConfig, ops: GemmOperands, out: torch.Tensor | None = None) -> Plan:
    """The launches of `config` on `ops`, into `out` (None: `ops.out`, or a new tensor)."""
    p = ops.problem
    if p.batch > MAX_GRID_YZ:
        raise InvalidProblemError(f"batch {p.batch} exceeds the grid limit {MAX_GRID_YZ}; split the batch")
    if out is not None and out is not ops.out:
        ops = replace(ops, out=out)
    return FAMILIES.of(config).plan(config, ops)


def output(ops: GemmOperands) -> torch.Tensor:
    """The caller's output, or a new (batch, M, N) tensor."""
    p = ops.problem
    return ops.out if ops.out is not None else torch.empty(
        (p.batch, p.m, p.n), dtype=p.types.c.torch, device=ops.a.device)


# --- compiled signatures -------------------------------------------------------------------

def unit_strides(prefix: str, layout: Layout, dims: tuple[str, str]) -> list[tuple[str, str]]:
    """Batch, row and column stride arguments; the contiguous one (if any) is a constant 1."""
    unit = {Layout.ROW: dims[1], Layout.COL: dims[0]}.get(layout)
    return [(f"{prefix}b", "i64")] + [(f"{prefix}{d}", "constexpr" if d == unit else "i64") for d in dims]


def epilogue_constexprs(config: GemmConfig) -> dict:
    return {
        "SCALED": config.types.scaled,
        "HAS_BIAS": config.epilogue.bias,
        "ACTIVATION": ACTIVATION_CODES[config.epilogue.activation],
        "HAS_RESIDUAL": config.epilogue.residual,
    }


def divisibility(alignment: Alignment, types: GemmTypes, signature, split: bool) -> tuple[tuple[str, int], ...]:
    """What divides each pointer, stride and size argument, as far as the data's alignment says.

    Pointers of aligned operands are 16-byte aligned; their strides and the sizes are
    multiples of 16 elements (ELEMS16) or of 16 bytes (BYTES16: 8 bf16 elements, 4 fp32).
    With these the compiler proves 16-byte vector loads and stores, edge masks included
    (a mask against K keeps runs of K's divisor). The split-K workspace is ours: fp32,
    contiguous, 16-byte aligned. Bias and residual are read without vectors.
    """
    operands = {"a": (alignment.a, types.a.itemsize), "b": (alignment.b, types.b.itemsize),
                "c": (Align.ELEMS16, 4) if split else (alignment.c, types.c.itemsize)}
    sizes = {"M": alignment.m, "N": alignment.n, "K": alignment.k}
    found = []
    for name, kind in signature:
        if kind == "constexpr":
            continue
        if name in sizes:
            found.append((name, sizes[name].divisor(types.itemsize_along(name))))
        elif name[:2] in ("a_", "b_", "c_") and name.endswith("_ptr") and operands[name[0]][0]:
            found.append((name, VECTOR_BYTES))  # an address, in bytes
        elif name[:8] in ("stride_a", "stride_b", "stride_c") and name != "stride_bias":
            level, itemsize = operands[name[7]]
            found.append((name, level.divisor(itemsize)))
    return tuple((name, d) for name, d in found if d > 1)


def _pointer_arguments(config: GemmConfig) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The pointer families' arguments before their constexprs: pointers and sizes, then strides
    (a split-K workspace is written at strides of its own)."""
    t, layout = config.types, config.layout
    split = config.split_k > 1
    c_type = "*fp32" if split else f"*{t.c.triton}"
    args = [("a_ptr", f"*{t.a.triton}"), ("b_ptr", f"*{t.b.triton}"), ("c_ptr", c_type),
            ("bias_ptr", f"*{t.c.triton}"), ("res_ptr", f"*{t.c.triton}"),
            ("scale_a_ptr", "*fp32"), ("scale_b_ptr", "*fp32"), ("M", "i32"), ("N", "i32"), ("K", "i32")]
    strides = (unit_strides("stride_a", layout.a, ("m", "k")) + unit_strides("stride_b", layout.b, ("k", "n"))
               + unit_strides("stride_c", Layout.STRIDED if split else layout.c, ("m", "n")))
    return args, strides


def pointer_unit(config: GemmConfig, alignment: Alignment, module: str, function: str, constexprs: dict) -> KernelUnit:
    """The main stage of a pointer family (operands by pointer loads): `function` of `module`."""
    args, strides = _pointer_arguments(config)
    constexprs = {**constexprs, **{name: 1 for name, kind in strides if kind == "constexpr"}}
    signature = (args + strides + list(EPILOGUE_STRIDES)
                 + [(name, "constexpr") for name in constexprs if not name.startswith("stride")])
    return KernelUnit(
        stage="main", module=module, function=function,
        signature=tuple(signature), constexprs=tuple(sorted(constexprs.items())),
        num_warps=config.num_warps, num_stages=config.num_stages,
        divisibility=divisibility(alignment, config.types, signature, config.split_k > 1),
    )


def reduce_block(split_k: int) -> tuple[int, int]:
    """The reduction's tile: rows of 64 columns, fewer rows the more slabs each sums.

    Each program reads split_k slabs of its tile; at most ~64 KB per program keeps the
    pass spread over many SMs when the output is small (a 64x64 output split 64 ways
    would otherwise be summed by two programs).
    """
    rows = max(1, min(32, 256 // split_k))
    return 1 << (rows.bit_length() - 1), 64


def _reduce_unit(config: GemmConfig, alignment: Alignment) -> KernelUnit:
    """The split-K reduction stage, the same for every family: the workspace is [batch, split, M, N]."""
    t = config.types
    reduce_strides = unit_strides("stride_c", config.layout.c, ("m", "n"))
    block_m, block_n = reduce_block(config.split_k)
    reduce_constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": config.split_k,
                         **epilogue_constexprs(config)}
    reduce_constexprs.update({name: 1 for name, kind in reduce_strides if kind == "constexpr"})
    reduce_signature = ([("ws_ptr", "*fp32"), ("c_ptr", f"*{t.c.triton}"), ("bias_ptr", f"*{t.c.triton}"),
                         ("res_ptr", f"*{t.c.triton}"), ("scale_a_ptr", "*fp32"), ("scale_b_ptr", "*fp32"),
                         ("M", "i32"), ("N", "i32")] + reduce_strides + list(EPILOGUE_STRIDES)
                        + [(n, "constexpr") for n in reduce_constexprs if not n.startswith("stride")])
    return KernelUnit(
        stage="reduce", module=_REDUCE_MODULE, function="splitk_reduce",
        signature=tuple(reduce_signature), constexprs=tuple(sorted(reduce_constexprs.items())),
        num_warps=4, num_stages=1,
        divisibility=divisibility(replace(alignment, a=False, b=False), t, reduce_signature, False)
        + (("ws_ptr", VECTOR_BYTES),),
    )


def with_reduce(config: GemmConfig, alignment: Alignment, main: KernelUnit) -> tuple[KernelUnit, ...]:
    """`main`, and split-K's reduction stage where the config splits K."""
    return (main, _reduce_unit(config, alignment)) if config.split_k > 1 else (main,)


def descriptor_blocks(config: GemmConfig, rows: int | None = None) -> dict[str, tuple[int, int, int]]:
    """The block each descriptor moves: one matrix of the batch, its contiguous dim last; A's and
    C's cover `rows` rows (None: the tile's block_m)."""
    bm = config.block_m if rows is None else rows
    bn, bk = config.block_n, config.block_k
    return {
        "a_desc": (1, bm, bk) if config.layout.a is Layout.ROW else (1, bk, bm),
        "b_desc": (1, bn, bk) if config.layout.b is Layout.COL else (1, bk, bn),
        "c_desc": (1, bm, bn // config.epilogue_split),
    }


# --- launches ------------------------------------------------------------------------------

def values(unit: KernelUnit, bound: dict) -> tuple:
    """The unit's arguments in signature order, constexprs included (the launcher skips them)."""
    constants = dict(unit.constexprs)
    return tuple(bound[name] if name in bound else constants[name] for name, _ in unit.signature)


def _batch_stride(t: torch.Tensor) -> int:
    """Broadcast operands (batch 1 against batch > 1) are read with a zero batch stride."""
    return 0 if t.shape[0] == 1 else t.stride(0)


def epilogue_args(ops: GemmOperands) -> dict:
    """The epilogue's operands and the sizes, as every Triton family's stages take them.

    Absent operands go as None, a null pointer: the kernel never reads them (constexpr flags off),
    and Triton's launcher takes None without the data_ptr() call and driver query of a tensor.
    """
    p, res = ops.problem, ops.residual
    return {
        "bias_ptr": ops.bias, "res_ptr": res, "scale_a_ptr": ops.scale_a, "scale_b_ptr": ops.scale_b,
        "stride_bias": ops.bias.stride(0) if ops.bias is not None else 0,
        "stride_rb": _batch_stride(res) if res is not None else 0,
        "stride_rm": res.stride(1) if res is not None else 0,
        "stride_rn": res.stride(2) if res is not None else 0,
        "M": p.m, "N": p.n,
    }


def _workspace(config: GemmConfig, p: GemmProblem, out: torch.Tensor) -> torch.Tensor | None:
    """Split-K's fp32 partial sums, one [M, N] slab per batch and split; None without split."""
    if config.split_k == 1:
        return None
    return torch.empty((p.batch, config.split_k, p.m, p.n), dtype=torch.float32, device=out.device)


def _reduce_launch(config: GemmConfig, unit: KernelUnit, workspace: torch.Tensor, out: torch.Tensor,
                   epilogue: dict) -> Launch:
    batch, _, m, n = workspace.shape
    block_m, block_n = reduce_block(config.split_k)
    grid = (cdiv(m, block_m), cdiv(n, block_n), batch)
    if grid[1] > MAX_GRID_YZ:
        raise InvalidProblemError(f"N={n} is too large for the split-K reduction grid; use split_k=1")
    bound = {**epilogue, "ws_ptr": workspace, "c_ptr": out,
             "stride_cb": out.stride(0), "stride_cm": out.stride(1), "stride_cn": out.stride(2)}
    return Launch("reduce", grid, values(unit, bound))


def pointer_plan(config: GemmConfig, ops: GemmOperands) -> Plan:
    """A pointer family's launches: one program per output tile and split, then split-K's reduction."""
    p, a, b = ops.problem, ops.a, ops.b
    out = output(ops)
    epilogue = epilogue_args(ops)
    units = kernel_units(config, p.alignment)
    workspace = _workspace(config, p, out)
    main_bound = {
        **epilogue,
        "a_ptr": a, "b_ptr": b, "c_ptr": out if workspace is None else workspace, "K": p.k,
        "stride_ab": _batch_stride(a), "stride_am": a.stride(1), "stride_ak": a.stride(2),
        "stride_bb": _batch_stride(b), "stride_bk": b.stride(1), "stride_bn": b.stride(2),
        # Split-K writes the workspace at its own (unused) strides: zeros, which divide by anything.
        **({"stride_cb": out.stride(0), "stride_cm": out.stride(1), "stride_cn": out.stride(2)}
           if workspace is None else {"stride_cb": 0, "stride_cm": 0, "stride_cn": 0}),
    }
    tiles = cdiv(p.m, config.block_m) * cdiv(p.n, config.block_n)
    launches = [Launch("main", (tiles, config.split_k, p.batch), values(units[0], main_bound))]
    if workspace is not None:
        launches.append(_reduce_launch(config, units[1], workspace, out, epilogue))
    return Plan(tuple(launches), out)


def _tensor_descriptor(t: torch.Tensor, contiguous_last: bool, block: tuple[int, int, int]):
    """A 3-D descriptor of `t` (batch, rows, cols), its unit-stride dim last.

    The base is `t` itself, whatever the view (only its address is read), so the fast
    path can find the operand a descriptor stands for. A dim of size one is never
    stepped over, so its stride is set to one the copy engine accepts (a 16-byte multiple).
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    view = t if contiguous_last else t.transpose(1, 2)
    shape = list(view.shape)
    strides = list(view.stride())
    strides[2] = 1
    if shape[1] == 1:
        strides[1] = cdiv(shape[2], 16) * 16
    if shape[0] == 1:
        strides[0] = strides[1] * shape[1]
    return TensorDescriptor(t, shape, strides, list(block))


@functools.lru_cache(maxsize=16)
def _programs(device: torch.device) -> int:
    """One persistent program per SM (a handful under the interpreter)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def whole_tiles(config: GemmConfig, p: GemmProblem, tiles: int, sms: int, device) -> tuple[int, dict, tuple]:
    """A persistent grid's schedule: (programs, scratch arguments, tensors to zero first). Here
    each program walks whole tiles (and splits), at most one program per SM."""
    return min(tiles * config.split_k, sms), {}, ()


Schedule = Callable[[GemmConfig, GemmProblem, int, int, torch.device], tuple[int, dict, tuple]]


def persistent_plan(config: GemmConfig, ops: GemmOperands, blocks: dict[str, tuple[int, int, int]],
                    schedule: Schedule = whole_tiles) -> Plan:
    """A TMA family's launches: descriptors of `blocks`, one program per SM over the tiles as
    `schedule` deals them, then split-K's reduction."""
    p = ops.problem
    out = output(ops)
    epilogue = epilogue_args(ops)
    workspace = _workspace(config, p, out)
    if workspace is None:
        c_desc = _tensor_descriptor(out, True, blocks["c_desc"])
    else:  # its slabs as one 3-D matrix stack; the base stays the 4-D workspace the reduction reads
        from triton.tools.tensor_descriptor import TensorDescriptor

        c_desc = TensorDescriptor(workspace, [p.batch * config.split_k, p.m, p.n], [p.m * p.n, p.n, 1],
                                  list(blocks["c_desc"]))
    bound = {
        **epilogue, "K": p.k, "batch": p.batch,
        # A broadcast operand (batch 1 against batch > 1) is read at batch coordinate 0.
        "a_batch_step": int(ops.a.shape[0] > 1), "b_batch_step": int(ops.b.shape[0] > 1),
        "a_desc": _tensor_descriptor(ops.a, config.layout.a is Layout.ROW, blocks["a_desc"]),
        "b_desc": _tensor_descriptor(ops.b, config.layout.b is Layout.ROW, blocks["b_desc"]),
        "c_desc": c_desc,
    }
    units = kernel_units(config, p.alignment)
    tiles = cdiv(p.m, config.block_m) * cdiv(p.n, config.block_n) * p.batch
    programs, scratch, zeroed = schedule(config, p, tiles, _programs(out.device), out.device)
    bound.update(scratch)
    launches = [Launch("main", (programs, 1, 1), values(units[0], bound))]
    if workspace is not None:
        launches.append(_reduce_launch(config, units[1], workspace, out, epilogue))
    return Plan(tuple(launches), out, zeroed)
