"""GEMM correctness: every tile of the `tests` rule set, odd shapes, layouts, dtypes,
epilogues, batching, split-K determinism and kernel selection.

Under TRITON_INTERPRET=1 the kernels run on the CPU, so shapes stay small and the
number of kernel runs stays modest. Every run is checked against a float64 reference
(`reference.compare`: relative Frobenius error within the per-dtype tolerance, and no
element of the NaN-poisoned output left unwritten).
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import Dispatcher, KernelSpec, OpKind, Registry
from tiledispatch.core.dtypes import DType
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import (
    Activation, Align, Alignment, Epilogue, GemmConfig, GemmLayout, GemmProblem, GemmTypes, check_operands, supports,
    validate,
)
from tiledispatch.ops.gemm.config import Family
from tiledispatch.ops.gemm.inputs import make_inputs
from tiledispatch.ops.gemm.reference import compare, tolerance
from tiledispatch.ops.gemm.rulesets import TESTS_TILES, Tile

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
ARCH = current_arch()  # the interpreter target here (arch.load("interpreter")); the GPU's arch on a GPU

FP16 = GemmTypes(DType.FP16, DType.FP16, DType.FP16)
FP32 = GemmTypes(DType.FP32, DType.FP32, DType.FP32)
TF32 = GemmTypes(DType.FP32, DType.FP32, DType.FP32, allow_tf32=True)
FP16_FP32 = GemmTypes(DType.FP16, DType.FP16, DType.FP32)
FP8 = GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16)
FP8_MIXED = GemmTypes(DType.FP8E4M3, DType.FP8E5M2, DType.BF16)
FP8_FP16 = GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.FP16)

# Named tiles of TESTS_TILES: one without split-K and one of each split-K factor.
PLAIN = Tile(32, 32, 32, 4, 2, 4)
SMALL = Tile(16, 32, 32, 2, 1, 1)
SPLIT2 = Tile(32, 128, 32, 4, 2, 4, split_k=2)
SPLIT3 = Tile(32, 16, 32, 2, 2, 2, split_k=3)
SPLIT4 = Tile(16, 64, 64, 4, 3, 1, split_k=4)
assert {PLAIN, SMALL, SPLIT2, SPLIT3, SPLIT4} <= set(TESTS_TILES)
assert {t.split_k for t in TESTS_TILES} == {1, 2, 3, 4}


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def tile_id(tile: Tile) -> str:
    return f"{tile.family.value}_{tile.block_m}x{tile.block_n}x{tile.block_k}_k{tile.split_k}"


def problem_of(m, n, k, *, batch=1, types=FP16, layout="rrr", bias=False, activation="none", residual=False):
    return GemmProblem(m, n, k, batch, types, GemmLayout.parse(layout),
                       Epilogue(bias, Activation.parse(activation), residual))


def kernel_name(tile: Tile, problem: GemmProblem, layout: str | None = None) -> str:
    """The registered name of `tile` bound to the problem's signature (or to `layout`)."""
    config = GemmConfig(tile.family, problem.types, GemmLayout.parse(layout) if layout else problem.layout,
                        problem.epilogue, tile.block_m, tile.block_n, tile.block_k, tile.group_m,
                        tile.num_warps, tile.num_stages, tile.split_k, tile.epilogue_split, tile.flatten)
    if not validate(config, ARCH).ok:
        pytest.skip(f"{config.name} is not valid on {ARCH.name}")
    return KernelSpec(OpKind.GEMM, config, ARCH.name).name


def operands_of(problem: GemmProblem, *, seed=0, scale_a=None, scale_b=None):
    """make_inputs for `problem`, checked; asserts that the tensors really describe `problem`."""
    inputs = make_inputs(problem, device=DEVICE, seed=seed)
    kwargs = inputs.kwargs()
    if scale_a is not None:
        kwargs["scale_a"] = torch.tensor(scale_a, dtype=torch.float32, device=DEVICE)
        kwargs["scale_b"] = torch.tensor(scale_b, dtype=torch.float32, device=DEVICE)
    ops = check_operands(inputs.a, inputs.b, activation=problem.epilogue.activation,
                         allow_tf32=problem.types.allow_tf32, **kwargs)
    # Alignment is a fact of the data (make_inputs' strided views are not aligned), not of the request.
    assert replace(ops.problem, alignment=problem.alignment) == problem, f"inputs describe {ops.problem}, not {problem}"
    return inputs, ops


