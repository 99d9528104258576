"""The igemm-tma family: stride-1 forward, backward-data (the forward over dy) and backward-weight through
tensor descriptors.

On the CPU the interpreter executes the descriptors, so every tile of the `tests` rule
set runs (fp16; the family is 16-bit only) on 1-D, 2-D and 3-D convs with padding,
dilation, groups and partial pixel boxes, against the float64 reference, into a
NaN-poisoned output. The rules, refusals and plan are checked without a launch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core.dtypes import DType
from tiledispatch.ops.conv import (
    ConvRule,
    ConvSignature,
    ConvTypes,
    Direction,
    Family,
    SplitMode,
    auto_correct,
    check_operands,
    supports,
    validate,
)
from tiledispatch.ops.conv.config import TmaConfig
from tiledispatch.ops.conv.families.igemm_tma import register_a_operand, weight_matrix_descriptor
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.plan import kernel_units, plan
from tiledispatch.ops.conv.problem import ConvEpilogue
from tiledispatch.ops.conv.reference import compare
from tiledispatch.ops.conv.rulesets import TESTS_TMA
from tiledispatch.ops.gemm.problem import Activation

from .helpers import ARCH, DEVICE, ON_GPU, problem, run_and_check

SM80, SM90 = arch.load("sm_80"), arch.load("sm_90")
FWD = ConvSignature(Direction.FORWARD, ConvTypes(DType.FP16))
BWDW = ConvSignature(Direction.BWD_WEIGHT, ConvTypes(DType.FP16))
GOOD = TmaConfig(FWD, 8, 16, 128, 64, 8, 3)
TMA = Family.IMPLICIT_GEMM_TMA.value


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH).filter(lambda s: s.family == TMA), ARCH)


def tma_kernels(dispatcher, p) -> list[str]:
    """Every igemm-tma kernel that takes `p` (as check_operands sees it), best ranked first."""
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    return [c.spec.name for c in dispatcher.explain(ops.problem).ranked]


# -- the copy engine's zero fill is the conv's padding ---------------------------------------------
def test_a_box_reads_zeros_outside_the_tensor_negative_coordinates_included():
    """What the family rests on, checked where the tests run (the interpreter, or a GPU)."""
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def box(desc, out_ptr, h0, w0, BH: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr):
        t = desc.load([0, h0, w0, 0]).reshape(BH * BW, BC)
        tl.store(out_ptr + tl.arange(0, BH * BW)[:, None] * BC + tl.arange(0, BC)[None, :], t)

    x = torch.randn(1, 5, 6, 16, device=DEVICE).to(torch.float16)
    desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 4, 8, 16])
    padded = torch.zeros(1, 5 + 8, 6 + 16, 16, device=DEVICE, dtype=torch.float16)
    padded[:, 4:9, 8:14] = x
    for h0, w0 in ((-2, -3), (3, 2), (-4, -8), (4, 5)):
        out = torch.full((32, 16), float("nan"), device=DEVICE, dtype=torch.float16)
        box[(1,)](desc, out, h0, w0, 4, 8, 16)
        want = padded[0, h0 + 4:h0 + 8, w0 + 8:w0 + 16].reshape(32, 16)
        assert torch.equal(out, want), (h0, w0)


# -- every tile of the tests rule set ----------------------------------------------------------
CASES = {  # (n, c, k, g, size, filter, padding, dilation): odd sizes leave partial boxes in H and W
    "2d-pad1": (2, 32, 32, 1, (7, 9), (3, 3), 1, 1),
    "2d-nopad": (1, 32, 64, 1, (9, 6), (3, 2), 0, 1),
    "2d-dilated-asym": (1, 32, 32, 1, (10, 7), (3, 3), (2, 1), (2, 1)),
    "2d-groups": (1, 64, 64, 2, (5, 6), (3, 3), 1, 1),
    "2d-1x1": (2, 32, 48, 1, (5, 5), (1, 1), 0, 1),
    "2d-5x5-pad2": (1, 32, 32, 1, (6, 5), (5, 5), 2, 1),
    "1d": (2, 32, 16, 1, (20,), (3,), 1, 1),
    "1d-dilated-groups": (2, 64, 32, 2, (19,), (3,), 2, 2),
    "3d": (1, 32, 16, 1, (3, 4, 5), (3, 3, 3), 1, 1),
}


def _tile_ids():
    """The tiles of `tests` by direction that the rules keep on this arch (sm_90 refuses a
    backward-weight box of few pixels read from registers over 3 stages: REGISTER_A_PIPELINE)."""
    for t in TESTS_TMA:
        for direction in t.directions:
            config = TmaConfig(ConvSignature(direction, ConvTypes(DType.FP16)), t.tile_h, t.tile_w, t.block_out,
                               t.block_in, t.num_warps, t.num_stages, t.split_k, t.split_mode)
            if validate(config, ARCH).ok:
                yield direction, t


TWO_D = [case for case, args in CASES.items() if len(args[4]) == 2]


def _tile_index(direction, name: str) -> int:
    """The position of the tile that kernel `name` was made from among the direction's tiles of `tests`."""
    sig = ConvSignature(direction, ConvTypes(DType.FP16))
    tiles = [t for d, t in _tile_ids() if d is direction]
    return next(i for i, t in enumerate(tiles) if name.startswith(TmaConfig(
        sig, t.tile_h, t.tile_w, t.block_out, t.block_in, t.num_warps, t.num_stages, t.split_k, t.split_mode).name))


