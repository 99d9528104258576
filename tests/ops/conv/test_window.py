"""The direct family's sliding-window kernels (depthwise, every direction).

Each run writes a NaN-poisoned output that is compared with PyTorch's CPU convolution in
float64 (tests/ops/conv/helpers.py). Channel counts are not multiples of the channel
blocks, widths not multiples of the runs, and stride, padding and dilation vary along
the dims the kernels loop over at run time (D, H); along W a window kernel takes the
stride it is built for (1 or 2) and dilation 1, and `supports` sends the rest to the
per-tap kernel.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core.dtypes import DType
from tiledispatch.ops.conv import (
    ConvRule,
    ConvSignature,
    ConvTypes,
    DirectConfig,
    Direction,
    check_operands,
    supports,
    validate,
)
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.families.direct import channels_fastest
from tiledispatch.ops.conv.problem import ConvEpilogue
from tiledispatch.ops.gemm.problem import Activation

from .helpers import ARCH, DEVICE, problem, run_and_check

SM90 = arch.load("sm_90")
WINDOWED = (Direction.FORWARD, Direction.BWD_DATA)


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)


def window_kernels(dispatcher, p) -> list[str]:
    """Every sliding-window kernel of the registry that takes `p`, best ranked first."""
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    return [c.spec.name for c in dispatcher.explain(ops.problem).ranked
            if c.spec.family == "direct" and c.spec.config.window]


_COVERINGS: dict = {}


def covering(dispatcher, direction, geometries, dtype, quota) -> dict[str, list[str]]:
    """Which window kernels run on which geometry: the geometries in order of cost (pixels x taps), each
    taking the kernels that take it and have met fewer than `quota` geometries so far, or else the one
    that has met the fewest. Every kernel meets `quota` geometries (or every one it takes), every geometry
    one or more kernels, and the large geometries few (not every kernel x every geometry)."""
    key = (direction, tuple(geometries), dtype, quota)
    if key not in _COVERINGS:
        met: dict[str, int] = {}
        chosen = {}
        for geometry in sorted(geometries, key=lambda g: math.prod(geometries[g][0]) * math.prod(geometries[g][1])):
            size, filt, stride, padding, dilation = geometries[geometry]
            names = window_kernels(dispatcher, problem(direction, 2, 20, 20, 20, size, filt, stride, padding,
                                                       dilation, dtype))
            assert names, f"no window kernel takes {geometry} ({direction.value}, {dtype})"
            chosen[geometry] = [n for n in names if met.get(n, 0) < quota] or [min(names, key=lambda n: met.get(n, 0))]
            for name in chosen[geometry]:
                met[name] = met.get(name, 0) + 1
        _COVERINGS[key] = chosen
    return _COVERINGS[key]


# size, filter, stride, padding, dilation; depthwise over C channels
GEOMETRIES = {
    "2d-3x3-p1": ((5, 7), (3, 3), 1, 1, 1),
    "2d-5x5-p2-odd": ((5, 7), (5, 5), 1, 2, 1),  # runs of 3 and 5 and bands of 2 rows all end partly
    "2d-h-stride2-dilation2": ((9, 8), (3, 3), (2, 1), (1, 1), (2, 1)),
    "2d-5x3-pad-h-only": ((6, 7), (5, 3), 1, (2, 0), 1),
    "2d-3x1": ((6, 5), (3, 1), 1, (1, 0), 1),
    "1d-k2-p1": ((13,), (2,), 1, 1, 1),
    "1d-k5-p0": ((17,), (5,), 1, 0, 1),
    "1d-k3-wide-pad": ((5,), (3,), 1, 2, 1),
    "3d-mixed": ((3, 4, 6), (2, 3, 3), (1, 2, 1), (1, 0, 2), (2, 1, 1)),
    # stride 2 along W, padding of either parity (backward-data's runs start a column early for one)
    "2d-3x3-s2-p1-odd": ((9, 11), (3, 3), 2, 1, 1),
    "2d-5x5-s2-p2": ((10, 12), (5, 5), 2, 2, 1),
    "2d-3x3-w-stride2-p0": ((7, 9), (3, 3), (1, 2), 0, 1),
    "2d-5x5-s2-p1": ((9, 13), (5, 5), 2, 1, 1),
    "1d-k2-s2-p1": ((13,), (2,), 2, 1, 1),
    "1d-k5-s2-p2": ((16,), (5,), 2, 2, 1),
    "3d-s2": ((3, 5, 9), (2, 3, 3), (1, 2, 2), (1, 1, 1), (2, 1, 1)),
}


# The geometry drives the kernels' index arithmetic, whatever the dtype; the dtype drives the channel
# vectors (8 fp16 or 4 fp32 channels in 16 bytes), whatever the geometry. So every geometry runs in
# fp16, and fp32 on one geometry of each kind (W stride 2 with odd padding, 1-D wide padding, H stride
# and dilation): the interpreter's time, not coverage, bounds the suite on the CPU.
FP32_GEOMETRIES = ("2d-3x3-s2-p1-odd", "1d-k3-wide-pad", "2d-h-stride2-dilation2")


def dtype_cases(geometries) -> list:
    return [pytest.param(g, "fp16", id=f"{g}-fp16") for g in geometries] + [
        pytest.param(g, "fp32", id=f"{g}-fp32") for g in FP32_GEOMETRIES]


@pytest.mark.parametrize(("geometry", "dtype"), dtype_cases(GEOMETRIES))
@pytest.mark.parametrize("direction", WINDOWED, ids=lambda d: d.value)
def test_window_matches_reference(dispatcher, direction, geometry, dtype):
    size, filt, stride, padding, dilation = GEOMETRIES[geometry]
    # 20 channels: partial blocks of 16 and 32, 16-byte channel vectors in fp16 and fp32
    p = problem(direction, 2, 20, 20, 20, size, filt, stride, padding, dilation, dtype)
    geometries = GEOMETRIES if dtype == "fp16" else {g: GEOMETRIES[g] for g in FP32_GEOMETRIES}
    for name in covering(dispatcher, direction, geometries, dtype, 2 if dtype == "fp16" else 1)[geometry]:
        run_and_check(dispatcher, p, name, seed=len(name))


@pytest.mark.parametrize("direction", Direction, ids=lambda d: d.value)
def test_the_coverings_meet_every_window_kernel(dispatcher, direction):
    """Every window kernel of a direction meets two fp16 geometries (or every one it takes) and one fp32
    geometry, every geometry one kernel or more. No kernel runs here."""
    geometries = WEIGHT_GEOMETRIES if direction is Direction.BWD_WEIGHT else GEOMETRIES
    for dtype, quota, cases in (("fp16", 2, geometries), ("fp32", 1, {g: geometries[g] for g in FP32_GEOMETRIES})):
        takes: dict[str, set[str]] = {}
        for geometry, (size, filt, stride, padding, dilation) in cases.items():
            p = problem(direction, 2, 20, 20, 20, size, filt, stride, padding, dilation, dtype)
            for name in window_kernels(dispatcher, p):
                takes.setdefault(name, set()).add(geometry)
        chosen = covering(dispatcher, direction, cases, dtype, quota)
        assert set(chosen) == set(cases) and all(chosen.values())
        met = {name: {g for g, names in chosen.items() if name in names} for name in takes}
        assert all(len(met[n]) >= min(quota, len(takes[n])) for n in takes), (dtype, met)


@pytest.mark.parametrize("direction", WINDOWED, ids=lambda d: d.value)
def test_window_on_unaligned_channels(dispatcher, direction):
    """5 fp16 channels are 10 bytes: no 16-byte vectors, the kernels load channel by channel."""
    p = problem(direction, 3, 5, 5, 5, (4, 7), (3, 3), 1, 1, 1, "fp16")
    for name in window_kernels(dispatcher, p):
        ops, _ = run_and_check(dispatcher, p, name)
        assert not ops.problem.specialization.aligned


@pytest.mark.parametrize("direction", WINDOWED, ids=lambda d: d.value)
def test_window_with_channel_blocks_fastest(dispatcher, direction):
    """Pixels of >= 2 KB (520 fp32 channels: a partial last block) take the one-axis grid that steps
    the channel blocks fastest (plan.channels_fastest); 20 channels keep the two-axis grid."""
    wide = problem(direction, 2, 520, 520, 520, (9,), (3,), 1, 1, 1, "fp32")
    narrow = problem(direction, 2, 20, 20, 20, (9,), (3,), 1, 1, 1, "fp32")
    for p, one_axis in ((wide, True), (narrow, False)):
        names = window_kernels(dispatcher, p)
        assert names, f"no window kernel takes {p.describe()}"
        for name in names:
            ops, spec = run_and_check(dispatcher, p, name)
            grid = spec.definition.plan(spec.config, ops).launches[0].grid
            channel_blocks = -(-p.c // spec.config.block_c)
            assert grid[1] == (1 if one_axis else channel_blocks), (name, grid)
            assert channels_fastest(spec.config, p) == one_axis, name


@pytest.mark.parametrize("epilogue", [ConvEpilogue(True, Activation.RELU, True), ConvEpilogue(False, Activation.SILU,
                                                                                              True)],
                         ids=lambda e: e.name)
def test_window_forward_epilogue(dispatcher, epilogue):
    p = problem("forward", 2, 12, 12, 12, (5, 8), (3, 3), 1, 1, 1, "fp32", epilogue=epilogue)
    names = window_kernels(dispatcher, p)
    assert names
    run_and_check(dispatcher, p, names[0])


@pytest.mark.parametrize("direction", WINDOWED, ids=lambda d: d.value)
def test_weights_with_strided_taps_are_copied(dispatcher, direction):
    """The window kernels read a filter row's taps as contiguous: the plan copies a weight whose are not."""
    g = torch.Generator().manual_seed(1)
    c = 12
    # taps along W 2 apart; sliced on the device, since .to() of a strided view makes it dense
    w = torch.randn(c, 1, 3, 6, generator=g).to(DEVICE)[..., ::2]
    assert check_operands("forward", x=torch.empty(2, c, 5, 7, device=DEVICE), w=w, groups=c).w.stride(-1) == 2
    x = torch.randn(2, c, 5, 7, generator=g).to(DEVICE).to(memory_format=torch.channels_last)
    p = problem(direction, 2, c, c, c, (5, 7), (3, 3), 1, 1, 1, "fp32")
    name = window_kernels(dispatcher, p)[0]
    if direction is Direction.FORWARD:
        got = tiledispatch.conv(x, w, padding=1, groups=c, kernel=name, dispatcher=dispatcher)
        want = F.conv2d(x.double().cpu(), w.double().cpu(), padding=1, groups=c)
    else:
        got = tiledispatch.conv_backward_data(x, w, x.shape, padding=1, groups=c, kernel=name, dispatcher=dispatcher)
        want = torch.nn.grad.conv2d_input(x.shape, w.double().cpu(), x.double().cpu(), padding=1, groups=c)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)


