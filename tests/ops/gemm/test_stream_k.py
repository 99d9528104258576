"""The stream-k family: K iterations of the last wave dealt evenly, partial tiles fixed up by their owner.

Under the interpreter the programs run one after another in id order, which is the order
the kernel's hand-offs need (every contributor before its owner), so the whole schedule is
checked on the CPU: tiles cut across two or more programs, programs with nothing to do,
whole tiles after the stream-K ones, batches, epilogues, layouts, fp8. The number of
"SMs" is set per test to reach each case on small shapes.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tiledispatch import Dispatcher
from tiledispatch.ops.gemm import Activation, Epilogue, Family, GemmLayout, GemmProblem, GemmTypes, check_operands
from tiledispatch.ops.gemm.families.stream_k import stream_k_split
from tiledispatch.ops.gemm.inputs import make_inputs

from ...conftest import requires_gpu
from .tma_checks import ARCH, DEVICE, family_dispatcher, run_checked

gemm_plan = importlib.import_module("tiledispatch.ops.gemm.plan")  # the package exports a function `plan`


def stream_k_dispatcher(rule_set: str) -> Dispatcher:
    return family_dispatcher(Family.STREAM_K, rule_set)


@pytest.fixture(scope="module")
def tests_set() -> Dispatcher:
    return stream_k_dispatcher("tests")


@pytest.fixture
def sms(monkeypatch):
    """Sets how many programs the persistent grid may have (the interpreter's default is 4)."""
    def set_count(count: int) -> None:
        monkeypatch.setattr(gemm_plan, "_programs", lambda device: count)
    return set_count


def run(dispatcher: Dispatcher, problem: GemmProblem, *, kernel=None, broadcast_b=False, seed=0):
    return run_checked(dispatcher, Family.STREAM_K, problem, kernel=kernel, broadcast_b=broadcast_b, seed=seed)


@pytest.mark.parametrize("tiles, k_tiles, sms, want", [
    (96, 32, 132, (132, 96)),  # fewer tiles than SMs: every tile is dealt out
    (512, 64, 132, (132, 116)),  # 3 whole waves, then 116 tiles dealt over all 132
    (264, 8, 132, (132, 0)),  # whole waves only: no stream-K phase
    (2, 3, 132, (6, 2)),  # fewer K iterations than SMs: one program per iteration
])
def test_split_deals_the_partial_wave(tiles, k_tiles, sms, want):
    assert stream_k_split(tiles, k_tiles, sms) == want


@pytest.mark.parametrize("m, n, k, sms_count", [
    (32, 64, 320, 7),  # 2 tiles of 10 K iterations over 7 programs: most cut across 3-4 programs
    (96, 96, 96, 4),  # 9 tiles over 4: 8 whole, 1 of 3 iterations over 4 programs (one gets none)
    (64, 64, 96, 4),  # 4 tiles over 4: whole tiles only
    (80, 48, 224, 3),  # edge tiles in M and K; 6 tiles over 3: whole tiles only
    (80, 48, 224, 5),  # the same over 5: 5 whole tiles, 1 dealt over 5 programs
])
def test_schedules(tests_set, sms, m, n, k, sms_count):
    sms(sms_count)
    run(tests_set, GemmProblem(m, n, k, types=GemmTypes.parse("fp16")), seed=m + k)


@pytest.mark.parametrize("layout", ["rrr", "crr", "ccr"])
def test_layouts(tests_set, sms, layout):
    sms(5)
    run(tests_set, GemmProblem(64, 96, 160, types=GemmTypes.parse("fp16"), layout=GemmLayout.parse(layout)))


@pytest.mark.parametrize("epilogue", [Epilogue(True, Activation.GELU, True), Epilogue(False, Activation.SILU, True)],
                         ids=lambda e: e.name)
def test_batched_broadcast_with_epilogue(tests_set, sms, epilogue):
    # 3 batches x 2 x 2 tiles = 12 over 5 programs: 10 whole, 2 dealt; B broadcast over the batch.
    # The owner applies the epilogue once, to the sum of every segment.
    sms(5)
    problem = GemmProblem(64, 48, 160, batch=3, types=GemmTypes.parse("fp16"), epilogue=epilogue)
    run(tests_set, problem, broadcast_b=True)


def test_fp8_scaled(tests_set, sms):
    sms(6)
    run(tests_set, GemmProblem(64, 64, 256, types=GemmTypes.parse("fp8e4m3"), layout=GemmLayout.parse("rcr")))


def test_fp32_accumulates_in_a_fixed_order(tests_set, sms):
    """Owners add the other segments nearest first, whatever finished first: equal bits."""
    sms(7)
    problem = GemmProblem(32, 64, 320, types=GemmTypes.parse("fp32"), layout=GemmLayout.parse("rcr"))
    first = run(tests_set, problem, seed=3)
    second = run(tests_set, problem, seed=3)
    assert torch.equal(first, second)


def test_plan_asks_for_zeroed_flags(tests_set, sms):
    """A replay must zero the flags anew (a set flag would let an owner read a stale partial)."""
    sms(7)
    inputs = make_inputs(GemmProblem(32, 64, 320, types=GemmTypes.parse("fp16")), device=DEVICE)
    ops = check_operands(inputs.a, inputs.b, out=inputs.out)
    spec = tests_set.select(ops.problem)
    plan = spec.definition.plan(spec.config, ops)
    (flags,) = plan.zeroed
    assert flags.dtype == torch.int32 and flags.shape == (7, 2) and not flags.any()
    assert any(arg is flags for arg in plan.launches[0].args)


def test_plan_with_whole_tiles_only_zeroes_nothing(tests_set, sms):
    """With no tile dealt out the kernel never reads the flags: no memset on each replay."""
    sms(4)
    inputs = make_inputs(GemmProblem(64, 64, 96, types=GemmTypes.parse("fp16")), device=DEVICE)
    ops = check_operands(inputs.a, inputs.b, out=inputs.out)
    spec = tests_set.select(ops.problem)
    assert spec.definition.plan(spec.config, ops).zeroed == ()


def test_refuses_split_k_and_epilogue_slices():
    from tiledispatch.ops.gemm.rules import GemmRule, validate

    spec = next(iter(stream_k_dispatcher("tests").registry))
    for change in ({"split_k": 2}, {"epilogue_split": 2}, {"flatten": True}):
        from dataclasses import replace

        result = validate(replace(spec.config, **change), ARCH)
        assert GemmRule.PERSISTENT_OPTIONS in result.broken_rules(), change


# -- on the GPU: every stream-k tile of the rule sets, and the fast path's replay -------------------------


@requires_gpu
@pytest.mark.parametrize("dtype, layout", [("bf16", "rcr"), ("bf16", "rrr"), ("fp16", "crr"), ("fp8e4m3", "rcr")])
@pytest.mark.parametrize("m, n, k", [(272, 400, 336), (200, 1000, 4096)])
def test_every_full_tile_on_gpu(dtype, layout, m, n, k):
    """The `full` set's stream-k tiles (large, 4-8 warps): 4-16 tiles over the GPU's SMs, all dealt."""
    dispatcher = stream_k_dispatcher("full")
    problem = GemmProblem(m, n, k, batch=2, types=GemmTypes.parse(dtype), layout=GemmLayout.parse(layout))
    names = [s.name for s in dispatcher.registry if s.definition.supports(s.config, problem) is None]
    assert len(names) >= 5, names
    for seed, name in enumerate(names):
        run(dispatcher, problem, kernel=name, seed=seed)


@requires_gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8e4m3"])
def test_epilogue_on_gpu(tests_set, dtype):
    problem = GemmProblem(200, 160, 1024, batch=3, types=GemmTypes.parse(dtype), layout=GemmLayout.parse("rcr"),
                          epilogue=Epilogue(True, Activation.GELU, True))
    run(tests_set, problem)


@requires_gpu
def test_fast_path_zeroes_the_flags_on_every_call():
    """Replays allocate fresh flags as zeros: with stale ones set, owners would read old partials."""
    import tiledispatch

    name = f"gemm_bf16_rcr_stream-k_128x128x64_w8_s4_g8_k1_none_{ARCH.tag}"
    dispatcher = stream_k_dispatcher("full")  # one dispatcher: calls after the first replay its bound plan
    for seed in range(4):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(384, 2048, device="cuda", generator=g).bfloat16()
        b = torch.randn(640, 2048, device="cuda", generator=g).bfloat16().t()
        out = tiledispatch.gemm(a, b, kernel=name, dispatcher=dispatcher)
        torch.cuda.synchronize()
        want = a.double() @ b.double()
        assert torch.allclose(out.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item()), seed
