"""The `realign` variants: operands below 16-byte alignment are copied into aligned buffers first.

A row of 4093 bf16 is 8186 bytes: no TMA descriptor takes it, and pointer kernels load it
element by element. A realign config (tma-persistent or tiled) copies each such operand
(and C, when C is one) into a buffer whose rows are padded to 16 bytes, runs its twin's
kernel there, and copies C back. Checked here under the interpreter in fp16 on every layout and on unaligned bases;
every default realign tile on the GPU.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core.op import OpKind, RuleSet
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import (Activation, Epilogue, GemmLayout, GemmProblem, GemmTypes, check_operands,
                                   kernel_units, plan, supports, validate)
from tiledispatch.ops.gemm.config import Family
from tiledispatch.ops.gemm.inputs import make_inputs
from tiledispatch.ops.gemm.ranking import rule_score
from tiledispatch.ops.gemm.reference import compare

from ...conftest import on_gpu, requires_gpu

ARCH = current_arch()
DEVICE = "cuda" if on_gpu() else "cpu"
REALIGN = "gemm_fp16_{layout}_tma-persistent_32x32x32_w4_s2_g2_k1_e2_realign_{epilogue}_" + ARCH.tag


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def check(dispatcher: Dispatcher, problem: GemmProblem, *, unaligned: tuple[str, ...], a_storage: str = "dense",
          broadcast_b: bool = False, seed: int = 0, copies: tuple[str, ...] | None = None) -> None:
    """Runs the realign kernel into a NaN-poisoned out and compares with the float64 reference.

    a_storage: "dense" as made; "offset", the same values one element into a fresh buffer (a
    base 2 bytes past 16); "padded", rows 8 elements longer than K. `copies`: the copy stages
    the plan must hold (`copy_dense` for dense runs from aligned bases, else `copy_rows`)."""
    inputs = make_inputs(problem, device=DEVICE, seed=seed)
    a, b = inputs.a, inputs.b[:1] if broadcast_b else inputs.b
    if a_storage == "offset":
        shifted = torch.empty(a.numel() + 1, dtype=a.dtype, device=DEVICE)
        a = shifted[1:].view(a.shape).copy_(a)
    elif a_storage == "padded":
        a = torch.empty(*a.shape[:-1], a.shape[-1] + 8, dtype=a.dtype, device=DEVICE)[..., :a.shape[-1]].copy_(a)
    ops = check_operands(a, b, activation=problem.epilogue.activation, **inputs.kwargs())
    assert ops.problem.alignment.unaligned_operands == unaligned, ops.problem.alignment.tag
    name = REALIGN.format(layout=problem.layout.name, epilogue=problem.epilogue.name)
    spec = dispatcher.registry.get(name)
    assert supports(spec.config, ops.problem) is None
    if copies is not None:
        stages = [launch.stage for launch in plan(spec.config, ops, ops.out).launches]
        assert [stage for stage in stages if stage.startswith("realign")] == list(copies)
    dispatcher.run(ops, kernel=name)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    result = compare(inputs.out, ops)
    assert result.passed, (name, result.to_dict())


FP16 = GemmTypes.parse("fp16")


@pytest.mark.parametrize("layout, shape, unaligned", [
    ("rcr", (40, 48, 37), ("a", "b")),  # K rows of 74 bytes; C's rows of 96 are fine
    ("rcr", (40, 33, 48), ("c",)),  # only C: written to a buffer, copied out
    ("rrr", (45, 33, 37), ("a", "b", "c")),  # B row-major: its rows are N long
    ("crr", (45, 40, 32), ("a",)),  # A column-major: its rows are M long
    ("ccr", (33, 41, 37), ("a", "b", "c")),
], ids=["rcr-k", "rcr-c", "rrr-all", "crr-a", "ccr-all"])
def test_layouts(dispatcher, layout, shape, unaligned):
    check(dispatcher, GemmProblem(*shape, types=FP16, layout=GemmLayout.parse(layout)), unaligned=unaligned)


def test_unaligned_base_with_aligned_rows(dispatcher):
    """Rows of 64 bytes, but A starts 2 bytes past a 16-byte boundary: copied row by row."""
    check(dispatcher, GemmProblem(40, 48, 32, types=FP16, layout=GemmLayout.parse("rcr")), unaligned=("a",),
          a_storage="offset", copies=("realign_a",), seed=1)


def test_padded_odd_rows_and_dense_ones(dispatcher):
    """A's rows of 37 halves padded to 45 (not a dense run: row by row); B and C dense runs."""
    check(dispatcher, GemmProblem(40, 33, 37, types=FP16, layout=GemmLayout.parse("rcr")), unaligned=("a", "b", "c"),
          a_storage="padded", copies=("realign_a", "realign_b_dense", "realign_c_dense"), seed=4)


