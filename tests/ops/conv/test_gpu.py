"""Conv on a GPU: bf16 (which the interpreter cannot run), every family including cuDNN, and
suite-sized problems through the default dispatcher. Skipped without a GPU."""

from __future__ import annotations

import pytest

from tiledispatch import Dispatcher, Registry
from tiledispatch.ops.conv import Direction, Family, SplitMode, check_operands
from tiledispatch.ops.conv.inputs import make_inputs

from ...conftest import requires_gpu
from .helpers import ARCH, DEVICE, problem, run_and_check

pytestmark = requires_gpu
DIRECTIONS = list(Direction)


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "default", ARCH), ARCH)


def ranked(dispatcher, p, family: Family):
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    return [c.spec for c in dispatcher.explain(ops.problem).ranked if c.spec.family == family.value]


OWN_TESTS = (Family.IMPLICIT_GEMM_TMA, Family.TOEPLITZ, Family.GEMM)  # below, test_toeplitz.py, test_pointwise.py


@pytest.mark.parametrize("family", [f for f in Family if f not in OWN_TESTS], ids=lambda f: f.value)
@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_family_on_the_gpu(dispatcher, direction, dims, family, dtype):
    size, filt = {1: ((37,), (3,)), 2: ((13, 11), (3, 3)), 3: ((5, 7, 6), (3, 3, 3))}[dims]
    c, k, g = {Family.DIRECT: (16, 16, 16), Family.IMPLICIT_GEMM_FLAT: (6, 32, 2)}.get(family, (48, 32, 2))
    p = problem(direction, 3, c, k, g, size, filt, 1, 1, 1, dtype)
    specs = ranked(dispatcher, p, family)
    assert specs, f"no {family.value} kernel for {p.describe()}"
    run_and_check(dispatcher, p, specs[0].name)


SUITE_LIKE = {  # the benchmark's shapes, shrunk in N
    "resnet50_3x3": {"c": 256, "k": 256, "g": 1, "size": (14, 14), "filt": (3, 3), "stride": 1, "padding": 1},
    "stem_7x7s2": {"c": 3, "k": 64, "g": 1, "size": (56, 56), "filt": (7, 7), "stride": 2, "padding": 3},
    "resnext_g32": {"c": 256, "k": 256, "g": 32, "size": (28, 28), "filt": (3, 3), "stride": 1, "padding": 1},
    "regnet_g8": {"c": 448, "k": 448, "g": 8, "size": (28, 28), "filt": (3, 3), "stride": 1, "padding": 1},
    "depthwise_7x7": {"c": 384, "k": 384, "g": 384, "size": (28, 28), "filt": (7, 7), "stride": 1, "padding": 3},
    "mamba_k4": {"c": 2048, "k": 2048, "g": 2048, "size": (512,), "filt": (4,), "stride": 1, "padding": 1},
    "video_3d_g4": {"c": 128, "k": 128, "g": 4, "size": (8, 14, 14), "filt": (3, 3, 3), "stride": 1, "padding": 1},
}


@pytest.mark.parametrize("case", SUITE_LIKE, ids=str)
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
def test_suite_shapes_through_the_dispatcher(dispatcher, direction, case):
    a = SUITE_LIKE[case]
    p = problem(direction, 4, a["c"], a["k"], a["g"], a["size"], a["filt"], a["stride"], a["padding"], 1, "bf16")
    run_and_check(dispatcher, p)
    for family in (Family.IMPLICIT_GEMM, Family.DIRECT):
        specs = ranked(dispatcher, p, family)
        if specs:
            run_and_check(dispatcher, p, specs[0].name)


@pytest.mark.parametrize("mode", list(SplitMode), ids=lambda m: m.value)
def test_split_backward_weight_on_the_gpu(dispatcher, mode):
    p = problem("bwd_weight", 16, 128, 128, 4, (28, 28), (3, 3), 1, 1, 1, "bf16")
    specs = [s for s in ranked(dispatcher, p, Family.IMPLICIT_GEMM)
             if s.config.split_k > 1 and s.config.split_mode is mode]
    assert specs
    run_and_check(dispatcher, p, specs[0].name)


def test_fp32_and_tf32_on_the_gpu(dispatcher):
    run_and_check(dispatcher, problem("forward", 2, 32, 32, 2, (9, 9), (3, 3), 1, 1, 1, "fp32"))
    run_and_check(dispatcher, problem("bwd_data", 2, 32, 32, 2, (9, 9), (3, 3), 2, 1, 1, "tf32"))