def covering(direction, case: str, names: list[str]) -> list[str]:
    """The kernels that run on `case`: all of them on the 1-D and 3-D cases; on the 2-D ones, which
    differ from one another by padding, dilation, groups and filter, a third of the tiles in turn, so
    that every tile meets two 2-D cases and every 2-D case one or two tiles (not every tile x every case)."""
    if case not in TWO_D:
        return names
    turn = TWO_D.index(case) % 3
    return [name for name in names if _tile_index(direction, name) % 3 == turn]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_every_tile(dispatcher, direction, case):
    n, c, k, g, size, filt, pad, dil = CASES[case]
    p = problem(direction, n, c, k, g, size, filt, 1, pad, dil)
    names = tma_kernels(dispatcher, p)
    steps = {Direction.FORWARD: c // g, Direction.BWD_DATA: k // g}  # the channels the forward kernel steps through
    tiles = [t for d, t in _tile_ids() if d is direction and (len(size) > 1 or t.tile_h == 1)
             and (direction is Direction.BWD_WEIGHT or steps[direction] % t.block_in == 0)]
    assert len(names) == len(tiles), names  # every tile that should take it does
    chosen = covering(direction, case, names)
    assert chosen, f"no tile of the covering takes {case}"
    for seed, name in enumerate(chosen):
        run_and_check(dispatcher, p, name, seed=seed)


@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_the_covering_meets_every_tile_on_two_2d_cases(dispatcher, direction):
    """Each tile of a direction runs on two 2-D cases (and on every 1-D and 3-D case it takes). No kernel runs."""
    met: dict[int, set[str]] = {}
    for case in TWO_D:
        n, c, k, g, size, filt, pad, dil = CASES[case]
        for name in covering(direction, case, tma_kernels(dispatcher, problem(direction, n, c, k, g, size, filt, 1,
                                                                               pad, dil))):
            met.setdefault(_tile_index(direction, name), set()).add(case)
    assert sorted(met) == list(range(len([t for d, t in _tile_ids() if d is direction])))
    assert all(len(cases) >= 2 for cases in met.values()), met


EPILOGUES = [ConvEpilogue(True, Activation.RELU, True), ConvEpilogue(True, Activation.GELU),
             ConvEpilogue(False, Activation.SILU, True)]


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: e.name)
def test_forward_epilogue(dispatcher, epilogue):
    """Each epilogue on one of the three forward tiles, each tile under one epilogue (not 3 x 3)."""
    p = problem("forward", 2, 32, 48, 1, (7, 9), (3, 3), 1, 1, epilogue=epilogue)
    names = sorted(tma_kernels(dispatcher, p))
    assert len(names) == len(EPILOGUES)
    run_and_check(dispatcher, p, names[EPILOGUES.index(epilogue)])


