"""The toeplitz family: depthwise 2-D convolution on tensor cores, every direction (kernels/toeplitz.py).

The walk is a Gluon kernel (GPU only), which builds its banded filters itself; here its plan
and rules are checked, and its sm_90 build in test_build.py. On the GPU every default tile runs
odd shapes (widths off the 8-column chunks, channels off the channel blocks, no
padding, padding past the filter) against PyTorch's float64 convolution, output NaN-poisoned.
"""

from __future__ import annotations

import dataclasses

import pytest

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core.dtypes import DType
from tiledispatch.ops.conv import (
    ConvRule,
    ConvSignature,
    ConvTypes,
    Direction,
    Family,
    ToeplitzConfig,
    check_operands,
    supports,
    validate,
)
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.plan import kernel_units, plan
from tiledispatch.ops.conv.problem import ConvEpilogue, ConvSpecialization
from tiledispatch.ops.conv.families.toeplitz import (KW, NW, TOEPLITZ_FINISH_STEPS, toeplitz_register_cap,
                                                     toeplitz_walk_steps)
from tiledispatch.ops.gemm.problem import Activation

from ...conftest import requires_gpu
from .helpers import ARCH, DEVICE, problem, run_and_check

SM90 = arch.load("sm_90")
FWD = ConvSignature(Direction.FORWARD, ConvTypes(DType.BF16))
BWDD = dataclasses.replace(FWD, direction=Direction.BWD_DATA)
BWDW = dataclasses.replace(FWD, direction=Direction.BWD_WEIGHT)
TILE = ToeplitzConfig(FWD, 16, 32, 16, 28, 7)
WEIGHT_TILE = ToeplitzConfig(BWDW, 16, 32, 16, 28, 7, split_k=4)


def test_rules():
    for direction in (Direction.FORWARD, Direction.BWD_DATA):
        for rows in (1, 3, 7):
            assert validate(dataclasses.replace(TILE, signature=dataclasses.replace(FWD, direction=direction),
                                                filter_rows=rows), SM90).ok
    assert validate(dataclasses.replace(TILE, block_c=16, num_warps=8, filter_rows=9), SM90).ok  # 162 as built
    cases = {
        ConvRule.FAMILY_ARCH: (TILE, arch.load("interpreter")),
        ConvRule.FAMILY_DTYPE: (dataclasses.replace(TILE, signature=ConvSignature(Direction.FORWARD,
                                                                                  ConvTypes(DType.FP32))), SM90),
        ConvRule.VECTOR_WIDTH: (dataclasses.replace(TILE, block_c=24), SM90),
        ConvRule.TILE_POWER_OF_TWO: (dataclasses.replace(TILE, block_m=8), SM90),
        ConvRule.WARPS_FOR_TILE: (dataclasses.replace(TILE, block_c=8, num_warps=16), SM90),
        ConvRule.SPLIT_K: (dataclasses.replace(TILE, split_k=4), SM90),
        ConvRule.WINDOW: (dataclasses.replace(TILE, filter_rows=10), SM90),
        # past 128 registers a thread of 16 warps: the sm_90 build of 9 rows spilled (a 64-byte stack)
        ConvRule.REGISTER_BUDGET: (dataclasses.replace(TILE, filter_rows=9), SM90),
    }
    assert validate(WEIGHT_TILE, SM90).ok and WEIGHT_TILE.name.endswith("_16x32_w16_r28_f7_k4_none")
    assert validate(dataclasses.replace(WEIGHT_TILE, block_m=32, block_c=16, num_warps=8, filter_rows=9), SM90).ok
    weight_cases = {  # backward-weight: the forward's tiles, split over the items
        ConvRule.WARPS_FOR_TILE: dataclasses.replace(WEIGHT_TILE, block_c=8),
        ConvRule.TILE_POWER_OF_TWO: dataclasses.replace(WEIGHT_TILE, block_m=8),
        ConvRule.REGISTER_BUDGET: dataclasses.replace(WEIGHT_TILE, block_m=32, filter_rows=5),  # 132 of 128: spilled
        ConvRule.SPLIT_K: dataclasses.replace(WEIGHT_TILE, split_k=65),
    }
    for rule, config in weight_cases.items():
        assert rule in validate(config, SM90).broken_rules(), (rule, config.name)
    for epilogue in (ConvEpilogue(True, Activation.GELU, True), ConvEpilogue(False, Activation.SILU, False)):
        assert validate(dataclasses.replace(TILE, signature=dataclasses.replace(FWD, epilogue=epilogue)), SM90).ok
    for rule, (config, target) in cases.items():
        assert rule in validate(config, target).broken_rules(), (rule, config.name)
    assert TILE.name == "conv_fwd_bf16_toeplitz_16x32_w16_r28_f7_none"