def test_batched_broadcast_with_the_epilogue(dispatcher):
    """Batch 3 against a broadcast B, bias, GELU and residual, with every operand unaligned."""
    problem = GemmProblem(35, 41, 29, batch=3, types=FP16, layout=GemmLayout.parse("rcr"),
                          epilogue=Epilogue(True, Activation.GELU, True))
    check(dispatcher, problem, unaligned=("a", "b", "c"), broadcast_b=True, seed=2)


def test_plan_copies_only_the_unaligned_operands_into_16_byte_rows(dispatcher):
    problem = GemmProblem(40, 33, 37, types=FP16, layout=GemmLayout.parse("rcr"))
    inputs = make_inputs(problem, device="cpu")
    ops = check_operands(inputs.a, inputs.b, out=inputs.out)
    config = dispatcher.registry.get(REALIGN.format(layout="rcr", epilogue="none")).config
    stages = plan(config, ops, ops.out)
    assert [launch.stage for launch in stages.launches] == ["realign_a_dense", "realign_b_dense", "main",
                                                            "realign_c_dense"]
    buffers = [launch.args[1] for launch in stages.launches[:2]] + [stages.launches[-1].args[0]]
    assert [tuple(t.shape) for t in buffers] == [(1, 40, 37), (1, 37, 33), (1, 40, 33)]
    # A's rows (K) and B's columns (K, B being column-major) padded to 40 halves, C's rows to 40.
    assert [t.stride() for t in buffers] == [(1600, 40, 1), (1320, 1, 40), (1600, 40, 1)]
    assert stages.launches[0].args[0] is ops.a and stages.launches[-1].args[1] is ops.out


# -- where the variant applies, and how it is ranked ---------------------------------------------------------------


def test_realign_is_refused_where_nothing_needs_it_and_named_where_it_would_help(dispatcher):
    aligned = GemmProblem(64, 64, 64, types=FP16, layout=GemmLayout.parse("rcr"))
    realign = dispatcher.registry.get(REALIGN.format(layout="rcr", epilogue="none")).config
    assert "nothing to realign" in supports(realign, aligned)
    a = torch.empty(64, 37, dtype=torch.float16, device="meta")
    unaligned = check_operands(a, a.t()).problem
    plain = next(s.config for s in dispatcher.registry if s.config.family is Family.TMA_PERSISTENT
                 and not s.config.realign and s.config.types == FP16 and s.config.layout.name == "rcr"
                 and s.config.epilogue.name == "none")
    assert "realign variant" in supports(plain, unaligned)
    every_other = torch.empty(64, 74, dtype=torch.float16, device="meta")[:, ::2]  # neither dim contiguous
    strided = check_operands(every_other, every_other.t()).problem
    assert strided.layout.a.value == "s"
    sss = next(s.config for s in dispatcher.registry if s.config.family is Family.TILED and s.config.types == FP16
               and s.config.layout.name == "sss" and s.config.epilogue.name == "none")
    assert "row- or column-major" in supports(replace(sss, realign=True), strided)


def test_tiled_realign_runs_with_vector_loads(dispatcher):
    """The tiled family's variant: its twin compiled for 16-byte rows (divisibility 8 halves)."""
    spec = dispatcher.registry.get("gemm_fp16_rcr_tiled_32x32x32_w4_s2_g4_k1_realign_none_" + ARCH.tag)
    config = spec.config
    problem = check_operands(torch.empty(40, 37, dtype=torch.float16, device="meta"),
                             torch.empty(48, 37, dtype=torch.float16, device="meta").t()).problem
    main = next(u for u in kernel_units(config, problem.alignment) if u.stage == "main")
    assert dict(main.divisibility)["stride_am"] == 8 and validate(config, arch.load("sm_90")).ok
    inputs = make_inputs(GemmProblem(40, 48, 37, types=FP16, layout=GemmLayout.parse("rcr")), device=DEVICE, seed=3)
    ops = check_operands(inputs.a, inputs.b, out=inputs.out)
    dispatcher.run(ops, kernel=spec.name)
    assert compare(inputs.out, ops).passed