FWD = ConvSignature(Direction.FORWARD, ConvTypes(DType.FP16))
BWDW = ConvSignature(Direction.BWD_WEIGHT, ConvTypes(DType.FP16))
BWDD = ConvSignature(Direction.BWD_DATA, ConvTypes(DType.FP16))


def test_window_supports_says_why_not():
    config = DirectConfig(FWD, 16, 64, 4, window=3, run=8)
    assert supports(config, problem("forward", 2, 64, 64, 64, (9, 9), (3, 3), 1, 1)) is None
    assert supports(config, problem("forward", 2, 64, 64, 64, (9, 9), (3, 3), (2, 1), 1)) is None  # H stride
    assert "filter width 3" in supports(config, problem("forward", 2, 64, 64, 64, (9, 9), (3, 5), 1, 1))
    assert "stride 1 and dilation 1 along W" in supports(config, problem("forward", 2, 64, 64, 64, (9, 9), (3, 3),
                                                                         (1, 2), 1))
    assert "stride 1 and dilation 1 along W" in supports(config, problem("forward", 2, 64, 64, 64, (9, 9), (3, 3),
                                                                         1, 2, (1, 2)))
    strided = dataclasses.replace(config, window_stride=2)
    assert supports(strided, problem("forward", 2, 64, 64, 64, (9, 9), (3, 3), (1, 2), 1)) is None
    assert "stride 2 and dilation 1 along W" in supports(strided, problem("forward", 2, 64, 64, 64, (9, 9), (3, 3),
                                                                          1, 1))
    assert "depthwise only" in supports(config, problem("forward", 2, 64, 128, 64, (9, 9), (3, 3), 1, 1))


