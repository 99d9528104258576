"""What to compile for a GEMM config, and how to launch it on given operands.

`kernel_units` fixes the compiled signature: a stride that the layout makes 1 becomes a
compile-time constant (contiguous loads), every other stride is a 64-bit argument (no
overflow on large tensors). `plan` binds the operands to one or two launches; a realign
config adds copies around them (`_realigned_plan`).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from ... import arch as arch_facts
from ...core.dtypes import DType
from ...core.errors import InvalidProblemError
from ...core.launch import Launch, Plan
from ...core.op import KernelUnit, UnitKind
from .config import AnyGemmConfig, Family, GemmConfig, VendorConfig
from .operands import GemmOperands
from .problem import VECTOR_BYTES, Activation, Align, Alignment, GemmTypes, Layout

ACTIVATION_CODES = {Activation.NONE: 0, Activation.RELU: 1, Activation.GELU: 2, Activation.SILU: 3}
FAMILY_MODULES = {
    Family.TILED: "tiledispatch.ops.gemm.kernels.tiled",
    Family.TMA_PERSISTENT: "tiledispatch.ops.gemm.kernels.tma_persistent",
    Family.STREAM_K: "tiledispatch.ops.gemm.kernels.stream_k",
    Family.GEMV: "tiledispatch.ops.gemm.kernels.gemv",
    Family.WS_PERSISTENT: "tiledispatch.ops.gemm.kernels.ws_persistent",
    Family.WS_PINGPONG: "tiledispatch.ops.gemm.kernels.ws_pingpong",
}
_TMA_FUNCTIONS = {Family.TMA_PERSISTENT: "gemm_tma_persistent", Family.STREAM_K: "gemm_stream_k"}
_REDUCE_MODULE = "tiledispatch.ops.gemm.kernels.splitk_reduce"
_REALIGN_MODULE = "tiledispatch.ops.gemm.kernels.realign"
_COPY_STRIDES = ("src_batch", "src_row", "dst_batch", "dst_row")
MAX_GRID_YZ = 65535
_EPILOGUE_STRIDES = (("stride_bias", "i64"), ("stride_rb", "i64"), ("stride_rm", "i64"), ("stride_rn", "i64"))


def _unit_strides(prefix: str, layout: Layout, dims: tuple[str, str]) -> list[tuple[str, str]]:
    """Batch, row and column stride arguments; the contiguous one (if any) is a constant 1."""
    unit = {Layout.ROW: dims[1], Layout.COL: dims[0]}.get(layout)
    return [(f"{prefix}b", "i64")] + [(f"{prefix}{d}", "constexpr" if d == unit else "i64") for d in dims]


def _epilogue_constexprs(config: GemmConfig) -> dict:
    return {
        "SCALED": config.types.scaled,
        "HAS_BIAS": config.epilogue.bias,
        "ACTIVATION": ACTIVATION_CODES[config.epilogue.activation],
        "HAS_RESIDUAL": config.epilogue.residual,
    }


def _divisibility(alignment: Alignment, types: GemmTypes, signature, split: bool) -> tuple[tuple[str, int], ...]:
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


@functools.lru_cache(maxsize=4096)  # called on every launch: the plan reads the signature
def kernel_units(config: AnyGemmConfig, alignment: Alignment = Alignment(),
                 arch: arch_facts.ArchInfo | None = None) -> tuple[KernelUnit, ...]:
    """What `config` compiles and runs for `alignment` on `arch` (None: the arch its family is written for)."""
    if isinstance(config, VendorConfig):
        return (_VENDOR_UNIT,)
    if config.realign:  # the copies, then its twin's stages on aligned buffers
        twin = kernel_units(replace(config, realign=False), alignment.realigned(), arch)
        return (*_realign_units(config, alignment), *twin)
    if config.family is Family.GEMV:
        return (_gemv_unit(config, alignment),)
    if config.family.warp_specialised:
        return (_ws_unit(config, alignment, arch),)
    main = _persistent_unit(config, alignment) if config.family.uses_tma else _tiled_unit(config, alignment)
    return (main, _reduce_unit(config, alignment)) if config.split_k > 1 else (main,)


def _pointer_arguments(config: GemmConfig) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The pointer families' arguments before their constexprs: pointers and sizes, then strides
    (a split-K workspace is written at strides of its own)."""
    t, layout = config.types, config.layout
    split = config.split_k > 1
    c_type = "*fp32" if split else f"*{t.c.triton}"
    args = [("a_ptr", f"*{t.a.triton}"), ("b_ptr", f"*{t.b.triton}"), ("c_ptr", c_type),
            ("bias_ptr", f"*{t.c.triton}"), ("res_ptr", f"*{t.c.triton}"),
            ("scale_a_ptr", "*fp32"), ("scale_b_ptr", "*fp32"), ("M", "i32"), ("N", "i32"), ("K", "i32")]
    strides = (_unit_strides("stride_a", layout.a, ("m", "k")) + _unit_strides("stride_b", layout.b, ("k", "n"))
               + _unit_strides("stride_c", Layout.STRIDED if split else layout.c, ("m", "n")))
    return args, strides