def test_vendor_without_out_hands_back_cudnn_storage(dispatcher):
    import torch
    import torch.nn.functional as F

    import tiledispatch

    x = torch.randn(4, 64, 14, 14, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.randn(64, 8, 3, 3, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    p = check_operands("forward", x=x, w=w, padding=1, groups=8).problem
    vendor = next(c.spec.name for c in dispatcher.explain(p).ranked if c.spec.family == "vendor")
    y = tiledispatch.conv(x, w, padding=1, groups=8, kernel=vendor, dispatcher=dispatcher)
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1, groups=8))
    dx = tiledispatch.conv_backward_data(y, w, x.shape, padding=1, groups=8, kernel=vendor.replace("fwd", "bwdd"),
                                         dispatcher=dispatcher)
    assert dx.shape == x.shape and torch.isfinite(dx).all()


@pytest.mark.parametrize("tile", ["128x128x64_w8_s3", "128x128x64_w8_s4", "128x256x64_w8_s3", "64x256x64_w8_s3"])
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_DATA], ids=lambda d: d.value)
def test_dense_wgmma_tiles_with_whole_channel_blocks(dispatcher, direction, tile):
    """The large dense tiles on resnet's 3x3 (C/G = 256: no channel mask, stride 1: hoisted rows), bf16."""
    p = problem(direction, 4, 256, 256, 1, (14, 14), (3, 3), 1, 1, 1, "bf16")
    name = f"conv_{direction.short}_bf16_igemm_{tile}_g8_k1_none_{ARCH.tag}"
    ops, _ = run_and_check(dispatcher, p, name)
    assert ops.problem.specialization.channel_multiple == 128 and ops.problem.specialization.unit_stride


@pytest.mark.parametrize("tile", ["128x64_w4", "256x64_w8", "64x64_w4"])
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_DATA], ids=lambda d: d.value)
def test_tall_depthwise_tiles(dispatcher, direction, tile):
    p = problem(direction, 4, 384, 384, 384, (28, 28), (7, 7), 1, 3, 1, "bf16")
    run_and_check(dispatcher, p, f"conv_{direction.short}_bf16_direct_{tile}_k1_none_{ARCH.tag}")


@pytest.mark.parametrize("case", [((28, 28), (3, 3), 1, 384), ((14, 13), (5, 5), 2, 672), ((28, 28), (7, 7), 3, 384),
                                  ((4095,), (4,), 1, 2048), ((4, 9, 10), (3, 3, 3), 1, 40)],
                         ids=["mbv2-3x3", "5x5-odd", "convnext-7x7", "mamba-k4", "3d-c40"])
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_DATA], ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_sliding_window_tile_on_the_gpu(dispatcher, direction, case, dtype):
    """Every default window tile that takes the suite's depthwise shapes (batch cut), compiled for this GPU."""
    size, filt, pad, c = case
    p = problem(direction, 2, c, c, c, size, filt, 1, pad, 1, dtype)
    specs = [s for s in ranked(dispatcher, p, Family.DIRECT) if s.config.window]
    assert specs, f"no window kernel for {p.describe()}"
    for spec in specs[:3]:
        run_and_check(dispatcher, p, spec.name)


@pytest.mark.parametrize("case", [((56, 56), (7, 7), 2, 3), ((9, 20, 18), (3, 5, 5), 2, 2), ((301,), (5,), 1, 2)],
                         ids=["stem-7x7s2", "3d", "1d"])
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_WEIGHT], ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_padded_channel_tiles_on_the_gpu(dispatcher, direction, case, dtype):
    """igemm-flat on C=3 padded to 8 (pad_channels): the best two padded tiles, compiled for this GPU."""
    size, filt, stride, pad = case
    p = problem(direction, 4, 3, 64, 1, size, filt, stride, pad, 1, dtype)
    specs = [s for s in ranked(dispatcher, p, Family.IMPLICIT_GEMM_FLAT) if s.config.pad_channels]
    assert specs, f"no padded igemm-flat kernel for {p.describe()}"
    for spec in specs[:2]:
        run_and_check(dispatcher, p, spec.name)