def test_window_rules():
    assert validate(DirectConfig(FWD, 16, 64, 4, window=7, run=8), SM90).ok
    for bad in (DirectConfig(FWD, 16, 64, 4, run=4), DirectConfig(FWD, 16, 64, 4, window=12),
                DirectConfig(FWD, 16, 64, 4, window=3, run=17), DirectConfig(FWD, 16, 64, 4, window=3, rows=3),
                DirectConfig(FWD, 16, 64, 4, window=3, band=2), DirectConfig(BWDW, 16, 64, 4, rows=3),
                DirectConfig(BWDW, 16, 64, 4, window=3, rows=12), DirectConfig(BWDW, 4, 64, 4, window=3, band=17)):
        assert ConvRule.WINDOW in validate(bad, SM90).broken_rules(), bad.name
    for bad in (DirectConfig(FWD, 16, 64, 4, window=3, run=8, window_stride=3),
                DirectConfig(FWD, 16, 64, 4, window_stride=2),
                DirectConfig(BWDD, 16, 64, 4, window=3, run=7, window_stride=2)):  # an odd run
        assert ConvRule.WINDOW in validate(bad, SM90).broken_rules(), bad.name
    assert validate(DirectConfig(FWD, 16, 64, 4, window=3, run=7, window_stride=2), SM90).ok
    assert DirectConfig(FWD, 16, 64, 4, window=3, run=8).name.endswith("_k1_win3r8_none")
    assert DirectConfig(BWDD, 16, 64, 4, window=5, run=8, window_stride=2).name.endswith("_k1_win5s2r8_none")
    assert DirectConfig(FWD, 16, 64, 4).name.endswith("_k1_none")  # the per-tap kernels keep their names