def run_and_check(dispatcher, problem, tile=None, *, kernel_layout=None, seed=0, scale_a=None, scale_b=None):
    """Runs `problem` (forcing `tile` if given) into make_inputs' NaN-poisoned out and checks it."""
    inputs, ops = operands_of(problem, seed=seed, scale_a=scale_a, scale_b=scale_b)
    kernel = kernel_name(tile, problem, kernel_layout) if tile is not None else None
    result = dispatcher.run(ops, kernel=kernel)
    # In place: the result is the caller's out (as a batched view), not a copy.
    assert result.data_ptr() == inputs.out.data_ptr()
    assert result.shape == (problem.batch, problem.m, problem.n)
    cmp = compare(inputs.out, ops)
    assert cmp.passed, f"{kernel or 'selected kernel'}: {cmp.to_dict()}"
    return inputs, ops


# -- every tile of the `tests` rule set ---------------------------------------------------
@pytest.mark.parametrize("types", [FP16, FP32], ids=lambda t: t.name)
@pytest.mark.parametrize("tile", TESTS_TILES, ids=tile_id)
def test_every_tile(dispatcher, tile, types):
    # 65 and 33 are not multiples of any block; K=100 leaves a partial last K tile and,
    # for split-K 3 and 4, a split with no K tile at all. TMA descriptors need 16-byte
    # rows, so the TMA families get 80 x 48 x 112: still partial tiles in M and K. gemv takes one row.
    shape = (80, 48, 112) if tile.family.uses_tma else (1, 33, 100) if tile.family is Family.GEMV else (65, 33, 100)
    if tile.family.uses_tma and types == FP32:
        pytest.skip("fp32 with TMA is tf32 and rcr only (the MMA reads K-major operands)")
    run_and_check(dispatcher, problem_of(*shape, types=types), tile)


# -- odd shapes -------------------------------------------------------------------------------
ODD_SHAPES = [(1, 1, 1), (1, 65, 33), (65, 1, 33), (7, 33, 1), (33, 7, 65), (100, 65, 7), (1, 7, 100),
              (33, 100, 17)]