# -- igemm-tma: stride-1 forward and backward-weight through tensor descriptors (sm_90+) ----------------
TMA_SHAPES = {  # the suite's dense convs, batch cut; C/G a multiple of the forward's 64-channel steps
    "resnet50_3x3": (4, 256, 256, 1, (14, 14), (3, 3), 1, 1),
    "resnet50_1x1": (4, 1024, 256, 1, (14, 14), (1, 1), 0, 1),
    "unet_3x3": (2, 128, 128, 1, (64, 64), (3, 3), 1, 1),
    "dilated_3x3_d2": (2, 256, 256, 1, (32, 32), (3, 3), 2, 2),
    "conv3d_video_3x3x3": (1, 64, 64, 1, (8, 28, 28), (3, 3, 3), 1, 1),
    "conv1d": (4, 256, 128, 1, (300,), (5,), 2, 1),
    "grouped_g2_odd": (3, 256, 128, 2, (13, 11), (3, 3), 1, 1),
}


def tma_specs(dispatcher, p):
    return ranked(dispatcher, p, Family.IMPLICIT_GEMM_TMA)


@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_WEIGHT], ids=lambda d: d.value)
def test_every_tma_tile_on_the_gpu(dispatcher, direction):
    """Every default igemm-tma tile (backward-weight: unsplit, split 4 and atomic) on an odd 13x11 map:
    partial boxes in H and W, the TMA zero fill as padding, wgmma from shared memory and registers.
    (Backward-data's default tiles are the tests' few: test_tma_suite_shapes runs them.)"""
    if not ARCH.has("tma"):
        pytest.skip(f"{ARCH.name} has no TMA")
    p = problem(direction, 2, 256, 256, 1, (13, 11), (3, 3), 1, 1, 1, "bf16")
    specs = [s for s in tma_specs(dispatcher, p) if s.config.split_k in (1, 4) or s.config.split_mode.value == "at"]
    assert len(specs) >= 10
    for spec in specs:
        run_and_check(dispatcher, p, spec.name)


@pytest.mark.parametrize("case", TMA_SHAPES, ids=str)
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_tma_suite_shapes(dispatcher, direction, case, dtype):
    """The two best-ranked igemm-tma kernels of each shape (what the benchmark times first)."""
    if not ARCH.has("tma"):
        pytest.skip(f"{ARCH.name} has no TMA")
    if dtype == "fp16" and case not in ("resnet50_3x3", "conv3d_video_3x3x3", "conv1d"):
        pytest.skip("fp16 on three shapes: the kernels are the bf16 ones, retyped")
    n, c, k, g, size, filt, pad, dil = TMA_SHAPES[case]
    p = problem(direction, n, c, k, g, size, filt, 1, pad, dil, dtype)
    specs = tma_specs(dispatcher, p)
    assert specs, f"no igemm-tma kernel for {p.describe()}"
    for spec in specs[:2]:
        run_and_check(dispatcher, p, spec.name)


def test_tma_forward_epilogue_on_the_gpu(dispatcher):
    from tiledispatch.ops.conv.problem import ConvEpilogue
    from tiledispatch.ops.gemm.problem import Activation

    p = problem("forward", 4, 256, 256, 1, (14, 14), (3, 3), 1, 1, 1, "bf16",
                epilogue=ConvEpilogue(True, Activation.GELU, True))
    if not ARCH.has("tma"):
        pytest.skip(f"{ARCH.name} has no TMA")
    specs = tma_specs(dispatcher, p)
    assert specs
    for spec in specs[:4]:
        run_and_check(dispatcher, p, spec.name)


@pytest.mark.parametrize("case", [((28, 28), (3, 3), 1, 384), ((14, 13), (5, 5), 2, 672), ((28, 28), (7, 7), 3, 384),
                                  ((4095,), (4,), 1, 2048), ((9, 10), (3, 3), 0, 40)],
                         ids=["mbv2-3x3", "5x5-odd", "convnext-7x7", "mamba-k4", "3x3-c40-p0"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_weight_window_tiles_on_the_gpu(dispatcher, case, dtype):
    """The three best-ranked backward-weight window tiles for the suite's depthwise shapes (batch cut),
    compiled for this GPU: bf16 widened by bit operations (kernels/direct.py `_widen`), fp16 converted.
    Three, not all: a 7x7 band tile takes up to 40 s to compile, and every tile of the rule set was
    checked on the H200 by benchmarks/conv_depthwise.py (results/h200/conv_dw_bwdw.csv, rel_error)."""
    size, filt, pad, c = case
    p = problem("bwd_weight", 2, c, c, c, size, filt, 1, pad, 1, dtype)
    specs = [s for s in ranked(dispatcher, p, Family.DIRECT) if s.config.window]
    assert specs, f"no window kernel for {p.describe()}"
    for spec in specs[:3]:
        run_and_check(dispatcher, p, spec.name)
