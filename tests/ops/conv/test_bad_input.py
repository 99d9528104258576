"""Bad conv input gets a clear error saying what is wrong and what would work; no kernel runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tiledispatch
from tiledispatch import InvalidProblemError, UnsupportedError
from tiledispatch.ops.conv import ConvProblem, ConvTypes, Direction, check_operands
from tiledispatch.ops.conv.problem import ConvEpilogue, ConvSpecialization, output_size
from tiledispatch.ops.gemm.problem import Activation

from .helpers import ON_GPU, problem


def cl(*shape, dtype=torch.float16, device="cpu"):
    t = torch.randn(*shape).to(device=device, dtype=dtype)
    return t.to(memory_format=torch.channels_last) if t.dim() == 4 else t


# -- the problem itself --------------------------------------------------------------------------
def test_output_size_formula():
    assert output_size(224, 7, 2, 3, 1) == 112
    assert output_size(28, 3, 1, 1, 1) == 28
    assert output_size(32, 3, 1, 2, 2) == 32
    assert output_size(4096, 4, 1, 1, 1) == 4095
    assert output_size(5, 3, 2, 0, 1) == 2
    p = problem("forward", 2, 4, 8, 2, (9, 8, 7), (3, 2, 1), (2, 1, 3), (1, 0, 0), (1, 2, 1))
    assert p.output_size == (5, 6, 3) and p.spatial_dims == 3


def test_flops_and_bytes():
    p = problem("forward", 32, 256, 256, 32, (28, 28), (3, 3), 1, 1, 1, "bf16")
    assert p.flops() == 2 * 32 * 256 * 28 * 28 * 8 * 9
    assert p.bytes() == (32 * 256 * 784 * 2 + 256 * 8 * 9) * 2
    for direction in Direction:  # the same arithmetic in every direction
        assert problem(direction, 32, 256, 256, 32, (28, 28), (3, 3), 1, 1).flops() == p.flops()
    with_epilogue = problem("forward", 1, 4, 4, 1, (5,), (3,), epilogue=ConvEpilogue(True, Activation.RELU, True))
    plain = problem("forward", 1, 4, 4, 1, (5,), (3,))
    assert with_epilogue.bytes() == plain.bytes() + (4 * 3 + 4) * 2


def test_scalars_broadcast_over_dims_and_describe():
    p = problem("bwd_data", 1, 4, 4, 2, (6, 6, 6), (3, 3, 3), 2, 1, 1)
    assert p.stride == (2, 2, 2) and p.padding == (1, 1, 1) and p.dilation == (1, 1, 1)
    d = p.describe()
    assert d["direction"] == "bwd_data" and d["output"] == [3, 3, 3] and d["groups"] == 2 and d["dtype"] == "fp16"
    assert ConvTypes.parse("tf32").name == "tf32" and ConvTypes.parse("bfloat16").name == "bf16"


@pytest.mark.parametrize("kwargs, words", [
    ({"c": 6, "k": 8, "g": 4}, ["C=6", "K=8", "groups=4", "divisible"]),
    ({"c": 8, "k": 6, "g": 4}, ["K=6", "divisible"]),
    ({"size": (2, 2), "filt": (3, 3)}, ["output would be", ">= 1"]),
    ({"size": (5, 5), "filt": (3, 3), "dilation": 3}, ["output would be"]),
    ({"size": (5, 5), "filt": (3, 3, 3)}, ["filter_size", "3 values", "give 2"]),
    ({"size": (5, 5, 5, 5), "filt": (1, 1, 1, 1)}, ["4 spatial dims", "1, 2 or 3"]),
    ({"stride": 0}, ["stride", ">= 1"]),
    ({"padding": -1}, ["padding", ">= 0"]),
    ({"stride": (1, 2, 3)}, ["stride", "3 values", "give 2"]),
    ({"n": 0}, ["n=0", "positive"]),
    ({"g": 0}, ["groups=0", "positive"]),
])
def test_bad_problems(kwargs, words):
    args = {"n": 2, "c": 8, "k": 8, "g": 2, "size": (5, 5), "filt": (3, 3), "stride": 1, "padding": 0, "dilation": 1}
    args.update(kwargs)
    with pytest.raises(InvalidProblemError) as info:
        ConvProblem(Direction.FORWARD, args["n"], args["c"], args["k"], args["g"], args["size"], args["filt"],
                    args["stride"], args["padding"], args["dilation"])
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("claim", ["pointwise", "depthwise", "unit_stride", "one_row"])
def test_a_specialization_claiming_what_the_conv_is_not(claim):
    """Kernels built on a specialisation skip work (the filter's other rows, the group loop, bounds):
    a problem whose shape contradicts its claim is refused, not run wrong."""
    p = problem("forward", 2, 8, 8, 2, (9, 9), (3, 3), 2, 1, 1)
    with pytest.raises(InvalidProblemError) as info:
        dataclasses.replace(p, specialization=ConvSpecialization(**{claim: True}))
    assert claim in str(info.value) and "dense_specialization" in str(info.value)
    one_row = problem("forward", 2, 8, 8, 8, (1, 9), (1, 3), 1, (0, 1), 1)
    assert one_row.one_row and one_row.dense_specialization().one_row and one_row.dense_specialization().depthwise
    assert one_row.dense_specialization().tag.endswith("-dw-s1-r1")
    assert not p.dense_specialization().one_row


def test_bad_dtypes_and_flags():
    with pytest.raises(UnsupportedError, match="fp16, bf16, fp32 or tf32"):
        ConvTypes.parse("fp8e4m3")
    with pytest.raises(InvalidProblemError, match="allow_tf32 applies to fp32"):
        ConvProblem(Direction.FORWARD, 1, 4, 4, 1, (5,), (3,), types=ConvTypes(ConvTypes.parse("fp16").dtype, True))
    with pytest.raises(InvalidProblemError, match="forward conv only"):
        problem("bwd_data", 1, 4, 4, 1, (5,), (3,), epilogue=ConvEpilogue(bias=True))
    with pytest.raises(UnsupportedError, match="unknown direction"):
        Direction.parse("sideways")


# -- tensors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, error, words", [
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 3, 3, 3), "groups": 2}, InvalidProblemError, ["C/G=3", "groups=2", "C=8"]),
    (lambda: {"x": cl(8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2}, InvalidProblemError, ["dims"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3), "groups": 2}, InvalidProblemError, ["4 dims"]),
    (lambda: {"x": torch.zeros(2, 8), "w": cl(8, 4, 3, 3)}, InvalidProblemError, ["2 dims", "(N, C, H, W)"]),
    (lambda: {"x": [1, 2], "w": cl(8, 4, 3, 3)}, InvalidProblemError, ["x must be a torch.Tensor", "list"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3, dtype=torch.float32), "groups": 2}, UnsupportedError,
     ["fp16", "fp32", "one dtype"]),
    (lambda: {"x": cl(2, 8, 5, 5, dtype=torch.float64), "w": cl(8, 4, 3, 3, dtype=torch.float64), "groups": 2},
     UnsupportedError, ["fp64", "fp16, bf16 or fp32"]),
    (lambda: {"x": torch.zeros(2, 8, 5, 5, dtype=torch.int32), "w": cl(8, 4, 3, 3), "groups": 2}, UnsupportedError,
     ["int32"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": torch.zeros(8, 4, 3, 3, dtype=torch.float16, device="meta"), "groups": 2},
     InvalidProblemError, ["meta", "one device"]),
    (lambda: {"x": cl(2, 8, 2, 2), "w": cl(8, 4, 3, 3), "groups": 2}, InvalidProblemError, ["output would be"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(6, 4, 3, 3), "groups": 2, "bias": torch.zeros(8, dtype=torch.float16)},
     InvalidProblemError, ["bias", "(6,)"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2, "bias": torch.zeros(8)}, InvalidProblemError,
     ["bias is fp32", "fp16"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2, "residual": cl(2, 8, 5, 5)}, InvalidProblemError,
     ["residual", "2x8x3x3"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2, "dy": cl(2, 8, 3, 3)}, InvalidProblemError,
     ["forward takes x and w, not dy"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2, "out": cl(2, 8, 5, 5)}, InvalidProblemError,
     ["out (y) must have shape 2x8x3x3"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2, "out": torch.zeros(2, 8, 3, 3, dtype=torch.float16)},
     InvalidProblemError, ["channels (dim 1) must be contiguous", "channels_last"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2,
                  "out": cl(1, 8, 3, 3).expand(2, 8, 3, 3)}, InvalidProblemError, ["overlaps itself"]),
    (lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": True}, InvalidProblemError, ["groups=True"]),
])
def test_bad_forward_operands(make, error, words):
    with pytest.raises(error) as info:
        check_operands("forward", **make())
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_out_aliasing_an_input():
    x = cl(2, 8, 3, 3)
    with pytest.raises(InvalidProblemError, match="out overlaps x"):
        check_operands("forward", x=x, w=cl(8, 8, 1, 1), out=x)


@pytest.mark.parametrize("direction, make, words", [
    ("bwd_data", lambda: {"dy": cl(2, 8, 3, 3), "w": cl(8, 4, 3, 3), "groups": 2}, ["needs input_size"]),
    ("bwd_data", lambda: {"dy": cl(2, 8, 4, 4), "w": cl(8, 4, 3, 3), "groups": 2, "input_size": (2, 8, 5, 5)},
     ["dy is 2x8x4x4", "output is 3x3"]),
    ("bwd_data", lambda: {"dy": cl(2, 8, 3, 3), "w": cl(8, 4, 3, 3), "groups": 2, "input_size": (2, 6, 5, 5)},
     ["must start with (N, C) = (2, 8)"]),
    ("bwd_data", lambda: {"dy": cl(2, 6, 3, 3), "w": cl(8, 4, 3, 3), "groups": 2, "input_size": (5, 5)},
     ["w's K=8", "dy's channels 6"]),
    ("bwd_data", lambda: {"dy": cl(2, 8, 3, 3), "w": cl(8, 4, 3, 3), "groups": 2, "input_size": (5, 5, 5)},
     ["input_size", "2 spatial sizes"]),
    ("bwd_data", lambda: {"dy": cl(2, 8, 3, 3), "w": cl(8, 4, 3, 3), "groups": 2, "input_size": (5, 5), "bias": cl(8)},
     ["forward conv only"]),
    ("bwd_weight", lambda: {"x": cl(2, 8, 5, 5), "dy": cl(2, 8, 3, 3), "groups": 2}, ["needs weight_size"]),
    ("bwd_weight", lambda: {"x": cl(2, 8, 5, 5), "dy": cl(3, 8, 3, 3), "groups": 2, "weight_size": (3, 3)},
     ["batch sizes differ"]),
    ("bwd_weight", lambda: {"x": cl(2, 8, 5, 5), "dy": cl(2, 8, 3, 3), "groups": 2, "weight_size": (8, 8, 3, 3)},
     ["(K, C/G) = (8, 8/2)"]),
    ("bwd_weight", lambda: {"x": cl(2, 8, 5, 5), "w": cl(8, 4, 3, 3), "groups": 2, "weight_size": (3, 3)},
     ["bwd_weight takes x and dy"]),
    ("bwd_weight", lambda: {"x": cl(2, 8, 5, 5), "dy": cl(2, 8, 3, 3), "groups": 2, "weight_size": (3, 3),
                                "activation": "relu"}, ["forward conv only"]),
])
def test_bad_backward_operands(direction, make, words):
    with pytest.raises(InvalidProblemError) as info:
        check_operands(direction, **make())
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's refusal of bf16")
def test_bf16_on_the_interpreter_says_what_works():
    x, w = cl(1, 4, 5, 5, dtype=torch.bfloat16), cl(4, 4, 3, 3, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedError, match="interpreter.*use fp16 or fp32"):
        tiledispatch.conv(x, w)


def test_forcing_a_kernel_of_another_direction():
    from tiledispatch import Dispatcher, Registry
    from tiledispatch.core.runtime import current_arch

    dispatcher = Dispatcher(Registry.from_rule_set("conv", "tiny", current_arch()), current_arch())
    name = next(s.name for s in dispatcher.registry if s.name.startswith("conv_bwdd_fp16_igemm"))
    x = cl(1, 4, 5, 5, device="cuda" if ON_GPU else "cpu")
    w = cl(4, 4, 3, 3, device="cuda" if ON_GPU else "cpu")
    with pytest.raises(UnsupportedError, match="built for bwd_data, the problem is forward"):
        tiledispatch.conv(x, w, kernel=name, dispatcher=dispatcher)