@pytest.mark.parametrize("tile", [SMALL, SPLIT3, SPLIT4], ids=tile_id)
@pytest.mark.parametrize("mnk", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes(dispatcher, mnk, tile):
    run_and_check(dispatcher, problem_of(*mnk), tile)


@pytest.mark.parametrize("mnk", [(1, 1, 1), (1, 33, 65), (33, 1, 7), (7, 65, 1)], ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes_fp32(dispatcher, mnk):
    run_and_check(dispatcher, problem_of(*mnk, types=FP32), SPLIT2)


# -- layouts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tile", [PLAIN, SPLIT3], ids=tile_id)
@pytest.mark.parametrize("layout", ["rrr", "rcr", "crr", "ccr"])
def test_layouts(dispatcher, layout, tile):
    run_and_check(dispatcher, problem_of(33, 65, 100, layout=layout, bias=True, residual=True), tile)


@pytest.mark.parametrize("tile", [PLAIN, SPLIT4], ids=tile_id)
@pytest.mark.parametrize("layout", ["sss", "rrc", "scr", "crs", "ccc"])
def test_layouts_generic_strides(dispatcher, layout, tile):
    # 's' operands come from make_inputs as every other column of a wider tensor;
    # a column-major or strided C has only the generic-stride ('sss') kernels.
    run_and_check(dispatcher, problem_of(33, 65, 100, layout=layout, residual=True), tile, kernel_layout="sss")


@pytest.mark.parametrize("layout", ["rrc", "srr"])
def test_generic_layout_is_selected(dispatcher, layout):
    problem = problem_of(33, 65, 40, layout=layout)
    spec = dispatcher.select(problem)
    assert spec.config.layout.name == "sss"
    run_and_check(dispatcher, problem)


def test_specialised_layout_is_preferred(dispatcher):
    """A contiguous problem gets a Triton kernel built for its own layout, not the generic one
    (the vendor candidate, when the GPU has it, is left out: its layout is cuBLAS's business)."""
    for layout in ("rrr", "rcr", "crr", "ccr"):
        ranked = dispatcher.explain(problem_of(128, 128, 64, layout=layout)).ranked
        best_triton = next(c.spec for c in ranked if c.spec.family != "vendor")
        assert best_triton.config.layout.name == layout


def test_padded_rows_and_out_stays_in_bounds(dispatcher):
    """Row strides larger than the row (a batch-interleaved A, a padded out): reads and writes stay inside."""
    m, n, k = 33, 65, 40
    g = torch.Generator().manual_seed(3)
    a = torch.randn(m, 2, k, generator=g).to(DEVICE, torch.float16)[:, 1]  # row stride 2K
    b = torch.randn(k, n + 5, generator=g).to(DEVICE, torch.float16)[:, 2:n + 2]
    buf = torch.full((m + 2, n + 7), 123.0, dtype=torch.float16, device=DEVICE)
    out = buf[1:m + 1, 3:n + 3]
    ops = check_operands(a, b, out=out)
    assert ops.problem.layout.name == "rrr"
    for tile in (PLAIN, SPLIT2):
        out.fill_(float("nan"))
        result = dispatcher.run(ops, kernel=kernel_name(tile, ops.problem))
        assert result.data_ptr() == out.data_ptr()
        assert compare(out, ops).passed, compare(out, ops).to_dict()
        border = buf.clone()
        border[1:m + 1, 3:n + 3] = 123.0
        assert bool((border == 123.0).all()), "the kernel wrote outside out"


@pytest.mark.parametrize("tile", [PLAIN, SPLIT3], ids=tile_id)
def test_broadcast_rows_and_columns(dispatcher, tile):
    """Stride-0 views (expand) keep their layout: only the unit stride is fixed, the other is an argument."""
    m, n, k = 33, 17, 40
    g = torch.Generator().manual_seed(22)
    a = torch.randn(1, k, generator=g).to(DEVICE, torch.float16).expand(m, k)  # every row the same
    b = torch.randn(k, 1, generator=g).to(DEVICE, torch.float16).expand(k, n)  # every column the same
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device=DEVICE)
    ops = check_operands(a, b, out=out)
    assert ops.problem.layout.name == "rcr"
    dispatcher.run(ops, kernel=kernel_name(tile, ops.problem))
    assert compare(out, ops).passed, compare(out, ops).to_dict()
    assert bool((out == out[0, 0]).all())  # one value repeated, as the inputs say


@pytest.mark.parametrize("tile", [SMALL, SPLIT4], ids=tile_id)
def test_size_one_dims_with_odd_strides(dispatcher, tile):
    """A single row or column has no meaningful stride along its size-1 dim: any value must do."""
    k, n = 40, 33
    g = torch.Generator().manual_seed(23)
    a = torch.randn(k, 3, generator=g).to(DEVICE, torch.float16)[:, 1].unsqueeze(0)  # 1 x K, column stride 3
    b = torch.randn(n, 2 * k, generator=g).to(DEVICE, torch.float16)[:, ::2].t()  # K x N, strides (2, 2K)
    out = torch.full((2, n), float("nan"), dtype=torch.float16, device=DEVICE)[1:]  # 1 x N
    ops = check_operands(a, b, out=out)
    assert ops.problem.m == 1 and ops.problem.layout.a.value == "c"  # the unit stride is that of the 1 row
    name = kernel_name(tile, ops.problem, "sss" if "s" in ops.problem.layout.name else None)
    dispatcher.run(ops, kernel=name)
    assert compare(out, ops).passed, compare(out, ops).to_dict()


@pytest.mark.parametrize("tile", [PLAIN, SPLIT3], ids=tile_id)
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned"])
def test_alignment(dispatcher, aligned, tile):
    """Operands off a 16-byte boundary (or with strides not divisible by 16) are computed right too."""
    m, n, k = (32, 48, 64) if aligned else (33, 40, 65)
    offset = 0 if aligned else 1
    g = torch.Generator().manual_seed(21)

    def matrix(rows, cols, dtype=torch.float16):
        flat = (torch.randn(rows * cols + offset, generator=g) / k**0.25).to(DEVICE, dtype)
        return flat[offset:].view(rows, cols)

    a, b, out = matrix(m, k), matrix(k, n), matrix(m, n).fill_(float("nan"))
    ops = check_operands(a, b, out=out)
    # Misaligned: every base is off by one element; only N=40 (80 bytes) is a multiple of 16 bytes.
    assert ops.problem.alignment == (Alignment() if aligned else Alignment(*[False] * 4, Align.BYTES16, False))
    result = dispatcher.run(ops, kernel=kernel_name(tile, ops.problem))
    assert result.data_ptr() == out.data_ptr()
    assert compare(out, ops).passed, compare(out, ops).to_dict()


# -- dtypes -----------------------------------------------------------------------------------
DTYPE_CASES = [FP16, FP32, TF32, FP16_FP32, FP8, FP8_MIXED, FP8_FP16]


@pytest.mark.parametrize("tile", [PLAIN, SPLIT2], ids=tile_id)
@pytest.mark.parametrize("types", DTYPE_CASES, ids=lambda t: t.name)
def test_dtypes(dispatcher, types, tile):
    problem = problem_of(65, 33, 100, types=types, bias=True)
    scales = (0.125, 0.75) if types.scaled else (None, None)
    _, ops = run_and_check(dispatcher, problem, tile, scale_a=scales[0], scale_b=scales[1])
    assert ops.problem.types == types
    if types.scaled:
        assert float(ops.scale_a) == 0.125 and float(ops.scale_b) == 0.75


def test_fp32_is_ieee_not_tf32(dispatcher):
    """fp32 without allow_tf32 must be accurate to fp32, far below what tf32 (10-bit mantissa) gives."""
    inputs, ops = run_and_check(dispatcher, problem_of(33, 65, 100, types=FP32), PLAIN)
    assert compare(inputs.out, ops).relative_error < 1e-5
    assert tolerance(FP32) < 1e-4 < tolerance(TF32)


def test_fp8_scales_are_applied(dispatcher):
    """The per-tensor scales multiply the product: scales (2, 0.5) and (1, 1) agree; (0.5, 0.5) is a quarter."""
    problem = problem_of(33, 40, 64, types=FP8, bias=False)
    results = []
    for sa, sb in ((2.0, 0.5), (1.0, 1.0), (0.5, 0.5)):
        _, ops = run_and_check(dispatcher, problem, PLAIN, seed=5, scale_a=sa, scale_b=sb)
        results.append(ops.out.float())
    # Powers of two: the scaled results are exact, so the bits must agree.
    assert torch.equal(results[0], results[1])
    assert torch.equal(results[2], results[1] / 4)


# -- epilogues --------------------------------------------------------------------------------
EPILOGUES = [Epilogue(bias, act, res) for bias in (False, True) for act in Activation for res in (False, True)]


@pytest.mark.parametrize("tile", [PLAIN, SPLIT4], ids=tile_id)
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: e.name)
def test_epilogues_fp32(dispatcher, epilogue, tile):
    # fp32 output: its tolerance (8e-6) tells an erf gelu from a tanh one, and bias before activation.
    problem = GemmProblem(33, 65, 40, 1, FP32, GemmLayout(), epilogue)
    run_and_check(dispatcher, problem, tile, seed=7)