def test_window_kernels_compile_under_a_register_cap_where_they_fit_it():
    """Forward and backward-data window kernels the register fit puts at <= 200 compile capped at
    168 (more warps an SM: 1.0-1.34x on the H100); larger ones and backward-weight windows, which
    would spill, keep ptxas's own allocation. The cap is part of the kernel's cache key."""
    from tiledispatch.core.kernel import unit_key
    from tiledispatch.ops.conv.plan import kernel_units
    from tiledispatch.ops.conv.problem import ConvSpecialization
    from tiledispatch.ops.conv.families.direct_window import WINDOW_REGISTER_CAP, window_registers

    aligned = ConvSpecialization()
    bf16 = dataclasses.replace(FWD, types=ConvTypes.parse("bf16"))
    small = DirectConfig(bf16, 8, 32, 2, window=7, run=14)  # convnext 7x7's pick: 61 -> 51 us capped
    large = DirectConfig(bf16, 16, 64, 4, window=7, run=14)  # fit 307: 60 -> 68 us capped
    assert window_registers(small, 8) <= 200 < window_registers(large, 8)
    for direction in (Direction.FORWARD, Direction.BWD_DATA):
        signature = dataclasses.replace(bf16, direction=direction)
        [main] = kernel_units(dataclasses.replace(small, signature=signature), aligned)
        assert main.max_registers == WINDOW_REGISTER_CAP
        [main] = kernel_units(dataclasses.replace(large, signature=signature), aligned)
        assert main.max_registers is None
    weight = dataclasses.replace(bf16, direction=Direction.BWD_WEIGHT)
    wide = DirectConfig(weight, 16, 64, 4, window=3, run=4, rows=3, band=2)  # the fit's 226: 1.49x slower at 168
    assert all(u.max_registers is None for u in kernel_units(wide, aligned))
    assert validate(small, SM90).ok
    spec = next(s for s in Registry.from_rule_set("conv", "default", SM90) if s.config == small)
    assert ".r168" in unit_key(spec, kernel_units(small, aligned)[0], aligned)