def test_output_channels_past_a_group_are_masked(dispatcher):
    """K/G = 16 with block_out = 32: the box of weights (forward) or dy (backward-weight) runs into the next
    group's channels; those rows and columns of the tile must never reach the output."""
    for direction in Direction:
        p = problem(direction, 1, 64, 64, 4, (6, 7), (3, 3), 1, 1)  # C/G = K/G = 16
        names = [n for n in tma_kernels(dispatcher, p) if "x32x" in n]
        assert names
        for name in names:
            run_and_check(dispatcher, p, name)


def test_backward_data_replays_through_a_bound_call(dispatcher):
    """The fast path replays backward-data's two stages on new tensors: the turn of the new filter into a
    scratch weight made anew each call, then the forward kernel's descriptors rebased onto it and onto dy."""
    from tiledispatch.ops.conv import fastpath

    p = problem("bwd_data", 2, 32, 32, 2, (6, 7), (3, 3), 1, 1)
    name = tma_kernels(dispatcher, p)[0]
    first = make_inputs(p, device=DEVICE, seed=0)
    bound = fastpath.bind(dispatcher, check_operands(p.direction, **first.kwargs(p)), name)
    assert isinstance(bound, fastpath.BoundConv)
    for seed in (1, 2):
        fresh = make_inputs(p, device=DEVICE, seed=seed)  # out poisoned with NaN
        tensors = tuple(fresh.out if role == "out" else getattr(fresh, role) for role in fastpath.ROLES)
        assert bound(tensors) is fresh.out
        assert compare(fresh.out, check_operands(p.direction, **fresh.kwargs(p))).passed


def test_split_modes_agree_and_the_workspace_is_deterministic(dispatcher):
    p = problem("bwd_weight", 2, 32, 32, 1, (9, 8), (3, 3), 1, 1)
    names = tma_kernels(dispatcher, p)
    workspace = next(n for n in names if "k3ws" in n)
    atomic = next(n for n in names if "at_" in n)
    inputs = make_inputs(p, device=DEVICE, seed=3)
    ops = check_operands(p.direction, **inputs.kwargs(p))
    first = dispatcher.run(ops, kernel=workspace).clone()
    assert torch.equal(dispatcher.run(ops, kernel=workspace), first)
    assert compare(dispatcher.run(ops, kernel=atomic), ops).passed


def test_weight_views_and_padded_pixel_strides():
    """A weight that is not dense GKYXC is copied for the 2-D descriptor; activations with padded pixel
    strides (a channels-last slice of a wider tensor) are read in place."""
    p = problem("forward", 1, 32, 32, 1, (6, 7), (3, 3), 1, 1)
    config = TmaConfig(FWD, 4, 8, 16, 16, 4, 2)
    wide = torch.randn(32, 48, 3, 3, device=DEVICE).to(torch.float16).to(memory_format=torch.channels_last)
    w = wide[:, 8:40]  # channels-last, row stride 9 * 48: not dense
    x_wide = torch.randn(1, 64, 6, 7, device=DEVICE).to(torch.float16).to(memory_format=torch.channels_last)
    x = x_wide[:, :32]
    out = torch.full((1, 32, 6, 7), float("nan"), device=DEVICE, dtype=torch.float16).to(
        memory_format=torch.channels_last)
    ops = check_operands("forward", x=x, w=w, padding=1, out=out)
    assert ops.problem.specialization.groups_aligned and supports(dataclasses.replace(
        config, signature=ConvSignature.of(ops.problem)), ops.problem) is None
    desc = weight_matrix_descriptor(w, (16, 16))
    assert desc.base.data_ptr() != w.data_ptr() and desc.shape == [32, 9 * 32]
    dense = w.contiguous(memory_format=torch.channels_last)
    assert weight_matrix_descriptor(dense, (16, 16)).base.data_ptr() == dense.data_ptr()
    d = Dispatcher(Registry.from_rule_set("conv", "tiny", ARCH), ARCH)
    name = next(c.spec.name for c in d.explain(ops.problem).ranked if c.spec.family == TMA)
    d.run(ops, kernel=name)
    assert compare(out, ops).passed
    assert p.output_size == ops.problem.output_size