def _pointer_unit(config: GemmConfig, alignment: Alignment, function: str, constexprs: dict) -> KernelUnit:
    args, strides = _pointer_arguments(config)
    constexprs = {**constexprs, **{name: 1 for name, kind in strides if kind == "constexpr"}}
    signature = (args + strides + list(_EPILOGUE_STRIDES)
                 + [(name, "constexpr") for name in constexprs if not name.startswith("stride")])
    module = FAMILY_MODULES[config.family]
    return KernelUnit(
        stage="main", module=module, function=function,
        signature=tuple(signature), constexprs=tuple(sorted(constexprs.items())),
        num_warps=config.num_warps, num_stages=config.num_stages,
        divisibility=_divisibility(alignment, config.types, signature, config.split_k > 1),
    )


def _gemv_unit(config: GemmConfig, alignment: Alignment) -> KernelUnit:
    """gemv's stages are K steps loaded together by the kernel itself (STEPS), not Triton's pipeline."""
    constexprs = {"BLOCK_N": config.block_n, "BLOCK_K": config.block_k, "STEPS": config.num_stages,
                  **_epilogue_constexprs(config)}
    return replace(_pointer_unit(config, alignment, "gemm_gemv", constexprs), num_stages=1)


def _tiled_unit(config: GemmConfig, alignment: Alignment) -> KernelUnit:
    t = config.types
    constexprs = {
        "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
        "GROUP_M": config.group_m, "SPLIT_K": config.split_k, **_epilogue_constexprs(config),
        "DOT_PRECISION": "tf32" if t.allow_tf32 else "ieee",
        "ACC_DTYPE": tl.float16 if t.acc is DType.FP16 else tl.float32,
    }
    return _pointer_unit(config, alignment, "gemm_tiled", constexprs)


