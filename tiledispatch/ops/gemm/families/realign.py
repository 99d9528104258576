"""The realign variant of a Triton family (kernels/realign.py): a config with ``realign=True``
copies the operands TMA and vector loads cannot take (a base or a row not a multiple of 16
bytes: `Alignment.unaligned_operands`) into buffers whose rows are, runs its twin (the same
config without realign) on those, and copies C back out if C was one.

A row of 4093 bf16 (8186 bytes) keeps both cuBLAS and pointer kernels to element-by-element
loads; the copies cost a few passes over memory, which a large GEMM repays. The variant wraps
whatever family it is given (`variant`), so each family module registers itself through it:
the copies, their units, plan, cost and rules are written once, here.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ....core.arith import cdiv
from ....core.launch import Launch, Plan
from ....core.errors import InvalidProblemError
from ....core.op import KernelUnit, Score
from ..config import GemmConfig
from ..family import GemmFamily
from ..operands import GemmOperands
from ..problem import VECTOR_BYTES, Alignment, GemmProblem, Layout
from .. import plan as shared_plan, ranking
from ....heuristics.roofline import dram_bytes_per_s

MODULE = f"{shared_plan.KERNELS}.realign"
_COPY_STRIDES = ("src_batch", "src_row", "dst_batch", "dst_row")
REALIGN_BLOCK = (16, 256)  # rows x columns one `copy_rows` program moves
REALIGN_DENSE_BLOCK = 2048  # elements one `copy_dense` program moves
# A realign copy reads and writes its operand once, at this fraction of the memory bandwidth, by
# element size: on the H200 (odd_4095x4097x4093) the dense copies moved 3.1-3.2 TB/s of 4.8 in
# bf16 and out of the buffer in any dtype, 1.87 TB/s into it in fp8 (byte stores).
REALIGN_BANDWIDTH_FRACTION = {1: 0.39}
REALIGN_BANDWIDTH_FRACTION_WIDE = 0.65


# Memoised: a ranking asks for each realign candidate's twin and the realigned problem in its
# refusal and again in its score; one object each also keeps the scores' per-config and
# per-problem caches (ranking._occupancy, ranking.roofline) warm.
@functools.lru_cache(maxsize=4096)
def _twin(config: GemmConfig) -> GemmConfig:
    return replace(config, realign=False)


@functools.lru_cache(maxsize=64)
def _realigned(problem: GemmProblem) -> GemmProblem:
    """The problem on the copies: itself where every operand is aligned (most problems, which a
    ranking asks of each realign group), not a copy made through its checks."""
    return replace(problem, alignment=problem.alignment.realigned()) if problem.alignment.unaligned_operands \
        else problem


def variant(family: GemmFamily) -> GemmFamily:
    """`family`, whose configs with ``realign=True`` take the copies around their twin's stages."""

    def supports(config: GemmConfig, problem: GemmProblem) -> str | None:
        if not config.realign:
            return family.supports(config, problem)
        return family.supports(config, _realigned(problem)) or _reason(problem)

    def device_score(config: GemmConfig, problem: GemmProblem, arch) -> Score:
        if not config.realign:
            return family.device_score(config, problem, arch)
        inner = family.device_score(_twin(config), _realigned(problem), arch)
        copies_s = copy_seconds(problem, arch)
        modelled = inner.terms["modelled_us"] * 1e-6 + copies_s
        return Score(ranking.problem_ideal_seconds(problem, arch) / modelled,
                     {**inner.terms, "realign_us": copies_s * 1e6, "modelled_us": modelled * 1e6})

    def host_launches(config: GemmConfig, problem: GemmProblem) -> int:
        launches = family.host_launches(config, problem)
        return launches + len(problem.alignment.unaligned_operands) if config.realign else launches

    def kernel_units(config: GemmConfig, alignment: Alignment, arch=None) -> tuple[KernelUnit, ...]:
        if not config.realign:
            return family.kernel_units(config, alignment, arch)
        twin = family.kernel_units(_twin(config), alignment.realigned(), arch)
        return (*_copy_units(config, alignment), *twin)

    def plan(config: GemmConfig, ops: GemmOperands) -> Plan:
        return _realigned_plan(family, config, ops) if config.realign else family.plan(config, ops)

    def fits(config: GemmConfig) -> bool:
        """The copies take row- or column-major operands (no `s`)."""
        return not (config.realign and "s" in config.layout.name) and family.fits(config)

    return replace(family, supports=supports, device_score=device_score, host_launches=host_launches,
                   kernel_units=kernel_units, plan=plan, fits=fits)