@pytest.mark.parametrize("tile", [SMALL, SPLIT3], ids=tile_id)
@pytest.mark.parametrize(("types", "epilogue"), [
    (FP16, "bias-gelu-res"), (FP16, "bias-silu"), (FP16_FP32, "relu-res"), (FP8, "bias-gelu-res"),
    (FP8_FP16, "bias-relu"), (TF32, "silu-res"),
], ids=lambda x: x if isinstance(x, str) else x.name)
def test_epilogue_combos_other_dtypes(dispatcher, types, epilogue, tile):
    parts = epilogue.split("-")
    activation = next((p for p in parts if p in ("relu", "gelu", "silu")), "none")
    problem = problem_of(33, 65, 40, types=types, bias="bias" in parts, activation=activation,
                         residual="res" in parts)
    scales = (0.25, 1.5) if types.scaled else (None, None)
    run_and_check(dispatcher, problem, tile, scale_a=scales[0], scale_b=scales[1])


# -- batched ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tile", [PLAIN, SPLIT3], ids=tile_id)
@pytest.mark.parametrize("layout", ["rrr", "crr", "rcr", "sss"])
def test_batched(dispatcher, layout, tile):
    run_and_check(dispatcher, problem_of(33, 17, 40, batch=3, layout=layout, bias=True, residual=True,
                                         activation="relu"), tile, kernel_layout="sss" if "s" in layout else None)


def _batched_tensors(shape_a, shape_b, dtype=torch.float16, seed=11):
    g = torch.Generator().manual_seed(seed)
    k = shape_a[-1]
    a = (torch.randn(shape_a, generator=g) / k**0.25).to(DEVICE, dtype)
    b = (torch.randn(shape_b, generator=g) / k**0.25).to(DEVICE, dtype)
    return a, b