def test_backward_weight_windows_are_capped_to_keep_sixteen_warps_where_they_fit():
    """A backward-weight window tile the register fit puts at <= 128 compiles capped at 128, so an SM
    holds 16 warps of it (Mamba's 8x64 tile took 168 registers in fp16 uncapped, 12 warps); one the
    fit puts above keeps ptxas's own allocation."""
    from tiledispatch.ops.conv.plan import kernel_units
    from tiledispatch.ops.conv.problem import ConvSpecialization
    from tiledispatch.ops.conv.families.direct_window import weight_window_register_cap, weight_window_registers

    weight = ConvSignature(Direction.BWD_WEIGHT, ConvTypes.parse("fp16"))
    mamba = DirectConfig(weight, 8, 64, 4, split_k=16, window=4, run=16)
    wider = DirectConfig(weight, 16, 64, 4, split_k=16, window=4, run=16)
    assert weight_window_registers(mamba) <= 128 < weight_window_registers(wider)
    assert weight_window_register_cap(mamba, SM90.registers_per_sm) == 128
    assert weight_window_register_cap(wider, SM90.registers_per_sm) is None
    assert 128 * 32 * 16 == SM90.registers_per_sm  # 16 warps an SM at the cap
    main = kernel_units(mamba, ConvSpecialization())[0]
    assert main.max_registers == 128
    assert kernel_units(wider, ConvSpecialization())[0].max_registers is None


SUITE_DEPTHWISE = {  # benchmarks' conv.json: N, C, spatial, filter, padding
    "depthwise_mbv2_3x3": (32, 384, (28, 28), (3, 3), 1),
    "depthwise_5x5": (32, 672, (14, 14), (5, 5), 2),
    "convnext_dw7x7": (32, 384, (28, 28), (7, 7), 3),
    "conv1d_depthwise_k4_mamba": (16, 2048, (4096,), (4,), 1),
}


@pytest.fixture(scope="module")
def sm90_dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "default", SM90), SM90)


@pytest.mark.parametrize("case", SUITE_DEPTHWISE, ids=str)
@pytest.mark.parametrize("direction", WINDOWED, ids=lambda d: d.value)
def test_rules_take_the_window_for_the_suites_depthwise_cases(sm90_dispatcher, direction, case):
    """The direct family's best is its window kernel; overall it leads but at 5x5 and 7x7, where the
    toeplitz family's tensor-core walk ran faster (test_toeplitz.py)."""
    n, c, size, filt, pad = SUITE_DEPTHWISE[case]
    p = problem(direction, n, c, c, c, size, filt, 1, pad, 1, "bf16")
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    ranked = [r.spec for r in sm90_dispatcher.explain(p).ranked]
    direct = [s for s in ranked if s.family == "direct"]
    assert direct[0].config.window == filt[-1], direct[0].name
    triton = [s for s in ranked if s.family != "vendor"]
    assert triton[0].family == ("toeplitz" if filt in ((5, 5), (7, 7)) else "direct"), triton[0].name
    if direction is Direction.BWD_DATA:  # cuDNN's backward-data depthwise is its weak path
        assert ranked[0].family != "vendor"


def test_rules_keep_the_per_tap_kernel_where_the_window_cannot_go(sm90_dispatcher):
    p = problem("forward", 32, 384, 384, 384, (28, 28), (3, 3), 3, 1, 1, "bf16")  # stride 3: no window is built
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    direct = [r.spec for r in sm90_dispatcher.explain(p).ranked if r.spec.family == "direct"]
    assert direct and not any(s.config.window for s in direct)


STRIDED = {  # benchmarks/suites/conv_depthwise_strided.json: C, input size, filter; N = 32, stride 2
    "mbv2_112_c96": (96, 112, 3), "mbv2_56_c144": (144, 56, 3), "mbv2_28_c192": (192, 28, 3),
    "mbv2_14_c576": (576, 14, 3), "effnet_56_c144_5x5": (144, 56, 5), "effnet_28_c240": (240, 28, 3),
    "effnet_14_c672_5x5": (672, 14, 5),
}