# -- refusals ------------------------------------------------------------------------------------
def test_refusals_say_why():
    fwd = TmaConfig(FWD, 4, 8, 16, 32, 4, 2)
    assert supports(fwd, problem("forward", 1, 32, 32, 1, (8, 8), (3, 3), 1, 1)) is None
    assert "stride 1" in supports(fwd, problem("forward", 1, 32, 32, 1, (8, 8), (3, 3), 2, 1))
    unaligned = problem("forward", 1, 36, 32, 1, (8, 8), (3, 3), 1, 1)
    unaligned = dataclasses.replace(unaligned, specialization=unaligned.dense_specialization())
    assert "16 bytes" in supports(fwd, unaligned)
    assert "multiple" in supports(fwd, problem("forward", 1, 48, 32, 1, (8, 8), (3, 3), 1, 1))  # C/G 48 % 32
    assert "1-D" in supports(fwd, problem("forward", 1, 32, 32, 1, (64,), (3,), 1, 1))
    assert supports(dataclasses.replace(fwd, tile_h=1, tile_w=32), problem("forward", 1, 32, 32, 1, (64,), (3,),
                                                                            1, 1)) is None
    weight = TmaConfig(BWDW, 4, 8, 16, 32, 4, 2)  # backward-weight: any C/G (its blocks are masked on the store)
    assert supports(weight, problem("bwd_weight", 1, 48, 40, 1, (8, 8), (3, 3), 1, 1)) is None
    assert "bwd_data" in supports(weight, problem("bwd_data", 1, 32, 32, 1, (8, 8), (3, 3), 1, 1))
    data = TmaConfig(ConvSignature(Direction.BWD_DATA, ConvTypes(DType.FP16)), 4, 8, 16, 32, 4, 2)
    assert supports(data, problem("bwd_data", 1, 48, 32, 1, (8, 8), (3, 3), 1, 1)) is None  # any C/G
    assert "K/G=48" in supports(data, problem("bwd_data", 1, 32, 48, 1, (8, 8), (3, 3), 1, 1))
    assert "negative" in supports(data, problem("bwd_data", 1, 32, 32, 1, (8, 8), (3, 3), 1, 3))


def test_unaligned_and_strided_problems_get_no_tma_kernel(dispatcher):
    for p in (problem("forward", 1, 36, 32, 1, (8, 8), (3, 3), 1, 1),
              problem("bwd_weight", 1, 32, 32, 1, (9, 9), (3, 3), 2, 1)):
        assert tma_kernels(dispatcher, p) == []
        ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
        same = [c for c in dispatcher.explain(ops.problem).refused
                if ConvSignature.of(ops.problem) == c.spec.config.signature]
        assert same and all("igemm-tma" in c.refused for c in same)


# -- rules -------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, rule", [
    ({"tile_h": 3}, ConvRule.TILE_POWER_OF_TWO),
    ({"block_in": 48}, ConvRule.TILE_POWER_OF_TWO),
    ({"block_in": 8}, ConvRule.TENSOR_CORE_MINIMUM),
    ({"tile_h": 2, "tile_w": 4, "num_warps": 4}, ConvRule.TENSOR_CORE_MINIMUM),
    ({"tile_h": 16, "tile_w": 32, "block_out": 32, "num_stages": 2}, ConvRule.TILE_MAXIMUM),
    ({"tile_h": 1, "block_out": 16, "block_in": 16, "num_warps": 1, "num_stages": 9}, ConvRule.STAGES),
    ({"num_stages": 8}, ConvRule.SHARED_MEMORY),
    ({"tile_h": 16, "block_out": 256, "num_stages": 1}, ConvRule.REGISTER_BUDGET),
    ({"split_k": 2}, ConvRule.SPLIT_K),
    ({"signature": ConvSignature(Direction.FORWARD, ConvTypes(DType.FP32, True))}, ConvRule.FAMILY_DTYPE),
])
def test_each_rule_breaks_alone(change, rule):
    assert validate(GOOD, SM90).ok
    assert set(validate(dataclasses.replace(GOOD, **change), SM90).broken_rules()) == {rule}