@pytest.mark.parametrize("tile", [PLAIN, SPLIT4], ids=tile_id)
@pytest.mark.parametrize(("shape_a", "shape_b"), [((3, 33, 40), (40, 17)), ((33, 40), (3, 40, 17)),
                                                  ((1, 33, 40), (3, 40, 17))], ids=["b2d", "a2d", "a1"])
def test_batch_broadcast(dispatcher, shape_a, shape_b, tile):
    a, b = _batched_tensors(shape_a, shape_b)
    g = torch.Generator().manual_seed(12)
    residual = torch.randn(33, 17, generator=g).to(DEVICE, torch.float16)  # broadcast over the batch too
    out = torch.full((3, 33, 17), float("nan"), dtype=torch.float16, device=DEVICE)
    ops = check_operands(a, b, residual=residual, out=out)
    assert ops.problem.batch == 3
    dispatcher.run(ops, kernel=kernel_name(tile, ops.problem))
    assert compare(out, ops).passed, compare(out, ops).to_dict()
    ref = torch.matmul(a.double().cpu(), b.double().cpu()) + residual.double().cpu()
    assert ref.shape == (3, 33, 17)
    assert float((out.double().cpu() - ref).norm() / ref.norm()) <= tolerance(FP16)


def test_batched_matrices_differ(dispatcher):
    """Each batch uses its own A and B: a kernel that ignored the batch stride would repeat matrix 0."""
    inputs, ops = run_and_check(dispatcher, problem_of(17, 33, 40, batch=3), SPLIT2, seed=4)
    assert not torch.allclose(inputs.out[0].float(), inputs.out[1].float(), atol=1e-2)


# -- determinism ------------------------------------------------------------------------------
@pytest.mark.parametrize("tile", [SPLIT2, SPLIT3, SPLIT4], ids=tile_id)
def test_split_k_is_deterministic(dispatcher, tile):
    problem = problem_of(33, 65, 200, types=FP32, bias=True, activation="gelu")
    inputs, ops = run_and_check(dispatcher, problem, tile, seed=9)
    first = inputs.out.clone()
    inputs.out.fill_(float("nan"))
    dispatcher.run(ops, kernel=kernel_name(tile, problem))
    assert torch.equal(first, inputs.out), "split-K gave different bits on a second run"


# -- selection --------------------------------------------------------------------------------
SELECTION_PROBLEMS = [
    problem_of(65, 33, 100),
    problem_of(1, 100, 64, types=FP32, layout="rcr", bias=True),
    problem_of(7, 7, 300, types=FP16_FP32, residual=True, activation="silu"),
    problem_of(33, 17, 40, batch=2, types=FP8, layout="crr", bias=True),
    problem_of(33, 65, 40, layout="rrc", activation="gelu"),
]


@pytest.mark.parametrize("strategy", ["rules", "first"])
@pytest.mark.parametrize("problem", SELECTION_PROBLEMS,
                         ids=lambda p: f"{p.m}x{p.n}x{p.k}b{p.batch}_{p.types.name}_{p.layout.name}_{p.epilogue.name}")
def test_selection(problem, strategy):
    d = Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH, strategy=strategy)
    spec = d.select(problem)
    assert supports(spec.config, problem) is None
    assert spec.config.types == problem.types and spec.config.epilogue == problem.epilogue
    explanation = d.explain(problem)
    assert explanation.selected == spec
    assert all(supports(c.spec.config, problem) is None for c in explanation.ranked)
    assert explanation.refused and all(c.refused for c in explanation.refused)
    if strategy == "rules":
        scores = [c.score.value for c in explanation.ranked]
        assert scores == sorted(scores, reverse=True) and explanation.ranked[0].spec == spec
    else:
        first = next(s for s in d.registry if supports(s.config, problem) is None)
        assert spec == first
    run_and_check(d, problem, scale_a=0.5 if problem.types.scaled else None,
                  scale_b=2.0 if problem.types.scaled else None)
    assert d.select(problem) is spec  # memoized


# -- the public function ----------------------------------------------------------------------
def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.detach().cpu().double()
    return float((got - ref).norm() / ref.norm())