def _reason(problem: GemmProblem) -> str | None:
    if not problem.alignment.unaligned_operands:
        return "every operand is 16-byte aligned: nothing to realign (its twin without realign takes it as it is)"
    if Layout.STRIDED in (problem.layout.a, problem.layout.b, problem.layout.c):
        return f"realign copies row- or column-major operands, not layout {problem.layout.name}"
    return None


def copy_seconds(p: GemmProblem, arch) -> float:
    """The copies of a realign plan: each unaligned operand read and written once more."""
    t = p.types
    elements = {"a": p.m * p.k, "b": p.k * p.n, "c": p.m * p.n}
    seconds = 0.0
    for role in p.alignment.unaligned_operands:
        itemsize = getattr(t, role).itemsize
        rate = dram_bytes_per_s(arch) * REALIGN_BANDWIDTH_FRACTION.get(itemsize, REALIGN_BANDWIDTH_FRACTION_WIDE)
        seconds += 2 * p.batch * elements[role] * itemsize / rate + arch.calibration.launch_s
    return seconds


def _copy_units(config: GemmConfig, alignment: Alignment) -> tuple[KernelUnit, ...]:
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
            stage=f"realign_{role}", module=MODULE, function="copy_rows", signature=rows_signature,
            constexprs=(("BLOCK_C", REALIGN_BLOCK[1]), ("BLOCK_R", REALIGN_BLOCK[0])), num_warps=4, num_stages=1,
            divisibility=((f"{ours}_ptr", VECTOR_BYTES), (f"{ours}_batch", per_vector), (f"{ours}_row", per_vector)),
        ))
        dense_signature = pointers + (("TOTAL", "i32"), ("COLS", "i32"), ("buffer_row", "i32"),
                                      ("BLOCK", "constexpr"), ("INTO_BUFFER", "constexpr"))
        units.append(KernelUnit(
            stage=f"realign_{role}_dense", module=MODULE, function="copy_dense", signature=dense_signature,
            constexprs=(("BLOCK", REALIGN_DENSE_BLOCK), ("INTO_BUFFER", into)), num_warps=4, num_stages=1,
            divisibility=(("src_ptr", VECTOR_BYTES), ("dst_ptr", VECTOR_BYTES), ("buffer_row", per_vector)),
        ))
    return tuple(units)


def aligned_empty(shape: tuple[int, int, int], layout: Layout, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised (batch, rows, cols) matrix stack in `layout` (ROW: cols contiguous, COL:
    rows) whose leading stride is padded to a multiple of 16 bytes: what a TMA descriptor takes.
    The padding is never read: a descriptor's shape is the real one, and it clips there."""
    batch, rows, cols = shape
    per_vector = max(1, VECTOR_BYTES // torch.empty((), dtype=dtype).element_size())
    if layout is Layout.COL:
        lead = cdiv(rows, per_vector) * per_vector
        stride = (cols * lead, 1, lead)
    else:
        lead = cdiv(cols, per_vector) * per_vector
        stride = (rows * lead, lead, 1)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


def _realigned_plan(family: GemmFamily, config: GemmConfig, ops: GemmOperands) -> Plan:
    """Copies of the operands TMA cannot take into aligned buffers, the twin's plan on those,
    and C copied out of its buffer if C was one."""
    p = ops.problem
    out = shared_plan.output(ops)
    unaligned = p.alignment.unaligned_operands
    launches, copies = [], {}
    for role, layout in (("a", p.layout.a), ("b", p.layout.b)):
        if role in unaligned:
            source = getattr(ops, role)
            copies[role] = aligned_empty(tuple(source.shape), layout, source.dtype, source.device)
            launches.append(_copy_launch(role, source, copies[role], layout))
    inner_out = aligned_empty(tuple(out.shape), Layout.ROW, out.dtype, out.device) if "c" in unaligned else out
    inner_ops = replace(ops, problem=replace(p, alignment=p.alignment.realigned()), out=inner_out, **copies)
    inner = family.plan(_twin(config), inner_ops)
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
        grid = (cdiv(caller.numel(), REALIGN_DENSE_BLOCK), 1, 1)
        return Launch(f"{stage}_dense", grid, (src, dst, caller.numel(), cols, buffer.stride(1),
                                               REALIGN_DENSE_BLOCK, into))
    block_r, block_c = REALIGN_BLOCK
    grid = (cdiv(rows, block_r), cdiv(cols, block_c), batch)
    if grid[1] > shared_plan.MAX_GRID_YZ or batch > shared_plan.MAX_GRID_YZ:
        raise InvalidProblemError(f"a {rows}x{cols} matrix stack of {batch} is too large to realign; "
                                  "pass operands whose rows are multiples of 16 bytes")
    return Launch(stage, grid, (src, dst, rows, cols, s.stride(0), s.stride(1), d.stride(0), d.stride(1),
                                block_r, block_c))