def test_odd_4095_ranks_realign_over_element_loads_and_cublas():
    """odd_4095x4097x4093 in bf16: cuBLAS ran it at 138 TFLOP/s and the best tiled kernel at 124
    (gemm.csv); the rules put a realign tile first."""
    sm90 = arch.load("sm_90")
    registry = Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, sm90)
    a = torch.empty(4095, 4093, dtype=torch.bfloat16, device="meta")
    b = torch.empty(4097, 4093, dtype=torch.bfloat16, device="meta").t()
    problem = check_operands(a, b).problem
    ranked = sorted(((rule_score(s.config, problem, sm90).value, s) for s in registry
                     if supports(s.config, problem) is None), key=lambda x: -x[0])
    assert ranked[0][1].config.realign, [s.name for _, s in ranked[:3]]
    vendor = next(score for score, s in ranked if s.config.family is Family.VENDOR)
    assert ranked[0][0] > 2 * vendor
    best_tiled = next(score for score, s in ranked if s.config.family is Family.TILED and not s.config.realign)
    assert ranked[0][0] > 1.5 * best_tiled


def test_sm90_dense_copies_move_16_byte_vectors_on_the_callers_side(tmp_path):
    """The whole point of `copy_dense`: the caller's odd rows read (A, B) and written (C) as one
    run in 16-byte vectors; `copy_rows` cannot, and moved 1.25 TB/s reading them on the H200."""
    import os

    from tiledispatch.core import kernel
    from tiledispatch.core.cache import KernelCache
    from tiledispatch.ops.gemm import Alignment

    os.chmod(tmp_path, 0o700)
    cache = KernelCache(tmp_path / "cache")
    registry = Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, arch.load("sm_90"))
    spec = registry.get("gemm_bf16_rcr_tma-persistent_128x128x64_w8_s4_g8_k1_e2_realign_none_sm90")
    unaligned = Alignment(*[False] * 6)
    results = kernel.build_all([spec], cache, jobs=1, specializations=(unaligned,))
    assert all(r.ok for r in results), [r.error for r in results]
    ptx = {e.key.split(".")[2].split("-")[0]: e.files[kernel.PTX_FILE].read_text() for e in cache.entries()}
    assert "ld.global.v4" in ptx["realign_a_dense"] and "ld.global.v4" in ptx["realign_b_dense"]
    assert "st.global.v4" in ptx["realign_c_dense"]
    assert "ld.global.v4" not in ptx["realign_a"]


# -- on the GPU (the fast path's fresh buffers per call: test_persistent.py) ----------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8e4m3"])
def test_every_default_realign_tile_on_gpu(dtype):
    """Batch 2, K rows of 333 elements, C rows of 401, bias and GELU: A, B and C all realigned."""
    dispatcher = Dispatcher(Registry.from_rule_set("gemm", "default", ARCH), ARCH)
    problem = GemmProblem(270, 401, 333, batch=2, types=GemmTypes.parse(dtype), layout=GemmLayout.parse("rcr"),
                          epilogue=Epilogue(True, Activation.GELU, False))
    inputs = make_inputs(problem, device=DEVICE)
    ops = check_operands(inputs.a, inputs.b, activation=Activation.GELU, **inputs.kwargs())
    assert ops.problem.alignment.unaligned_operands == ("a", "b", "c")
    names = [s.name for s in dispatcher.registry if s.config.family is not Family.VENDOR and s.config.realign
             and supports(s.config, ops.problem) is None]
    assert len(names) >= 8 and any("tiled" in name for name in names), names
    for seed, name in enumerate(names):
        inputs = make_inputs(problem, device=DEVICE, seed=seed)
        ops = check_operands(inputs.a, inputs.b, activation=Activation.GELU, **inputs.kwargs())
        dispatcher.run(ops, kernel=name)
        torch.cuda.synchronize()
        result = compare(inputs.out, ops)
        assert result.passed, (name, result.to_dict())