def _rand(*shape, dtype=torch.float16, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(DEVICE, dtype)


def test_public_gemm_fp16(dispatcher):
    a, b = _rand(33, 100, seed=1, scale=0.3), _rand(100, 65, seed=2, scale=0.3)
    c = tiledispatch.gemm(a, b, dispatcher=dispatcher)
    assert c.shape == (33, 65) and c.dtype == torch.float16 and c.device.type == DEVICE
    assert _rel(c, a.double().cpu() @ b.double().cpu()) < 2e-3


def test_public_gemm_default_dispatcher_epilogue_and_transposed_inputs():
    a = _rand(100, 33, seed=3, scale=0.3).t()  # column-major A
    b = _rand(65, 100, seed=4, scale=0.3).t()  # column-major B
    bias, residual = _rand(65, seed=5), _rand(33, 65, seed=6)
    c = tiledispatch.gemm(a, b, bias=bias, activation="gelu", residual=residual)
    ref = F.gelu(a.double().cpu() @ b.double().cpu() + bias.double().cpu()) + residual.double().cpu()
    assert c.shape == (33, 65)
    assert _rel(c, ref) < 2e-3


def test_public_gemm_fp32_out_given(dispatcher):
    a, b = _rand(3, 17, 40, dtype=torch.float32, seed=7), _rand(3, 40, 33, dtype=torch.float32, seed=8)
    out = torch.full((3, 33, 17), float("nan"), device=DEVICE).transpose(1, 2)  # column-major C
    bias = _rand(33, dtype=torch.float32, seed=9)
    c = tiledispatch.gemm(a, b, bias=bias, activation="silu", out=out, dispatcher=dispatcher)
    assert c.data_ptr() == out.data_ptr() and c.shape == out.shape and c.stride() == out.stride()
    ref = F.silu(a.double().cpu() @ b.double().cpu() + bias.double().cpu())
    assert _rel(out, ref) < 1e-5


def test_public_gemm_fp16_in_fp32_out(dispatcher):
    a, b = _rand(40, 64, seed=10, scale=0.5), _rand(64, 24, seed=11, scale=0.5)
    c = tiledispatch.gemm(a, b, out_dtype=torch.float32, dispatcher=dispatcher)
    assert c.dtype == torch.float32
    # Exact fp16 products summed in fp32: far tighter than an fp16 output could be.
    assert _rel(c, a.double().cpu() @ b.double().cpu()) < 1e-5


def test_public_gemm_tf32_batched_broadcast(dispatcher):
    a, b = _rand(2, 33, 50, dtype=torch.float32, seed=12), _rand(50, 20, dtype=torch.float32, seed=13)
    c = tiledispatch.gemm(a, b, allow_tf32=True, dispatcher=dispatcher)
    assert c.shape == (2, 33, 20)
    assert _rel(c, a.double().cpu() @ b.double().cpu()) < 2e-3  # tf32 inputs: 10-bit mantissa


def test_public_gemm_fp8_scales(dispatcher):
    a = _rand(33, 64, seed=14).to(torch.float8_e4m3fn)
    b = _rand(64, 17, seed=15).to(torch.float8_e5m2)
    c = tiledispatch.gemm(a, b, scale_a=0.25, scale_b=torch.tensor(0.5, device=DEVICE), dispatcher=dispatcher)
    assert c.dtype == torch.bfloat16  # fp8 gives bf16 by default
    ref = (a.double().cpu() @ b.double().cpu()) * 0.125
    assert _rel(c, ref) < 1.6e-2


def test_public_gemm_forced_kernel(dispatcher):
    a, b = _rand(65, 40, seed=16, scale=0.4), _rand(40, 7, seed=17, scale=0.4)
    residual = _rand(65, 7, seed=18)
    problem = problem_of(65, 7, 40, residual=True, activation="relu")
    name = kernel_name(SPLIT3, problem)
    c = tiledispatch.gemm(a, b, residual=residual, activation="relu", kernel=name, dispatcher=dispatcher)
    ref = F.relu(a.double().cpu() @ b.double().cpu()) + residual.double().cpu()
    assert _rel(c, ref) < 2e-3


@pytest.mark.skipif(not ON_GPU, reason="bf16 tl.dot is not in Triton's interpreter")
def test_public_gemm_bf16_on_gpu():
    a, b = _rand(65, 100, dtype=torch.bfloat16, seed=19, scale=0.3), _rand(100, 33, dtype=torch.bfloat16, seed=20)
    c = tiledispatch.gemm(a, b)
    assert c.dtype == torch.bfloat16
    assert _rel(c, a.double().cpu() @ b.double().cpu()) < 1.6e-2
