"""The gemv family (one row of A on the CUDA cores): correctness under the interpreter, its
rules, and where the ranking sends it."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core.dtypes import DType
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import check_operands, supports, validate
from tiledispatch.ops.gemm.config import Family, GemmConfig
from tiledispatch.ops.gemm.inputs import make_inputs
from tiledispatch.ops.gemm.problem import Activation, Epilogue, GemmLayout, GemmProblem, GemmTypes
from tiledispatch.ops.gemm.reference import compare
from tiledispatch.ops.gemm.rules import GemmRule, auto_correct

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
ARCH = current_arch()
SM90 = arch.load("sm_90")
FULL_EPILOGUE = Epilogue(True, Activation.GELU, True)


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def gemv_kernels(dispatcher: Dispatcher, problem: GemmProblem) -> list[str]:
    names = [s.name for s in dispatcher.registry
             if s.config.family is Family.GEMV and s.definition.supports(s.config, problem) is None]
    assert names, f"no gemv kernel of the tests set supports {problem}"
    return names


def check_every_gemv_kernel(dispatcher, problem: GemmProblem, seed: int = 0) -> None:
    """Each gemv kernel that takes the operands (a single column makes B's layout whatever
    check_operands reads), run into fresh NaN-poisoned outputs, against float64."""
    for kernel in gemv_kernels(dispatcher, _operands(problem, seed)[1].problem):
        inputs, ops = _operands(problem, seed)
        dispatcher.run(ops, kernel=kernel)
        result = compare(inputs.out, ops)
        assert result.passed, (kernel, result.to_dict())


def _operands(problem: GemmProblem, seed: int):
    inputs = make_inputs(problem, device=DEVICE, seed=seed)
    return inputs, check_operands(inputs.a, inputs.b, activation=problem.epilogue.activation, **inputs.kwargs())


# (n, k): N and K that no tile divides, N that every tile divides over K of 4 steps of 64 (the last one
# ragged: more steps than the tiles' stages), a K shorter than one step, a single column.
SHAPES = [(33, 100), (64, 200), (7, 5), (1, 300)]
TYPES = {"fp16": GemmTypes.parse("fp16"), "fp32": GemmTypes.parse("fp32"),
         "fp16-fp32": GemmTypes(DType.FP16, DType.FP16, DType.FP32)}


@pytest.mark.parametrize("dtype", sorted(TYPES))
@pytest.mark.parametrize("layout", ["rcr", "rrr", "sss"])
@pytest.mark.parametrize("nk", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_gemv_tile_against_float64(dispatcher, dtype, layout, nk):
    n, k = nk
    problem = GemmProblem(1, n, k, batch=2, types=TYPES[dtype], layout=GemmLayout.parse(layout),
                          epilogue=FULL_EPILOGUE)
    check_every_gemv_kernel(dispatcher, problem)


@pytest.mark.parametrize("dtype", ["fp8e4m3", "fp8e4m3xfp8e5m2"])
def test_fp8_with_scales(dispatcher, dtype):
    """Per-tensor scales multiply the fp32 sum before the epilogue, as in the other families."""
    problem = GemmProblem(1, 40, 96, types=GemmTypes.parse(dtype), layout=GemmLayout.parse("rcr"),
                          epilogue=Epilogue(True, Activation.SILU, False))
    check_every_gemv_kernel(dispatcher, problem, seed=3)


def test_more_than_one_row_is_refused_with_the_reason():
    config = GemmConfig(Family.GEMV, GemmTypes.parse("bf16"), GemmLayout.parse("rcr"), Epilogue(), 1, 8, 1024)
    one_row = GemmProblem(1, 4096, 4096, types=config.types, layout=config.layout)
    assert supports(config, one_row) is None
    reason = supports(config, replace(one_row, m=2))
    assert reason is not None and "M=2" in reason and "tiled" in reason


@pytest.mark.parametrize("change", [dict(block_m=16), dict(split_k=2), dict(block_k=8)],
                         ids=["block_m", "split_k", "block_k"])
def test_gemv_options_are_validated(change):
    config = GemmConfig(Family.GEMV, GemmTypes.parse("bf16"), GemmLayout.parse("rcr"), Epilogue(), 1, 8, 1024)
    assert validate(config, SM90).ok
    broken = replace(config, **change)
    assert GemmRule.GEMV_OPTIONS in validate(broken, SM90).broken_rules()
    fixed, corrections = auto_correct(replace(config, num_warps=1, block_n=64, block_k=2048), SM90)
    assert validate(fixed, SM90).ok and fixed.family is Family.GEMV and corrections


def test_tma_tiles_stay_within_one_copy_box():
    """block_k may reach 2048 for pointer loads; a TMA copy moves at most 256 elements a dim."""
    tiled = GemmConfig(Family.TILED, GemmTypes.parse("fp8e4m3"), GemmLayout.parse("rcr"), Epilogue(), 16, 32, 1024,
                       group_m=1, num_stages=4)
    assert validate(tiled, SM90).ok
    tma = replace(tiled, family=Family.TMA_PERSISTENT, block_m=64, block_k=512, num_stages=2)
    assert GemmRule.TILE_MAXIMUM in validate(tma, SM90).broken_rules()


def decode(m: int, n: int, k: int, dtype: str = "bf16") -> GemmProblem:
    return GemmProblem(m, n, k, types=GemmTypes.parse(dtype), layout=GemmLayout.parse("rcr"))


@pytest.fixture(scope="module")
def sm90() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "default", SM90), SM90)


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (1, 6144, 4096), (1, 28672, 4096)])
def test_rules_take_gemv_for_one_row_on_hopper(sm90, shape):
    """The decode projections at T = 1: B's stream at memory speed beats a padded tensor-core
    tile and, in one launch, the vendor's call."""
    assert sm90.select(decode(*shape)).family == "gemv"


def test_rules_do_not_take_gemv_where_k_is_split_for_parallelism(sm90):
    """64 columns over K = 65536 leave a gemv grid of a few programs: split-K families win."""
    picked = sm90.select(decode(1, 64, 65536))
    assert picked.family != "gemv"
    assert sm90.explain(decode(1, 64, 65536)).ranked[0].spec.family != "gemv"


def test_a_column_major_b_reads_long_runs_a_row_major_one_wide_tiles():
    """The ranking credits the bytes each DRAM sector delivers: with B row-major (N contiguous)
    a two-column tile reads 4 bytes of each 32-byte sector."""
    from tiledispatch.ops.gemm.ranking import device_score

    t = GemmTypes.parse("bf16")
    narrow = GemmConfig(Family.GEMV, t, GemmLayout.parse("rrr"), Epilogue(), 1, 2, 1024, group_m=1, num_stages=2)
    wide = replace(narrow, block_n=16, num_warps=8)
    p = replace(decode(1, 4096, 4096), layout=GemmLayout.parse("rrr"))
    assert device_score(wide, p, SM90).value > 2 * device_score(narrow, p, SM90).value
    k_major = replace(narrow, layout=GemmLayout.parse("rcr"))
    assert device_score(k_major, decode(1, 4096, 4096), SM90).value > 2 * device_score(narrow, p, SM90).value