def test_supports_says_why_not():
    def p(direction="forward", c=64, k=64, g=64, size=(12, 12), filt=(7, 7), stride=1, pad=3, dilation=1):
        q = problem(direction, 2, c, k, g, size, filt, stride, pad, dilation, "bf16")
        return dataclasses.replace(q, specialization=q.dense_specialization())

    assert supports(TILE, p()) is None
    assert supports(TILE, p(filt=(7, 3), pad=(3, 1))) is None  # narrower filters fit the band
    assert supports(dataclasses.replace(TILE, signature=BWDD), p("bwd_data")) is None
    assert supports(WEIGHT_TILE, p("bwd_weight")) is None
    assert supports(WEIGHT_TILE, p("bwd_weight", filt=(7, 9), pad=(3, 4))) is None  # 9 diagonals of the 16 x 8 sums
    assert "up to 9 wide" in supports(WEIGHT_TILE, p("bwd_weight", filt=(7, 11), pad=(3, 5)))
    assert "depthwise only" in supports(TILE, p(k=128))
    assert "2-D" in supports(TILE, p(size=(12,), filt=(7,), pad=3))
    assert "stride 1 and dilation 1" in supports(TILE, p(stride=2))
    assert "stride 1 and dilation 1" in supports(TILE, p(dilation=(2, 1), pad=(6, 3)))
    assert "7 rows tall" in supports(TILE, p(filt=(5, 5), pad=2))
    assert "up to 9 wide" in supports(TILE, p(filt=(7, 11), pad=(3, 5)))
    unaligned = problem("forward", 2, 60, 60, 60, (12, 12), (7, 7), 1, 3, 1, "bf16")
    assert "16-byte vectors" in supports(TILE, dataclasses.replace(
        unaligned, specialization=unaligned.dense_specialization()))