def test_family_arch_split_mode_and_register_a_operand():
    assert set(validate(GOOD, SM80).broken_rules()) == {ConvRule.FAMILY_ARCH}
    weight = TmaConfig(BWDW, 8, 16, 128, 128, 8, 3)
    assert validate(weight, SM90).ok and register_a_operand(weight)
    assert not register_a_operand(dataclasses.replace(weight, tile_h=1, tile_w=128))
    assert not register_a_operand(GOOD)  # forward reads its pixels as wgmma's B
    # dy^T in registers beside a 128x256 accumulator: ptxas spills it (sm_90, 8 warps)
    assert ConvRule.REGISTER_BUDGET in validate(dataclasses.replace(weight, block_in=256, num_stages=2),
                                                SM90).broken_rules()
    assert validate(dataclasses.replace(weight, tile_h=1, tile_w=128, block_in=256, num_stages=2), SM90).ok
    atomic = dataclasses.replace(weight, split_mode=SplitMode.ATOMIC)
    assert set(validate(atomic, SM90).broken_rules()) == {ConvRule.SPLIT_MODE}


def test_few_pixel_register_a_boxes_keep_two_stages_where_wgmma_reads_them():
    weight = TmaConfig(BWDW, 4, 16, 128, 128, 8, 4)
    assert register_a_operand(weight)
    assert set(validate(weight, SM90).broken_rules()) == {ConvRule.REGISTER_A_PIPELINE}
    assert set(validate(dataclasses.replace(weight, tile_h=2, tile_w=32, num_stages=3), SM90).broken_rules()) == {
        ConvRule.REGISTER_A_PIPELINE}
    for kept in (dataclasses.replace(weight, num_stages=2), dataclasses.replace(weight, tile_h=8, num_stages=3),
                 dataclasses.replace(weight, tile_h=1, tile_w=64)):  # 2 stages; 128 pixels; dy^T in shared memory
        assert validate(kept, SM90).ok, kept.name
    assert validate(weight, arch.load("interpreter")).ok  # no wgmma there
    assert validate(TmaConfig(FWD, 4, 16, 128, 64, 8, 4), SM90).ok  # forward's pixels are B, in shared memory


@pytest.mark.skipif(not ON_GPU, reason="wgmma's register-A pipeline: compiled code on sm_90")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_register_a_boxes_the_rules_keep_sum_right_over_many_waves(dtype):
    """The backward-weight on which 4x16 boxes over 4 stages summed wrong (8 x 7x7, 3x3, 512 -> 1152:
    324 programs): every `default` box that copies dy^T to registers and that the rules keep, unsplit,
    three seeds each."""
    from tiledispatch import KernelSpec, OpKind
    from tiledispatch.ops.conv.rulesets import WEIGHT_TMA_TILES

    p = problem("bwd_weight", 8, 512, 1152, 1, (7, 7), (3, 3), 1, 1, 1, dtype=dtype)
    sig = ConvSignature(Direction.BWD_WEIGHT, ConvTypes.parse(dtype))
    configs = [TmaConfig(sig, t.tile_h, t.tile_w, t.block_out, t.block_in, t.num_warps, t.num_stages)
               for t in WEIGHT_TMA_TILES if t.tile_h > 1]
    kept = [KernelSpec(OpKind.CONV, c, ARCH.name) for c in configs if validate(c, ARCH).ok]
    assert kept and len(kept) < len(configs)  # the 4x16 box over 4 stages is refused
    dispatcher = Dispatcher(Registry(kept), ARCH)
    for spec in kept:
        for seed in range(3):
            run_and_check(dispatcher, p, spec.name, seed=seed)


def test_auto_correct():
    bad = dataclasses.replace(GOOD, tile_h=16, tile_w=32, num_stages=9)
    fixed, corrections = auto_correct(bad, SM90)
    assert validate(fixed, SM90).ok and {c.field for c in corrections} >= {"num_stages"}
    assert fixed.pixels <= 256