def reduce_block(split_k: int) -> tuple[int, int]:
    """The reduction's tile: rows of 64 columns, fewer rows the more slabs each sums.

    Each program reads split_k slabs of its tile; at most ~64 KB per program keeps the
    pass spread over many SMs when the output is small (a 64x64 output split 64 ways
    would otherwise be summed by two programs).
    """
    rows = max(1, min(32, 256 // split_k))
    return 1 << (rows.bit_length() - 1), 64


def _reduce_unit(config: GemmConfig, alignment: Alignment) -> KernelUnit:
    """The split-K reduction stage, the same for both families: the workspace is [batch, split, M, N]."""
    t = config.types
    reduce_strides = _unit_strides("stride_c", config.layout.c, ("m", "n"))
    block_m, block_n = reduce_block(config.split_k)
    reduce_constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": config.split_k,
                         **_epilogue_constexprs(config)}
    reduce_constexprs.update({name: 1 for name, kind in reduce_strides if kind == "constexpr"})
    reduce_signature = ([("ws_ptr", "*fp32"), ("c_ptr", f"*{t.c.triton}"), ("bias_ptr", f"*{t.c.triton}"),
                         ("res_ptr", f"*{t.c.triton}"), ("scale_a_ptr", "*fp32"), ("scale_b_ptr", "*fp32"),
                         ("M", "i32"), ("N", "i32")] + reduce_strides + list(_EPILOGUE_STRIDES)
                        + [(n, "constexpr") for n in reduce_constexprs if not n.startswith("stride")])
    return KernelUnit(
        stage="reduce", module=_REDUCE_MODULE, function="splitk_reduce",
        signature=tuple(reduce_signature), constexprs=tuple(sorted(reduce_constexprs.items())),
        num_warps=4, num_stages=1,
        divisibility=_divisibility(replace(alignment, a=False, b=False), t, reduce_signature, False)
        + (("ws_ptr", VECTOR_BYTES),),
    )


REALIGN_BLOCK = (16, 256)  # rows x columns one `copy_rows` program moves
REALIGN_DENSE_BLOCK = 2048  # elements one `copy_dense` program moves


def _realign_units(config: GemmConfig, alignment: Alignment) -> tuple[KernelUnit, ...]:
    """The copies of each operand a realign plan moves (A and B into their buffers, C out of its
    own): `copy_dense` for a caller's tensor that is one dense run from a 16-byte aligned base,
    `copy_rows` for any other. The buffer side is ours (16-byte base, rows and matrices of
    16-byte multiples), so the compiler may vectorise it; the plan picks the one that applies.
    """
    units = []
    for role in alignment.unaligned_operands:
        dtype = getattr(config.types, role)
        into = role != "c"
        ours = "dst" if into else "src"
        per_vector = max(1, VECTOR_BYTES // dtype.itemsize)
        pointers = (("src_ptr", f"*{dtype.triton}"), ("dst_ptr", f"*{dtype.triton}"))
        rows_signature = (pointers + (("ROWS", "i32"), ("COLS", "i32")) + tuple((n, "i64") for n in _COPY_STRIDES)
                          + (("BLOCK_R", "constexpr"), ("BLOCK_C", "constexpr")))
        units.append(KernelUnit(
            stage=f"realign_{role}", module=_REALIGN_MODULE, function="copy_rows", signature=rows_signature,
            constexprs=(("BLOCK_C", REALIGN_BLOCK[1]), ("BLOCK_R", REALIGN_BLOCK[0])), num_warps=4, num_stages=1,
            divisibility=((f"{ours}_ptr", VECTOR_BYTES), (f"{ours}_batch", per_vector), (f"{ours}_row", per_vector)),
        ))
        dense_signature = pointers + (("TOTAL", "i32"), ("COLS", "i32"), ("buffer_row", "i32"),
                                      ("BLOCK", "constexpr"), ("INTO_BUFFER", "constexpr"))
        units.append(KernelUnit(
            stage=f"realign_{role}_dense", module=_REALIGN_MODULE, function="copy_dense", signature=dense_signature,
            constexprs=(("BLOCK", REALIGN_DENSE_BLOCK), ("INTO_BUFFER", into)), num_warps=4, num_stages=1,
            divisibility=(("src_ptr", VECTOR_BYTES), ("dst_ptr", VECTOR_BYTES), ("buffer_row", per_vector)),
        ))
    return tuple(units)


def _descriptor_blocks(config: GemmConfig) -> dict[str, tuple[int, int, int]]:
    """The block each descriptor moves: one matrix of the batch, its contiguous dim last."""
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if config.family is Family.WS_PERSISTENT:  # A and C by warpgroup: half a tile's rows each
        bm //= 2
    return {
        "a_desc": (1, bm, bk) if config.layout.a is Layout.ROW else (1, bk, bm),
        "b_desc": (1, bn, bk) if config.layout.b is Layout.COL else (1, bk, bn),
        "c_desc": (1, bm, bn // config.epilogue_split),
    }


def _persistent_unit(config: GemmConfig, alignment: Alignment) -> KernelUnit:
    """The main stage of both TMA families; stream-K adds its workspace, flags and tile split."""
    t = config.types
    split = config.split_k > 1
    stream_k = config.family is Family.STREAM_K
    dtypes = {"a_desc": t.a, "b_desc": t.b, "c_desc": DType.FP32 if split else t.c}
    descriptors = [(name, f"tensordesc<{dtypes[name].triton}[{','.join(map(str, block))}]>")
                   for name, block in _descriptor_blocks(config).items()]
    scratch = [("ws_ptr", "*fp32"), ("flags_ptr", "*i32")] if stream_k else []
    args = descriptors + scratch + [
        ("bias_ptr", f"*{t.c.triton}"), ("res_ptr", f"*{t.c.triton}"), ("scale_a_ptr", "*fp32"),
        ("scale_b_ptr", "*fp32"), ("M", "i32"), ("N", "i32"), ("K", "i32"), ("batch", "i32"),
        ("a_batch_step", "i32"), ("b_batch_step", "i32"), *([("sk_tiles", "i32")] if stream_k else []),
        *_EPILOGUE_STRIDES,
    ]
    schedule = {} if stream_k else {"EPILOGUE_SPLIT": config.epilogue_split, "FLATTEN": config.flatten,
                                    "SPLIT_K": config.split_k}
    constexprs = {
        "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
        "GROUP_M": config.group_m, "A_K_MAJOR": config.layout.a is Layout.ROW,
        "B_K_MAJOR": config.layout.b is Layout.COL, **schedule, **_epilogue_constexprs(config),
        "DOT_PRECISION": "tf32" if t.allow_tf32 else "ieee",
        "ACC_DTYPE": tl.float16 if t.acc is DType.FP16 else tl.float32,
    }
    signature = tuple(args + [(name, "constexpr") for name in constexprs])
    module = FAMILY_MODULES[config.family]
    divisibility = _divisibility(alignment, t, signature, False) + (
        (("ws_ptr", VECTOR_BYTES), ("flags_ptr", VECTOR_BYTES)) if stream_k else ())
    return KernelUnit(
        stage="main", module=module, function=_TMA_FUNCTIONS[config.family], signature=signature,
        constexprs=tuple(sorted(constexprs.items())), num_warps=config.num_warps, num_stages=config.num_stages,
        divisibility=divisibility,
    )


def _ws_unit(config: GemmConfig, alignment: Alignment, arch: arch_facts.ArchInfo | None) -> KernelUnit:
    """The Gluon families. Each launches as one warpgroup (the first MMA partition); the second and
    the loader's warp are added by `warp_specialize`, so the launch's registers are capped at
    what all three warpgroups share (the partitions then move them by setmaxnreg)."""
    from triton.experimental.gluon import language as gl

    t = config.types
    dtypes = {"a_desc": t.a, "b_desc": t.b, "c_desc": t.c}
    descriptors = [(name, f"tensordesc<{dtypes[name].triton}[{','.join(map(str, block))}],"
                          f"{gl.NVMMASharedLayout.get_default_for(list(block), gl.dtype(dtypes[name].triton))!r}>")
                   for name, block in _descriptor_blocks(config).items()]
    args = descriptors + [
        ("bias_ptr", f"*{t.c.triton}"), ("res_ptr", f"*{t.c.triton}"), ("scale_a_ptr", "*fp32"),
        ("scale_b_ptr", "*fp32"), ("M", "i32"), ("N", "i32"), ("K", "i32"), ("batch", "i32"),
        ("a_batch_step", "i32"), ("b_batch_step", "i32"), *_EPILOGUE_STRIDES,
    ]
    constexprs = {"GROUP_M": config.group_m, "STAGES": config.num_stages, **_epilogue_constexprs(config)}
    signature = tuple(args + [(name, "constexpr") for name in constexprs])
    module = FAMILY_MODULES[config.family]
    threads = (config.num_warps + 4) * 32  # the MMA warpgroups and the loader's (registers go by warpgroup)
    # No arch: the one the Gluon families are written for (the one with warpgroup MMA).
    arch = arch or next(a for a in map(arch_facts.load, arch_facts.available()) if a.has(arch_facts.Feature.WGMMA))
    return KernelUnit(
        stage="main", module=module, function=f"gemm_{config.family.value.replace('-', '_')}", signature=signature,
        constexprs=tuple(sorted(constexprs.items())), num_warps=4, num_stages=1,
        divisibility=_divisibility(alignment, t, signature, False), kind=UnitKind.GLUON,
        max_registers=arch.registers_per_sm // threads // 8 * 8,
    )


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
        strides[1] = triton.cdiv(shape[2], 16) * 16
    if shape[0] == 1:
        strides[0] = strides[1] * shape[1]
    return TensorDescriptor(t, shape, strides, list(block))


@functools.lru_cache(maxsize=16)
def _programs(device: torch.device) -> int:
    """One persistent program per SM (a handful under the interpreter)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _persistent_plan(config: GemmConfig, ops: GemmOperands, out: torch.Tensor, epilogue_args: dict) -> Plan:
    p = ops.problem
    blocks = _descriptor_blocks(config)
    workspace = _workspace(config, p, out)
    if workspace is None:
        c_desc = _tensor_descriptor(out, True, blocks["c_desc"])
    else:  # its slabs as one 3-D matrix stack; the base stays the 4-D workspace the reduction reads
        from triton.tools.tensor_descriptor import TensorDescriptor

        c_desc = TensorDescriptor(workspace, [p.batch * config.split_k, p.m, p.n], [p.m * p.n, p.n, 1],
                                  list(blocks["c_desc"]))
    bound = {
        **epilogue_args, "K": p.k, "batch": p.batch,
        # A broadcast operand (batch 1 against batch > 1) is read at batch coordinate 0.
        "a_batch_step": int(ops.a.shape[0] > 1), "b_batch_step": int(ops.b.shape[0] > 1),
        "a_desc": _tensor_descriptor(ops.a, config.layout.a is Layout.ROW, blocks["a_desc"]),
        "b_desc": _tensor_descriptor(ops.b, config.layout.b is Layout.ROW, blocks["b_desc"]),
        "c_desc": c_desc,
    }
    units = kernel_units(config, p.alignment)
    tiles = triton.cdiv(p.m, config.block_m) * triton.cdiv(p.n, config.block_n) * p.batch
    zeroed = ()
    if config.family is Family.STREAM_K:
        programs, sk_tiles = stream_k_split(tiles, triton.cdiv(p.k, config.block_k), _programs(out.device))
        bound.update(_stream_k_scratch(config, programs, sk_tiles, out.device))
        zeroed = (bound["flags_ptr"],) if sk_tiles else ()
    else:
        programs = min(tiles * config.split_k, _programs(out.device))
    launches = [Launch("main", (programs, 1, 1), _values(units[0], bound))]
    if workspace is not None:
        launches.append(_reduce_launch(config, units[1], workspace, out, epilogue_args))
    return Plan(tuple(launches), out, zeroed)


def stream_k_split(tiles: int, k_tiles: int, sms: int) -> tuple[int, int]:
    """(programs, stream-K tiles): the tiles of a last, partial wave have their K iterations
    dealt over every program; the rest are whole tiles, an equal number per program. At
    most one program per K iteration, so none is left without work."""
    programs = min(sms, tiles * k_tiles)
    return programs, tiles % programs


def _stream_k_scratch(config: GemmConfig, programs: int, sk_tiles: int, device) -> dict:
    """Stream-K's partial sums (a start and an end segment per program) and their ready flags,
    which start as zeros. Without stream-K tiles the kernel touches neither: one element each
    stands in, and nothing needs zeroing (on a replay either: the plan leaves it out of `zeroed`)."""
    if not sk_tiles:
        return {"ws_ptr": torch.empty(1, dtype=torch.float32, device=device),
                "flags_ptr": torch.empty(1, dtype=torch.int32, device=device), "sk_tiles": 0}
    return {"ws_ptr": torch.empty((programs, 2, config.block_m, config.block_n), dtype=torch.float32, device=device),
            "flags_ptr": torch.zeros((programs, 2), dtype=torch.int32, device=device), "sk_tiles": sk_tiles}


def _workspace(config: GemmConfig, p, out: torch.Tensor) -> torch.Tensor | None:
    """Split-K's fp32 partial sums, one [M, N] slab per batch and split; None without split."""
    if config.split_k == 1:
        return None
    return torch.empty((p.batch, config.split_k, p.m, p.n), dtype=torch.float32, device=out.device)


def _reduce_launch(config: GemmConfig, unit: KernelUnit, workspace: torch.Tensor, out: torch.Tensor,
                   epilogue_args: dict) -> Launch:
    batch, _, m, n = workspace.shape
    block_m, block_n = reduce_block(config.split_k)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), batch)
    if grid[1] > MAX_GRID_YZ:
        raise InvalidProblemError(f"N={n} is too large for the split-K reduction grid; use split_k=1")
    bound = {**epilogue_args, "ws_ptr": workspace, "c_ptr": out,
             "stride_cb": out.stride(0), "stride_cm": out.stride(1), "stride_cn": out.stride(2)}
    return Launch("reduce", grid, _values(unit, bound))


def _values(unit: KernelUnit, bound: dict) -> tuple:
    """The unit's arguments in signature order, constexprs included (the launcher skips them)."""
    constants = dict(unit.constexprs)
    return tuple(bound[name] if name in bound else constants[name] for name, _ in unit.signature)


_VENDOR_UNIT = KernelUnit(
    stage="vendor", module="tiledispatch.ops.gemm.vendor", function="run",
    signature=tuple((name, "python") for name in
                    ("a", "b", "out", "bias", "residual", "scale_a", "scale_b", "activation")),
    constexprs=(), num_warps=0, num_stages=0, kind=UnitKind.PYTHON,
)


def aligned_empty(shape: tuple[int, int, int], layout: Layout, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised (batch, rows, cols) matrix stack in `layout` (ROW: cols contiguous, COL:
    rows) whose leading stride is padded to a multiple of 16 bytes: what a TMA descriptor takes.
    The padding is never read: a descriptor's shape is the real one, and it clips there."""
    batch, rows, cols = shape
    per_vector = max(1, VECTOR_BYTES // torch.empty((), dtype=dtype).element_size())
    if layout is Layout.COL:
        lead = triton.cdiv(rows, per_vector) * per_vector
        stride = (cols * lead, 1, lead)
    else:
        lead = triton.cdiv(cols, per_vector) * per_vector
        stride = (rows * lead, lead, 1)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


def _realigned_plan(config: GemmConfig, ops: GemmOperands, out: torch.Tensor) -> Plan:
    """Copies of the operands TMA cannot take (`Alignment.unaligned_operands`) into aligned
    buffers, the twin config's plan on those, and C copied out of its buffer if C was one.

    A row of 4093 bf16 (8186 bytes) keeps both cuBLAS and pointer kernels to element-by-
    element loads; the copies cost a few passes over memory, which a large GEMM repays.
    """
    p = ops.problem
    unaligned = p.alignment.unaligned_operands
    launches, copies = [], {}
    for role, layout in (("a", p.layout.a), ("b", p.layout.b)):
        if role in unaligned:
            source = getattr(ops, role)
            copies[role] = aligned_empty(tuple(source.shape), layout, source.dtype, source.device)
            launches.append(_copy_launch(role, source, copies[role], layout))
    inner_out = aligned_empty(tuple(out.shape), Layout.ROW, out.dtype, out.device) if "c" in unaligned else out
    inner_ops = replace(ops, problem=replace(p, alignment=p.alignment.realigned()), out=inner_out, **copies)
    inner = plan(replace(config, realign=False), inner_ops, inner_out)
    launches += inner.launches
    if inner_out is not out:
        launches.append(_copy_launch("c", inner_out, out, Layout.ROW))
    return Plan(tuple(launches), out, inner.zeroed)


def _dense_run(t: torch.Tensor) -> bool:
    """Whether a stack (in storage order) is one run of elements from a 16-byte aligned base,
    short enough for 32-bit offsets."""
    batch, rows, cols = t.shape
    dense = ((cols == 1 or t.stride(2) == 1) and (rows == 1 or t.stride(1) == cols)
             and (batch == 1 or t.stride(0) == rows * cols))
    return dense and t.data_ptr() % VECTOR_BYTES == 0 and t.numel() < 2**31


def _copy_launch(role: str, src: torch.Tensor, dst: torch.Tensor, layout: Layout) -> Launch:
    """The realign copy of operand `role`: A or B from the caller's src into our buffer dst
    (same shape, or src a broadcast batch of one), C from our buffer src out to the caller's
    dst. Walked in storage order, rows being the contiguous dim. The tensors themselves are
    the pointer arguments (the fast path finds its operands by identity)."""
    stage, into = f"realign_{role}", role != "c"
    s, d = (src, dst) if layout is not Layout.COL else (src.transpose(1, 2), dst.transpose(1, 2))
    caller, buffer = (s, d) if into else (d, s)
    batch, rows, cols = s.shape
    if _dense_run(caller) and batch * rows * buffer.stride(1) < 2**31:
        grid = (triton.cdiv(caller.numel(), REALIGN_DENSE_BLOCK), 1, 1)
        return Launch(f"{stage}_dense", grid, (src, dst, caller.numel(), cols, buffer.stride(1),
                                               REALIGN_DENSE_BLOCK, into))
    block_r, block_c = REALIGN_BLOCK
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c), batch)
    if grid[1] > MAX_GRID_YZ or batch > MAX_GRID_YZ:
        raise InvalidProblemError(f"a {rows}x{cols} matrix stack of {batch} is too large to realign; "
                                  "pass operands whose rows are multiples of 16 bytes")
    return Launch(stage, grid, (src, dst, rows, cols, s.stride(0), s.stride(1), d.stride(0), d.stride(1),
                                block_r, block_c))


def plan(config: AnyGemmConfig, ops: GemmOperands, out: torch.Tensor | None = None) -> Plan:
    p = ops.problem
    if p.batch > MAX_GRID_YZ:
        raise InvalidProblemError(f"batch {p.batch} exceeds the grid limit {MAX_GRID_YZ}; split the batch")
    if out is None:
        out = ops.out if ops.out is not None else torch.empty(
            (p.batch, p.m, p.n), dtype=p.types.c.torch, device=ops.a.device)
    a, b = ops.a, ops.b
    res = ops.residual
    if isinstance(config, VendorConfig):
        args = (a, b, out, ops.bias, res, ops.scale_a, ops.scale_b, p.epilogue.activation)
        return Plan((Launch("vendor", (1, 1, 1), args),), out)
    if config.realign:
        return _realigned_plan(config, ops, out)
    # Broadcast operands (batch 1 against batch > 1) are read with a zero batch stride.
    bstride = lambda t: 0 if t.shape[0] == 1 else t.stride(0)  # noqa: E731
    # Absent operands go as None, a null pointer: the kernel never reads them (constexpr flags off),
    # and Triton's launcher takes None without the data_ptr() call and driver query of a tensor.
    epilogue_args = {
        "bias_ptr": ops.bias, "res_ptr": res, "scale_a_ptr": ops.scale_a, "scale_b_ptr": ops.scale_b,
        "stride_bias": ops.bias.stride(0) if ops.bias is not None else 0,
        "stride_rb": bstride(res) if res is not None else 0,
        "stride_rm": res.stride(1) if res is not None else 0,
        "stride_rn": res.stride(2) if res is not None else 0,
        "M": p.m, "N": p.n,
    }
    if config.family.uses_tma:
        return _persistent_plan(config, ops, out, epilogue_args)
    units = kernel_units(config, p.alignment)
    workspace = _workspace(config, p, out)
    main_bound = {
        **epilogue_args,
        "a_ptr": a, "b_ptr": b, "c_ptr": out if workspace is None else workspace, "K": p.k,
        "stride_ab": bstride(a), "stride_am": a.stride(1), "stride_ak": a.stride(2),
        "stride_bb": bstride(b), "stride_bk": b.stride(1), "stride_bn": b.stride(2),
        # Split-K writes the workspace at its own (unused) strides: zeros, which divide by anything.
        **({"stride_cb": out.stride(0), "stride_cm": out.stride(1), "stride_cn": out.stride(2)}
           if workspace is None else {"stride_cb": 0, "stride_cm": 0, "stride_cn": 0}),
    }
    tiles = triton.cdiv(p.m, config.block_m) * triton.cdiv(p.n, config.block_n)
    launches = [Launch("main", (tiles, config.split_k, p.batch), _values(units[0], main_bound))]
    if workspace is not None:
        launches.append(_reduce_launch(config, units[1], workspace, out, epilogue_args))
    return Plan(tuple(launches), out)