@pytest.mark.parametrize("case", STRIDED, ids=str)
@pytest.mark.parametrize("direction", WINDOWED, ids=lambda d: d.value)
def test_rules_take_the_strided_window_where_it_ran_faster(sm90_dispatcher, direction, case):
    """The H100 timed the stride-2 windows faster than cuDNN on every layer of the suite
    (results/h100/conv_depthwise_strided.csv: forward 1.05-1.5x; conv_depthwise_strided_bwd_data.csv:
    backward-data 2.0-3.6x, cuDNN given a channels-last x)."""
    c, size, f = STRIDED[case]
    p = problem(direction.value, 32, c, c, c, (size, size), (f, f), 2, f // 2, 1, "bf16")
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    pick = sm90_dispatcher.explain(p).ranked[0].spec
    assert pick.family == "direct" and pick.config.window_stride == 2, (case, pick.name)


@pytest.mark.parametrize("direction", Direction, ids=lambda d: d.value)
def test_strided_windows_serve_mobilenets_downsampling(sm90_dispatcher, direction):
    """MobileNet's stride-2 3x3 meets window kernels built for stride 2 along W, and only those."""
    p = problem(direction.value, 32, 144, 144, 144, (56, 56), (3, 3), 2, 1, 1, "bf16")
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    windows = [r.spec.config for r in sm90_dispatcher.explain(p).ranked
               if r.spec.family == "direct" and r.spec.config.window]
    assert windows and all(c.window_stride == 2 for c in windows)


# -- backward-weight by sliding windows ---------------------------------------------------------------
# The tests rule set holds weight windows of filter widths 1, 2, 3 and 5 that hold all the filter rows
# (one pass), some of them (passes, the last one partly past FY) or one; with and without a band of
# two output rows a thread; unsplit (dw stored directly) and split (the fp32 workspace and its
# reduction). Each meets two of the geometries (test_the_coverings_meet_every_window_kernel).
WEIGHT_GEOMETRIES = {**GEOMETRIES, "2d-3x3-p0-tall": ((11, 6), (3, 3), 1, 0, 1)}  # taller than a band pass


@pytest.mark.parametrize(("geometry", "dtype"), dtype_cases(WEIGHT_GEOMETRIES))
def test_weight_window_matches_reference(dispatcher, geometry, dtype):
    size, filt, stride, padding, dilation = WEIGHT_GEOMETRIES[geometry]
    # 20 channels: partial channel blocks of 16 and 32; odd sizes: partial tiles and runs; N=2: the
    # tiles of pixels step across the images' boundary (the wrap into n), and the interpreter's time grows with N
    p = problem("bwd_weight", 2, 20, 20, 20, size, filt, stride, padding, dilation, dtype)
    geometries = WEIGHT_GEOMETRIES if dtype == "fp16" else {g: WEIGHT_GEOMETRIES[g] for g in FP32_GEOMETRIES}
    for name in covering(dispatcher, Direction.BWD_WEIGHT, geometries, dtype, 2 if dtype == "fp16" else 1)[geometry]:
        run_and_check(dispatcher, p, name, seed=len(name))


def test_weight_window_kinds_are_covered(dispatcher):
    """The 5x5 geometry meets a kernel of each kind: one pass, passes, band, split, unsplit."""
    p = problem("bwd_weight", 3, 20, 20, 20, (9, 11), (5, 5), 1, 2, 1, "fp32")
    configs = [dispatcher.resolve(name, p).config for name in window_kernels(dispatcher, p)]
    assert any(c.rows == 5 for c in configs) and any(c.rows < 5 for c in configs)
    assert any(c.band > 1 for c in configs) and any(c.split_k > 1 for c in configs)
    assert any(c.split_k == 1 for c in configs)


def test_weight_window_on_unaligned_channels(dispatcher):
    """5 fp16 channels are 10 bytes: no 16-byte vectors, the kernel loads channel by channel."""
    p = problem("bwd_weight", 3, 5, 5, 5, (4, 7), (3, 3), 1, 1, 1, "fp16")
    names = window_kernels(dispatcher, p)
    assert names
    for name in names:
        ops, _ = run_and_check(dispatcher, p, name)
        assert not ops.problem.specialization.aligned


def test_weight_window_into_a_strided_out(dispatcher):
    """dw lands in the caller's `out` whatever its strides (the kernel stores by them, no copy)."""
    g = torch.Generator().manual_seed(2)
    c = 12
    x = torch.randn(2, c, 6, 7, generator=g).to(DEVICE).to(memory_format=torch.channels_last)
    dy = torch.randn(2, c, 6, 7, generator=g).to(DEVICE).to(memory_format=torch.channels_last)
    out = torch.full((c, 1, 3, 6), float("nan"), device=DEVICE)[..., ::2]  # taps along W 2 apart
    p = problem("bwd_weight", 2, c, c, c, (6, 7), (3, 3), 1, 1, 1, "fp32")
    for name in window_kernels(dispatcher, p)[:2]:
        got = tiledispatch.conv_backward_weight(x, dy, (c, 1, 3, 3), padding=1, groups=c, out=out, kernel=name,
                                                dispatcher=dispatcher)
        want = torch.nn.grad.conv2d_weight(x.double().cpu(), (c, 1, 3, 3), dy.double().cpu(), padding=1, groups=c)
        torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)