def test_plan_walks_dy_with_the_flipped_filter_for_backward_data():
    """Backward-data at stride 1 is the forward walk over dy: the walk flips the filter (FLIP),
    padding becomes F - 1 - P, and it reads dy's rows into dx's. One launch: the walk gathers its
    banded filters from w by w's strides."""
    for direction in (Direction.FORWARD, Direction.BWD_DATA):
        config = dataclasses.replace(TILE, signature=dataclasses.replace(FWD, direction=direction), filter_rows=5)
        (walk,) = kernel_units(config, ConvSpecialization())
        assert walk.stage == "main" and walk.kind.value == "gluon"
        assert dict(walk.constexprs)["FLIP"] is (direction is Direction.BWD_DATA)
        p = problem(direction, 3, 40, 40, 40, (9, 21), (5, 3), 1, (1, 2), 1, "fp16")
        inputs = make_inputs(p, device="cpu")
        ops = check_operands(direction, **inputs.kwargs(p))
        launches = plan(dataclasses.replace(config, signature=dataclasses.replace(
            config.signature, types=ConvTypes(DType.FP16))), ops).launches
        assert [launch.stage for launch in launches] == ["main"]
        args = dict(zip([name for name, _ in walk.signature], launches[0].args))
        pads = (1, 2) if direction is Direction.FORWARD else (5 - 1 - 1, 3 - 1 - 2)
        assert (args["PH"], args["PW"]) == pads
        assert args["w_ptr"] is ops.w and args["FX"] == 3
        assert (args["swk"], args["swy"], args["swx"]) == (ops.w.stride(0), ops.w.stride(2), ops.w.stride(3))
        out_h, out_w = (p.output_size if direction is Direction.FORWARD else p.input_size)
        assert (args["OH"], args["OW"]) == (out_h, out_w)
        assert launches[0].grid == (-(-3 * -(-out_w // NW) // 16), -(-40 // 32), -(-out_h // 28))


def test_plan_sums_backward_weights_slabs():
    """Backward-weight: the walk writes split_k fp32 slabs [C, FY * FX], the reduce stage sums them into dw."""
    config = dataclasses.replace(WEIGHT_TILE, signature=dataclasses.replace(BWDW, types=ConvTypes(DType.FP16)),
                                 filter_rows=5)
    walk, reduce = kernel_units(config, ConvSpecialization())
    assert (walk.stage, reduce.stage) == ("main", "reduce") and walk.kind.value == "gluon"
    assert dict(reduce.constexprs)["SPLIT_K"] == 4
    p = problem("bwd_weight", 3, 40, 40, 40, (9, 21), (5, 3), 1, (1, 2), 1, "fp16")
    ops = check_operands(Direction.BWD_WEIGHT, **make_inputs(p, device="cpu").kwargs(p))
    launches = plan(config, ops).launches
    assert [launch.stage for launch in launches] == ["main", "reduce"]
    args = dict(zip([name for name, _ in walk.signature], launches[0].args))
    assert args["ws_ptr"].numel() == 4 * 40 * 5 * 3 and args["FX"] == 3
    assert launches[0].grid == (-(-40 // 32), 4, 1)  # channel blocks x the splits
    assert dict(walk.constexprs) == {"BLOCK_M": 16, "BLOCK_C": 32, "ROWS": 28, "FILTER_ROWS": 5, "KW": KW,
                                     "NW": NW, "VEC": 8, "SPLIT_K": 4}


def test_small_walks_are_capped_so_that_their_programs_share_an_sm():
    """A walk of fewer than 16 warps compiles under the cap that lets the most programs its register
    estimate allows share an SM (uncapped, ptxas spent more: 16x16 over 8 warps at 3 rows took 92
    registers, two programs an SM instead of three). One program an SM, or backward-weight: ptxas's own."""
    registers = SM90.registers_per_sm

    def cap(m, c, w, rows, signature=FWD):
        return toeplitz_register_cap(ToeplitzConfig(signature, m, c, w, 14, rows), registers)

    assert (cap(16, 16, 8, 3), cap(16, 16, 8, 5), cap(16, 16, 8, 7)) == (80, 128, 128)
    assert cap(16, 16, 8, 9) is None  # its estimate passes 128: one program an SM
    assert cap(16, 32, 16, 5) is None and cap(16, 16, 8, 3, BWDW) is None
    assert cap(16, 16, 8, 3, BWDD) == 80
    (walk,) = kernel_units(ToeplitzConfig(FWD, 16, 16, 8, 14, 3), ConvSpecialization())
    assert walk.max_registers == 80


@pytest.mark.parametrize(("size", "filt", "pad", "rows", "steps", "finishes"), [
    ((14, 14), 5, 2, 28, 15, 1),  # the suite's 5x5: 20 steps before padding's were skipped
    ((28, 28), 7, 3, 28, 28, 3),  # ConvNeXt's 7x7: 35 steps
    ((28, 28), 3, 1, 28, 30, 0),  # 28 real rows are 10 turns of 3 that finish every row
    ((56, 56), 7, 3, 28, 35, 0),  # two bands: each walks its 28 rows and 6 of halo, as before
    ((5, 9), 3, 4, 28, 9, 2),  # padding past the filter: 9 steps finish rows 0-8, rows 9 and 10 after
])
def test_the_walks_model_counts_its_steps_as_the_kernel_takes_them(size, filt, pad, rows, steps, finishes):
    """The forward walk starts at the first real input row and stops after the last, in whole turns of
    filter_rows steps; the output rows still in its slots are finished after it (no load, no MMA)."""
    for direction in (Direction.FORWARD, Direction.BWD_DATA)[:1 if pad > filt - 1 else 2]:
        # backward-data walks dy with padding F - 1 - P: the same walk for the problem's padding P
        p = problem(direction, 2, 32, 32, 32, size, (filt, filt), 1, pad if direction is Direction.FORWARD
                    else filt - 1 - pad, 1, "bf16")
        config = ToeplitzConfig(dataclasses.replace(FWD, direction=direction), 16, 32, 16, rows, filt)
        assert toeplitz_walk_steps(config, p) == pytest.approx(steps + TOEPLITZ_FINISH_STEPS * finishes)


SM90_SUITE = {  # benchmarks' conv.json depthwise 2-D cases: N, C, spatial, filter, padding; the walk wins at 5x5 and 7x7
    "depthwise_mbv2_3x3": ((32, 384, (28, 28), (3, 3), 1), "direct"),
    "depthwise_5x5": ((32, 672, (14, 14), (5, 5), 2), "toeplitz"),
    "convnext_dw7x7": ((32, 384, (28, 28), (7, 7), 3), "toeplitz"),
}


@pytest.fixture(scope="module")
def sm90_dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "default", SM90), SM90)


@pytest.mark.parametrize("case", SM90_SUITE, ids=str)
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_DATA], ids=lambda d: d.value)
def test_rules_take_the_walk_where_it_ran_faster(sm90_dispatcher, direction, case):
    """Since the walk builds its own filters it ran convnext's 7x7 1.67x faster than the window kernel,
    the 5x5 1.17x and the 3x3 at 0.88x (H100, benchmarks/results/h100/conv_toeplitz_fit_main.csv):
    the rules follow."""
    (n, c, size, filt, pad), family = SM90_SUITE[case]
    p = problem(direction, n, c, c, c, size, filt, 1, pad, 1, "bf16")
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    ranked = [r.spec for r in sm90_dispatcher.explain(p).ranked if r.spec.family != "vendor"]
    assert ranked[0].family == family, ranked[0].name
    assert any(s.family == "toeplitz" for s in ranked)


@pytest.mark.parametrize(("case", "family"), [("depthwise_mbv2_3x3", "vendor"), ("depthwise_5x5", "toeplitz"),
                                             ("convnext_dw7x7", "toeplitz")])
def test_rules_take_the_weight_walk_where_it_ran_faster(sm90_dispatcher, case, family):
    """Backward-weight on the H100 (benchmarks/results/h100/conv_toeplitz_weight_banded.csv): the walk
    ran the 5x5 1.5x and the 7x7 1.6x cuDNN, the 3x3 0.98x; the rules follow, with its widest split
    for 56x56 maps only."""
    (n, c, size, filt, pad), _ = SM90_SUITE[case]
    p = problem("bwd_weight", n, c, c, c, size, filt, 1, pad, 1, "bf16")
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    first = sm90_dispatcher.explain(p).ranked[0].spec
    assert first.family == family, first.name
    if family == "toeplitz":
        assert first.config.split_k < 16


# -- on the GPU ------------------------------------------------------------------------------------
GPU_CASES = {  # N, C, spatial, filter, padding
    "convnext-7x7": (2, 384, (28, 28), (7, 7), 3),
    "5x5-odd": (3, 40, (14, 13), (5, 5), 2),  # 40 channels: a partial channel block
    "3x3-tall-no-pad": (2, 24, (61, 10), (3, 3), 0),  # several bands of rows, 8-column chunks past the edge
    "7x5-wide-pad": (1, 16, (9, 30), (7, 5), (4, 3)),  # padding past the filter's reach
    # padding deeper than the filter: the first and last two output rows see no input row at all
    "3x3-deep-pad": (2, 16, (5, 9), (3, 3), (4, 1)),
}


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    """The tests rule set: two toeplitz tiles a direction (backward-weight's split over 3 and 4 programs)."""
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)