def test_names_and_units():
    assert GOOD.name == "conv_fwd_fp16_igemm-tma_8x16x128x64_w8_s3_k1_none"
    weight = TmaConfig(BWDW, 1, 128, 128, 64, 8, 3, split_k=4)
    assert weight.name == "conv_bwdw_fp16_igemm-tma_1x128x128x64_w8_s3_k4ws_none"
    assert weight.gemm_tile == (128, 64, 128) and GOOD.gemm_tile == (128, 128, 64)
    (main,) = kernel_units(GOOD)
    kinds = dict(main.signature)
    assert kinds["x_desc"] == "tensordesc<fp16[1,1,8,16,64]>" and kinds["w_desc"] == "tensordesc<fp16[128,64]>"
    main, reduce = kernel_units(weight)
    kinds = dict(main.signature)
    assert kinds["dy_desc"] == "tensordesc<fp16[1,1,1,128,128]>" and kinds["ws_ptr"] == "*fp32"
    assert reduce.stage == "reduce" and ("CG", 8) in main.divisibility
    data = dataclasses.replace(GOOD, signature=ConvSignature(Direction.BWD_DATA, ConvTypes(DType.FP16)))
    assert data.name == "conv_bwdd_fp16_igemm-tma_8x16x128x64_w8_s3_k1_none" and validate(data, SM90).ok
    (main,) = kernel_units(data)  # the forward's own kernel, reading the filter turned
    kinds, constants = dict(main.signature), dict(main.constexprs)
    assert main.function == kernel_units(GOOD)[0].function and constants["TURNED_WEIGHT"]
    assert not dict(kernel_units(GOOD)[0].constexprs)["TURNED_WEIGHT"]
    assert kinds["w_desc"] == "tensordesc<fp16[64,128]>"  # [K/G rows (the reduction), C/G columns] of the filter


def test_plan_grid():
    p = problem("forward", 2, 64, 64, 2, (14, 14), (3, 3), 1, 1)
    config = TmaConfig(FWD, 8, 16, 16, 16, 4, 2)
    inputs = make_inputs(p, device=DEVICE)
    ops = check_operands(p.direction, **inputs.kwargs(p))
    (launch,) = plan(config, ops).launches
    assert launch.grid == (2 * 2 * 1 * 2, 2, 1)  # (n, box rows, box cols) x K/G blocks, groups
    w = problem("bwd_weight", 2, 64, 64, 2, (14, 14), (3, 3), 1, 1)
    ops = check_operands(w.direction, **make_inputs(w, device=DEVICE).kwargs(w))
    main, reduce = plan(TmaConfig(BWDW, 8, 16, 16, 32, 4, 2, split_k=3), ops).launches
    assert main.grid == (9 * 2 * 1, 2, 3) and reduce.stage == "reduce"
    d = problem("bwd_data", 2, 32, 64, 2, (14, 14), (3, 3), 1, 1)  # C/G = 16 outputs of the forward over dy
    ops = check_operands(d.direction, **make_inputs(d, device=DEVICE).kwargs(d))
    data = TmaConfig(ConvSignature(Direction.BWD_DATA, ConvTypes(DType.FP16)), 8, 16, 16, 16, 4, 2)
    made = plan(data, ops)
    (main,) = made.launches
    assert main.grid == (2 * 2 * 1 * 1, 2, 1) and made.scratch == ()  # no turned copy of the filter


def test_ranking_prefers_boxes_that_fit_the_map():
    from tiledispatch.ops.conv.ranking import rule_score

    p = problem("forward", 32, 256, 256, 1, (14, 14), (3, 3), 1, 1, 1, "bf16")  # resnet50 3x3
    sig = ConvSignature.of(p)
    square = rule_score(TmaConfig(sig, 16, 16, 128, 64, 8, 3), p, SM90)
    row = rule_score(TmaConfig(sig, 1, 128, 128, 64, 8, 3), p, SM90)
    assert square.value > 2 * row.value and square.terms["box"] == pytest.approx((14 / 16) ** 2)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's arch")
def test_registry_has_the_family_on_the_interpreter():
    registry = Registry.from_rule_set("conv", "tiny", ARCH)
    assert TMA in registry.counts()["by_family"]