def test_weight_window_supports_says_why_not():
    config = DirectConfig(BWDW, 4, 64, 4, split_k=8, window=3, run=4, rows=3, band=2)
    assert supports(config, problem("bwd_weight", 2, 64, 64, 64, (9, 9), (3, 3), 1, 1)) is None
    assert "filter width 3" in supports(config, problem("bwd_weight", 2, 64, 64, 64, (9, 9), (3, 5), 1, 1))
    assert "stride 1 and dilation 1 along W" in supports(config, problem("bwd_weight", 2, 64, 64, 64, (9, 9),
                                                                         (3, 3), (1, 2), 1))
    assert "along H" in supports(config, problem("bwd_weight", 2, 64, 64, 64, (9, 9), (3, 3), (2, 1), 1))
    assert supports(dataclasses.replace(config, band=1),
                    problem("bwd_weight", 2, 64, 64, 64, (9, 9), (3, 3), (2, 1), 1)) is None
    assert "depthwise only" in supports(config, problem("bwd_weight", 2, 64, 128, 64, (9, 9), (3, 3), 1, 1))


def test_weight_window_names():
    assert DirectConfig(BWDW, 4, 64, 4, 32, window=7, run=7, rows=7, band=2).name.endswith("_k32_win7x7r7b2_none")
    assert DirectConfig(BWDW, 16, 64, 4, 16, window=4, run=16).name.endswith("_k16_win4r16_none")
    assert validate(DirectConfig(BWDW, 4, 64, 4, 32, window=7, run=7, rows=7, band=2), SM90).ok


@pytest.mark.parametrize("case", SUITE_DEPTHWISE, ids=str)
def test_rules_take_the_weight_window_for_the_suites_depthwise_cases(sm90_dispatcher, case):
    n, c, size, filt, pad = SUITE_DEPTHWISE[case]
    p = problem("bwd_weight", n, c, c, c, size, filt, 1, pad, 1, "bf16")
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    triton = [r.spec for r in sm90_dispatcher.explain(p).ranked if r.spec.family == "direct"]
    config = triton[0].config
    assert triton[0].family == "direct" and config.window == filt[-1], triton[0].name
    assert config.rows == (filt[0] if len(filt) > 1 else 1), triton[0].name  # one pass over the pixels


@pytest.mark.parametrize("direction", Direction, ids=lambda d: d.value)
def test_window_columns_agree_with_the_kernels(direction):
    """The host's count of a run's source columns (ranking, registers) is the kernels' loop bound for
    the config's direction, and those columns meet every (output, tap) pair of the run once."""
    from tiledispatch.ops.conv.kernels.direct import window_columns, window_output

    for window, run, stride in itertools.product((1, 2, 3, 5, 7), (1, 2, 4, 7, 8, 14), (1, 2)):
        if direction is Direction.BWD_DATA and run % stride:
            continue
        sig = ConvSignature(direction, ConvTypes(DType.FP16))
        config = DirectConfig(sig, 16, 64, 4, window=window, run=run, window_stride=stride)
        transposed = direction is Direction.BWD_DATA
        columns = window_columns(run, window, stride, transposed)
        assert config.window_columns == columns
        # every (output, tap) pair of the run is met exactly once over those columns
        met = sorted((window_output(j, s, run, window, stride, transposed), s)
                     for j in range(columns) for s in range(window)
                     if window_output(j, s, run, window, stride, transposed) >= 0)
        assert met == [(t, s) for t in range(run) for s in range(window)
                       if not transposed or (t + window - 1 - s) % stride == 0]