@requires_gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_toeplitz_tile_on_the_gpu(dispatcher, direction, case, dtype):
    n, c, size, filt, pad = GPU_CASES[case]
    p = problem(direction, n, c, c, c, size, filt, 1, pad, 1, dtype)
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    specs = [r.spec for r in dispatcher.explain(ops.problem).ranked if r.spec.family == Family.TOEPLITZ.value]
    assert len(specs) == 2, [s.name for s in specs]
    for seed, spec in enumerate(specs):
        run_and_check(dispatcher, p, spec.name, seed=seed)


@requires_gpu
@pytest.mark.parametrize("epilogue", [ConvEpilogue(True, Activation.RELU, True), ConvEpilogue(True, Activation.GELU),
                                      ConvEpilogue(False, Activation.SILU, True)], ids=lambda e: e.name)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_toeplitz_forward_epilogue_on_the_gpu(dispatcher, epilogue, dtype):
    """ConvNeXt's depthwise conv has a bias: bias and activation where the MMA left a row, the residual
    added in fp32 in the store's layout, against the float64 reference of the whole epilogue."""
    p = problem("forward", 2, 40, 40, 40, (14, 13), (7, 7), 1, 3, 1, dtype, epilogue=epilogue)
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    specs = [r.spec for r in dispatcher.explain(ops.problem).ranked if r.spec.family == Family.TOEPLITZ.value]
    assert len(specs) == 2, [s.name for s in specs]
    for seed, spec in enumerate(specs):
        run_and_check(dispatcher, p, spec.name, seed=seed)
