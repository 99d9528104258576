"""Conv's public arguments (issue 38): every int argument checked and bounded, NumPy integers and
'valid'/'same' padding accepted as PyTorch does, negated views read by their values, aliasing decided
by memory, forced kernels and dispatchers checked, offsets past 32 bits sent to the vendor path.

Each refusal is a clear error naming the argument, raised before any kernel runs; each accepted
call is compared with PyTorch's float64 convolution on fresh random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import Dispatcher, InvalidProblemError, NoKernelError, OpKind, Registry, UnsupportedError, arch
from tiledispatch.core.errors import InvalidArgumentError
from tiledispatch.ops.conv import check_operands, fastpath
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.rules import WIDE_OFFSETS, supports

from .helpers import ARCH, DEVICE, ON_GPU, problem

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}  # fp32 data, fp32 accumulation over a few dozen products


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)


def cl(*shape, dtype=torch.float32, device=DEVICE) -> torch.Tensor:
    """Fresh normal values in channels-last memory (channel stride 1), any rank 3-5."""
    perm = (0, *range(2, len(shape)), 1)
    t = torch.randn([shape[i] for i in perm], dtype=dtype, device=device)
    return t.permute(*[perm.index(i) for i in range(len(shape))])


def close(result: torch.Tensor, reference: torch.Tensor) -> bool:
    return torch.allclose(result.double().cpu(), reference.double().cpu(), **TOLERANCE)


# -- 1. int arguments bounded: a clear error, not Triton's ------------------------------------------
@pytest.mark.parametrize("name, value", [
    ("stride", 2**40), ("padding", 2**40), ("dilation", 2**40), ("groups", 2**40), ("stride", (1, 2**31)),
    ("stride", 2.0), ("padding", 1.5), ("dilation", True), ("stride", "2"), ("groups", 2.0), ("padding", [1, 1, 1]),
])
def test_int_arguments_are_checked_and_bounded(dispatcher, name, value):
    x, w = cl(1, 4, 8, 8), cl(4, 4, 3, 3)
    with pytest.raises(InvalidArgumentError) as info:
        tiledispatch.conv(x, w, dispatcher=dispatcher, **{name: value})
    assert name in str(info.value), str(info.value)


def test_a_large_stride_within_the_bounds_runs(dispatcher):
    x, w = cl(1, 4, 9, 9), cl(4, 4, 3, 3)
    y = tiledispatch.conv(x, w, stride=2**15, padding=1, dispatcher=dispatcher)
    assert close(y, F.conv2d(x.double(), w.double(), stride=2**15, padding=1))


# -- 2. NumPy integers, 'valid' and 'same', integer sizes --------------------------------------------
def test_numpy_integers_are_integers(dispatcher):
    x, w = cl(2, 4, 9, 8), cl(6, 2, 3, 3)
    y = tiledispatch.conv(x, w, stride=np.int64(2), padding=(np.int32(1), np.int64(0)), dilation=np.int16(1),
                          groups=np.int64(2), dispatcher=dispatcher)
    assert close(y, F.conv2d(x.double(), w.double(), stride=2, padding=(1, 0), groups=2))


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("dims, filt, dilation", [(1, (5,), 1), (2, (3, 1), (1, 2)), (3, (3, 3, 1), 1)],
                         ids=["1d", "2d", "3d"])
def test_valid_and_same_padding_as_pytorch(dispatcher, padding, dims, filt, dilation):
    x, w = cl(1, 4, *(6,) * dims), cl(4, 2, *filt)
    y = tiledispatch.conv(x, w, padding=padding, dilation=dilation, groups=2, dispatcher=dispatcher)
    assert close(y, CONV[dims](x.double(), w.double(), padding=padding, dilation=dilation, groups=2))


def test_same_padding_in_the_backward_directions(dispatcher):
    x, w = cl(1, 4, 6, 5), cl(4, 4, 3, 3)
    dy = cl(1, 4, 6, 5)
    # Sizes as a NumPy array of int64 and as a torch.Size: integers either way.
    dx = tiledispatch.conv_backward_data(dy, w, np.array(x.shape), padding="same", dispatcher=dispatcher)
    dw = tiledispatch.conv_backward_weight(x, dy, w.shape, padding="same", dispatcher=dispatcher)
    gx, gw, _ = torch.ops.aten.convolution_backward(dy.double(), x.double(), w.double(), None, [1, 1], [1, 1],
                                                    [1, 1], False, [0, 0], 1, [True, True, False])
    assert close(dx, gx) and close(dw, gw)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
def test_same_padding_that_pytorch_pads_unevenly_is_refused_with_the_equivalent_call(dispatcher):
    """An even filter: PyTorch pads one more zero after than before; the kernels pad both sides alike."""
    x, w = cl(1, 4, 7, 6), cl(4, 4, 2, 3)
    with pytest.raises(UnsupportedError, match=r"padding='same'.*pad\(x, \(0, 0, 0, 1\)\), w, padding=\(0, 1\)"):
        tiledispatch.conv(x, w, padding="same", dispatcher=dispatcher)
    y = tiledispatch.conv(F.pad(x, (0, 0, 0, 1)), w, padding=(0, 1), dispatcher=dispatcher)
    assert close(y, F.conv2d(x.double(), w.double(), padding="same"))


@pytest.mark.parametrize("kwargs, words", [
    ({"padding": "same", "stride": 2}, ["padding='same'", "stride 1"]),
    ({"padding": "full"}, ["padding='full'", "'valid', 'same'"]),
])
def test_bad_padding_strings(dispatcher, kwargs, words):
    with pytest.raises(InvalidArgumentError) as info:
        tiledispatch.conv(cl(1, 4, 6, 6), cl(4, 4, 3, 3), dispatcher=dispatcher, **kwargs)
    assert all(word in str(info.value) for word in words), str(info.value)


@pytest.mark.parametrize("call, name", [
    (lambda: tiledispatch.conv_backward_data(cl(1, 4, 4, 4), cl(4, 4, 3, 3), (1, 4, 6.5, 6)), "input_size[2]"),
    (lambda: tiledispatch.conv_backward_data(cl(1, 4, 4, 4), cl(4, 4, 3, 3), (6.0, 6)), "input_size[0]"),
    (lambda: tiledispatch.conv_backward_data(cl(1, 4, 4, 4), cl(4, 4, 3, 3), "66"), "input_size"),
    (lambda: tiledispatch.conv_backward_weight(cl(1, 4, 6, 6), cl(1, 4, 4, 4), (4, 4, 3.0, 3)), "weight_size[2]"),
    (lambda: tiledispatch.conv_backward_weight(cl(1, 4, 6, 6), cl(1, 4, 4, 4), 3), "weight_size"),
])
def test_sizes_must_be_integers(call, name):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert name in str(info.value), str(info.value)


# -- 3. negated and conjugated views --------------------------------------------------------------
def _negated(t: torch.Tensor) -> torch.Tensor:
    """-t as a view with the negative bit: its memory holds t."""
    return torch._neg_view(t)


def test_negated_views_are_read_by_their_values(dispatcher):
    x, w, bias, residual = cl(1, 4, 6, 6), cl(4, 4, 3, 3), torch.randn(4, device=DEVICE), cl(1, 4, 4, 4)
    y = tiledispatch.conv(_negated(x), _negated(w), bias=_negated(bias), residual=_negated(residual),
                          dispatcher=dispatcher)
    assert close(y, F.conv2d(-x.double(), -w.double(), -bias.double()) - residual.double())


def test_the_imaginary_part_of_a_conjugate_is_read_by_its_values(dispatcher):
    """A depthwise weight (C/G = 1) is channels-last whatever its strides, so it is not copied on the
    way in: its negative bit must be resolved for its own sake."""
    z = torch.randn(4, 1, 3, 3, dtype=torch.complex64, device=DEVICE)
    w = z.conj().imag  # -z.imag, a view with the negative bit over z's memory
    assert w.is_neg()
    x = cl(1, 4, 5, 5)
    y = tiledispatch.conv(x, w, groups=4, dispatcher=dispatcher)
    assert close(y, F.conv2d(x.double(), -z.imag.double(), groups=4))


def test_negated_views_in_the_backward_directions(dispatcher):
    x, w, dy = cl(1, 4, 6, 6), cl(4, 4, 3, 3), cl(1, 4, 4, 4)
    dx = tiledispatch.conv_backward_data(_negated(dy), w, tuple(x.shape), dispatcher=dispatcher)
    dw = tiledispatch.conv_backward_weight(_negated(x), dy, tuple(w.shape), dispatcher=dispatcher)
    gx, gw, _ = torch.ops.aten.convolution_backward(dy.double(), x.double(), w.double(), None, [1, 1], [0, 0],
                                                    [1, 1], False, [0, 0], 1, [True, True, False])
    assert close(dx, -gx) and close(dw, -gw)


def test_a_negated_out_is_refused(dispatcher):
    out = _negated(cl(1, 4, 4, 4))
    with pytest.raises(InvalidProblemError, match="out is a negated view"):
        tiledispatch.conv(cl(1, 4, 6, 6), cl(4, 4, 3, 3), out=out, dispatcher=dispatcher)


def test_the_fast_path_replays_plain_tensors_only():
    """A bound plan reads raw memory: a negated view, or an out autograd tracks, takes the checks."""
    plain = torch.zeros(1, 4, 4, 4)
    assert fastpath.replayable((plain, plain, None, None, None, plain))
    assert not fastpath.replayable((plain, _negated(plain), None, None, None, None))
    assert not fastpath.replayable((plain, plain, None, None, _negated(plain), None))
    assert not fastpath.replayable((plain, plain, None, None, None, torch.zeros(1, requires_grad=True)))


def test_the_fast_path_tells_floats_and_bools_from_integers():
    """2.0 == 2 and True == 1: a key of values alone would replay a call the checks refuse."""
    keys = {fastpath.typed(options) for options in [(("stride", 2),), (("stride", 2.0),), (("stride", (2, 2)),),
                                                   (("stride", (2, 2.0)),), (("groups", 1),), (("groups", True),)]}
    assert len(keys) == 6


def test_a_call_after_a_bound_one_is_checked_where_it_differs(dispatcher):
    """On a GPU the first call binds its plan and later calls of its signature replay it: a negated
    view of the same shape and strides, or a float where the bound call had an int, must not replay."""
    x, w = cl(1, 4, 6, 6), cl(4, 4, 3, 3)
    reference = F.conv2d(x.double(), w.double(), stride=2)
    for _ in range(2):
        assert close(tiledispatch.conv(x, w, stride=2, dispatcher=dispatcher), reference)
    assert close(tiledispatch.conv(x, _negated(w), stride=2, dispatcher=dispatcher), -reference)
    with pytest.raises(InvalidArgumentError, match="stride must be an integer"):
        tiledispatch.conv(x, w, stride=2.0, dispatcher=dispatcher)


# -- 4. aliasing by memory --------------------------------------------------------------------------
def _rows(buffer: torch.Tensor, start: int, rows: int) -> torch.Tensor:
    """(1, 4, rows, 4) channels-last over rows start.. of a (1, rows', 4, 4) NHWC buffer."""
    return buffer[:, start:start + rows].permute(0, 3, 1, 2)


def test_a_residual_overlapping_out_is_refused_and_out_itself_is_added_in_place(dispatcher):
    x, w = cl(1, 4, 6, 6), cl(4, 4, 3, 3)
    buffer = torch.randn(1, 5, 4, 4, device=DEVICE)
    with pytest.raises(InvalidProblemError, match="out overlaps residual"):
        tiledispatch.conv(x, w, residual=_rows(buffer, 0, 4), out=_rows(buffer, 1, 4), dispatcher=dispatcher)
    out = _rows(buffer, 1, 4)
    expected = F.conv2d(x.double(), w.double()) + out.double()
    assert close(tiledispatch.conv(x, w, residual=out, out=out, dispatcher=dispatcher), expected)


@pytest.mark.skipif(ON_GPU, reason="NumPy buffers are host memory")
def test_aliasing_is_decided_by_memory_not_by_storage(dispatcher):
    """Two storages over one NumPy buffer alias; disjoint slices of one storage do not."""
    array = np.random.default_rng(0).standard_normal((1, 10, 4, 4)).astype(np.float32)
    base = torch.from_numpy(array)
    x = base[:, :6].permute(0, 3, 1, 2)  # (1, 4, 6, 4) over rows 0-5
    w = cl(4, 4, 3, 1)
    other = torch.from_numpy(array[:, 5:9])  # a storage of its own, starting at row 5 of the buffer
    with pytest.raises(InvalidProblemError, match="out overlaps x"):
        tiledispatch.conv(x, w, out=other.permute(0, 3, 1, 2), dispatcher=dispatcher)
    out = base[:, 6:10].permute(0, 3, 1, 2)  # x's storage, rows x does not reach
    assert close(tiledispatch.conv(x, w, out=out, dispatcher=dispatcher), F.conv2d(x.double(), w.double()))


@pytest.mark.skipif(ON_GPU, reason="bind is driven directly on the CPU; test_fastpath covers the GPU's calls")
def test_a_replay_checks_the_residual_against_out(dispatcher):
    p = problem("forward", 1, 4, 4, 1, (6, 4), (3, 1), 1, 0, 1, dtype="fp32")
    inputs = make_inputs(p, device=DEVICE)
    ops = check_operands(p.direction, **(inputs.kwargs(p) | {"residual": inputs.out.clone().normal_()}))
    bound = fastpath.bind(dispatcher, ops, None)
    assert isinstance(bound, fastpath.BoundConv)
    buffer = torch.randn(1, 5, 4, 4)
    with pytest.raises(InvalidProblemError, match="out overlaps residual"):
        bound((inputs.x, inputs.w, None, None, _rows(buffer, 0, 4), _rows(buffer, 1, 4)))
    out = _rows(buffer, 1, 4)
    expected = F.conv2d(inputs.x.double(), inputs.w.double()) + out.double()
    assert close(bound((inputs.x, inputs.w, None, None, out, out)), expected)


# -- 5. forced kernels and dispatchers --------------------------------------------------------------
def test_a_kernel_of_another_op_or_direction_names_the_argument(dispatcher):
    x, w = cl(1, 4, 5, 5), cl(4, 4, 3, 3)
    default = tiledispatch.default_dispatcher()
    gemm_kernel = next(spec.name for spec in default.registry if spec.op is OpKind.GEMM)
    with pytest.raises(InvalidArgumentError, match=f"kernel='{gemm_kernel}' is a gemm kernel"):
        tiledispatch.conv(x, w, kernel=gemm_kernel)
    backward = next(spec.name for spec in dispatcher.registry if spec.name.startswith("conv_bwdw_fp32"))
    with pytest.raises(UnsupportedError, match=f"kernel='{backward}' computes the bwd_weight conv.*forward"):
        tiledispatch.conv(x, w, kernel=backward, dispatcher=dispatcher)


@pytest.mark.parametrize("kwargs, name", [({"kernel": 123}, "kernel"), ({"kernel": ["a"]}, "kernel"),
                                          ({"dispatcher": "foo"}, "dispatcher"), ({"dispatcher": 1}, "dispatcher")])
def test_kernel_and_dispatcher_of_the_wrong_type(kwargs, name):
    with pytest.raises(InvalidArgumentError) as info:
        tiledispatch.conv(cl(1, 4, 5, 5), cl(4, 4, 3, 3), **kwargs)
    assert str(info.value).startswith(name), str(info.value)


# -- 6. element offsets past 2**31 -------------------------------------------------------------------
def _meta(shape, batch_stride=None, dtype=torch.float16) -> torch.Tensor:
    """A channels-last tensor on the meta device (no memory), its batch stride `batch_stride`."""
    strides, step = [0] * len(shape), shape[1]
    strides[1] = 1
    for i in reversed(range(2, len(shape))):
        strides[i], step = step, step * shape[i]
    strides[0] = step if batch_stride is None else batch_stride
    return torch.empty_strided(shape, strides, dtype=dtype, device="meta")


@pytest.mark.parametrize("role", ["x", "w", "residual", "out"])
def test_offsets_past_31_bits_are_told_apart_per_tensor(role):
    shapes = {"x": (3, 8, 6, 6), "w": (8, 8, 3, 3), "residual": (3, 8, 4, 4), "out": (3, 8, 4, 4)}
    wide, narrow = (2**30, 2**30 - 2**10) if role != "w" else (2**29, 2**28)  # N = 3 and K = 8 rows
    tensors = {r: _meta(s, wide if r == role else None) for r, s in shapes.items()}
    assert check_operands("forward", **tensors).problem.wide_offsets  # the last row starts at 2**31 or past
    tensors[role] = _meta(shapes[role], narrow)
    assert not check_operands("forward", **tensors).problem.wide_offsets  # every element below 2**31


def test_every_triton_family_refuses_wide_offsets_and_the_vendor_takes_them():
    ops = check_operands("forward", x=_meta((3, 8, 6, 6), 2**30), w=_meta((8, 8, 1, 1)))  # pointwise too
    sm90 = arch.load("sm_90")
    explanation = Dispatcher(Registry.from_rule_set("conv", "default", sm90), sm90).explain(ops.problem)
    assert [c.spec.family for c in explanation.ranked] == ["vendor"]
    assert {c.refused for c in explanation.refused if c.spec.family != "vendor"} == {WIDE_OFFSETS}
    dense = check_operands("forward", x=_meta((3, 8, 6, 6)), w=_meta((8, 8, 1, 1))).problem
    families = {c.spec.family for c in Dispatcher(Registry.from_rule_set("conv", "default", sm90), sm90)
                .explain(dense).ranked}
    assert "gemm" in families and "vendor" in families


@pytest.mark.skipif(ON_GPU, reason="the interpreter has no vendor path")
def test_on_the_interpreter_no_kernel_says_why(dispatcher):
    ops = check_operands("bwd_data", dy=_meta((3, 8, 4, 4), 2**30, torch.float32), w=_meta((8, 8, 3, 3),
                         dtype=torch.float32), input_size=(6, 6))
    with pytest.raises(NoKernelError, match="element offsets past 2\\*\\*31 need 64-bit indexing"):
        dispatcher.select(ops.problem)
    spec = next(s for s in dispatcher.registry if s.name.startswith("conv_bwdd_fp32"))
    assert supports(spec.config, ops.problem) == WIDE_OFFSETS


# -- 7. the other arguments --------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, words", [
    ({"bias": [1.0, 2.0, 3.0, 4.0]}, InvalidProblemError, ["bias must be a tensor of shape (4,)", "list"]),
    ({"bias": torch.zeros(4, dtype=torch.float64, device=DEVICE)}, InvalidProblemError,
     ["bias is fp64", "fp32 like the inputs"]),
    ({"bias": torch.zeros(4, dtype=torch.int64, device=DEVICE)}, InvalidProblemError, ["bias is", "int64", "fp32"]),
    ({"bias": torch.zeros(5, device=DEVICE)}, InvalidProblemError, ["(4,)", "5"]),
    ({"activation": torch.relu}, InvalidArgumentError, ["activation must be None or one of", "not a function"]),
    ({"activation": 1}, InvalidArgumentError, ["activation"]),
    ({"residual": [0.0]}, InvalidProblemError, ["residual must be a torch.Tensor", "list"]),
    ({"residual": torch.zeros(1, 4, 3, 3, device=DEVICE)}, InvalidProblemError, ["residual is 1x4x3x3", "1x4x4x4"]),
    ({"residual": cl(1, 4, 4, 4, dtype=torch.float16)}, InvalidProblemError, ["residual is fp16"]),
    ({"out": [0.0]}, InvalidProblemError, ["out (y) must have shape 1x4x4x4", "list"]),
    ({"allow_tf32": "no"}, InvalidArgumentError, ["allow_tf32 must be True or False"]),
    ({"allow_tf32": 1}, InvalidArgumentError, ["allow_tf32"]),
    ({"groups": True}, InvalidArgumentError, ["groups=True"]),
    ({"groups": 0}, InvalidArgumentError, ["groups=0"]),
])
def test_other_bad_arguments(dispatcher, kwargs, error, words):
    with torch.no_grad():
        with pytest.raises(error) as info:
            tiledispatch.conv(cl(1, 4, 6, 6), cl(4, 4, 3, 3), dispatcher=dispatcher, **kwargs)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_an_out_that_requires_grad_is_refused_in_grad_mode(dispatcher):
    out = cl(1, 4, 4, 4).requires_grad_()
    with pytest.raises(InvalidProblemError, match="out requires grad"):
        tiledispatch.conv(cl(1, 4, 6, 6), cl(4, 4, 3, 3), out=out, dispatcher=dispatcher)


@pytest.mark.parametrize("role", ["x", "w"])
def test_lists_where_tensors_belong(role):
    tensors = {"x": cl(1, 4, 6, 6), "w": cl(4, 4, 3, 3)}
    tensors[role] = tensors[role].tolist()
    with pytest.raises(InvalidProblemError, match=f"{role} must be a torch.Tensor, got list"):
        tiledispatch.conv(tensors["x"], tensors["w"])


def test_a_strided_bias_is_read_by_its_values(dispatcher):
    """The kernels read bias[k] at offset k: a bias with stride 2 is copied dense, not read wrong."""
    x, w, bias = cl(1, 4, 6, 6), cl(4, 4, 3, 3), torch.randn(8, device=DEVICE)[::2]
    ops = check_operands("forward", x=x, w=w, bias=bias)
    assert ops.bias.stride() == (1,) and "bias" in ops.converted
    assert close(tiledispatch.conv(x, w, bias=bias, dispatcher=dispatcher), F.conv2d(x.double(), w.double(),
                                                                                     bias.double()))
