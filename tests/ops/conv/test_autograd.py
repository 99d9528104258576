"""`conv()` under autograd: its gradients against PyTorch's float64 autograd, on fresh random inputs.

The backward runs the backward-data and backward-weight convs through the dispatcher (on the
CPU interpreter in CI, natively on a GPU), and PyTorch ops for bias, activation and residual.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import Dispatcher, Registry
from tiledispatch.core import hostcost
from tiledispatch.core.errors import UnsupportedError

from .helpers import ARCH, DEVICE, ON_GPU

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
ACTIVATIONS = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
# The interpreter has no bf16 tl.dot: bf16 runs on the GPU only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)


def _leaf(shape, generator, dtype, channels_last=True):
    t = torch.randn(*shape, generator=generator)
    if channels_last and len(shape) >= 3:
        t = t.movedim(1, -1).contiguous().movedim(-1, 1)  # channels-last for any rank
    return t.to(DEVICE, dtype).requires_grad_()


def _reference(tensors: dict, activation, dy, **geometry):
    """y and the gradients of every tensor in `tensors` by PyTorch's autograd in float64 on the CPU."""
    leaves = {name: t.detach().cpu().double().requires_grad_() for name, t in tensors.items() if t is not None}
    x, w = leaves["x"], leaves["w"]
    y = ACTIVATIONS[activation](CONV[x.dim() - 2](x, w, leaves.get("bias"), **geometry))
    if "residual" in leaves:
        y = y + leaves["residual"]
    grads = torch.autograd.grad(y, list(leaves.values()), dy.detach().cpu().double())
    return y, dict(zip(leaves, grads))


def _close(got, want, dtype, what):
    tol = TOLERANCE[dtype]
    want = want.detach().cpu().double()
    err = (got.detach().cpu().double() - want).norm() / want.norm()
    assert torch.isfinite(got).all() and err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


CASES = [  # (x shape, w shape, geometry, bias, activation, residual)
    ((2, 6, 7, 5), (4, 3, 3, 2), {"stride": (2, 1), "padding": (1, 0), "dilation": 1, "groups": 2}, True, None, True),
    ((2, 4, 6, 6), (4, 4, 3, 3), {"stride": 1, "padding": 1, "dilation": 1, "groups": 1}, True, "relu", False),
    ((2, 4, 6, 6), (8, 1, 3, 3), {"stride": 1, "padding": 2, "dilation": 2, "groups": 4}, True, "gelu", True),
    ((2, 8, 9), (8, 1, 4), {"stride": 1, "padding": 1, "dilation": 1, "groups": 8}, False, "silu", False),
    ((1, 4, 4, 5, 4), (4, 2, 3, 3, 3), {"stride": 1, "padding": 1, "dilation": 1, "groups": 2}, True, None, False),
]


def _gradient_cases() -> list:
    """Each case in one dtype, the dtypes in turn over the cases (every dtype meets one case or more):
    the dtype changes the kernels' arithmetic, which the correctness tests cover, not the autograd wiring."""
    return [pytest.param(case, DTYPES[(i + 1) % len(DTYPES)],
                         id=f"{len(case[0]) - 2}d-{case[4] or 'none'}-{str(DTYPES[(i + 1) % len(DTYPES)])[6:]}")
            for i, case in enumerate(CASES)]


@pytest.mark.parametrize(("case", "dtype"), _gradient_cases())
def test_gradients_match_pytorch(dispatcher, case, dtype):
    x_shape, w_shape, geometry, has_bias, activation, has_residual = case
    g = torch.Generator().manual_seed(len(x_shape) + len(geometry))
    x, w = _leaf(x_shape, g, dtype), _leaf(w_shape, g, dtype)
    bias = _leaf((w_shape[0],), g, dtype) if has_bias else None
    with torch.no_grad():
        shape = CONV[len(x_shape) - 2](x.cpu().double(), w.cpu().double(), **geometry).shape
    residual = _leaf(shape, g, dtype) if has_residual else None
    y = tiledispatch.conv(x, w, bias=bias, activation=activation, residual=residual, dispatcher=dispatcher,
                          **geometry)
    dy = torch.randn(*shape, generator=g).to(DEVICE, dtype)
    tensors = {"x": x, "w": w, "bias": bias, "residual": residual}
    want_y, want = _reference(tensors, activation, dy, **geometry)
    _close(y, want_y, dtype, "y")
    given = {name: t for name, t in tensors.items() if t is not None}
    grads = torch.autograd.grad(y, list(given.values()), dy)
    for (name, t), grad in zip(given.items(), grads):
        assert grad.shape == t.shape and grad.dtype == t.dtype, name
        _close(grad, want[name], dtype, f"d{name}")


def test_only_the_gradients_asked_for(dispatcher):
    g = torch.Generator().manual_seed(1)
    x = _leaf((2, 4, 5, 5), g, torch.float32)
    w = _leaf((4, 2, 3, 3), g, torch.float32).requires_grad_(False)
    y = tiledispatch.conv(x, w, padding=1, groups=2, dispatcher=dispatcher)
    assert y.grad_fn is not None
    y.sum().backward()  # dy is an expanded tensor of ones (zero strides): the backward copies it channels-last
    _, want = _reference({"x": x, "w": w}, None, torch.ones(y.shape), padding=1, groups=2)
    _close(x.grad, want["x"], torch.float32, "dx")
    assert w.grad is None


def test_no_grad_and_plain_tensors_take_the_plain_call(dispatcher):
    g = torch.Generator().manual_seed(2)
    x, w = _leaf((1, 4, 5, 5), g, torch.float32), _leaf((4, 4, 3, 3), g, torch.float32)
    with torch.no_grad():
        assert tiledispatch.conv(x, w, dispatcher=dispatcher).grad_fn is None
    assert tiledispatch.conv(x.detach(), w.detach(), dispatcher=dispatcher).grad_fn is None


def test_out_refused_where_autograd_records(dispatcher):
    g = torch.Generator().manual_seed(3)
    x, w = _leaf((1, 4, 5, 5), g, torch.float32), _leaf((4, 4, 3, 3), g, torch.float32)
    out = torch.empty(1, 4, 3, 3, device=DEVICE).to(memory_format=torch.channels_last)
    with pytest.raises(UnsupportedError, match="out= cannot take part in autograd"):
        tiledispatch.conv(x, w, out=out, dispatcher=dispatcher)


def test_second_derivatives_match_pytorch(dispatcher):
    """The backward convs are custom ops with autograd of their own: a double backward differentiates them."""
    g = torch.Generator().manual_seed(4)
    x, w = _leaf((1, 4, 5, 5), g, torch.float32), _leaf((4, 4, 3, 3), g, torch.float32)
    y = tiledispatch.conv(x, w, padding=1, dispatcher=dispatcher)
    (dx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)  # dy = 2y records a graph
    got = torch.autograd.grad((dx * dx).sum(), (x, w))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = F.conv2d(x64, w64, padding=1)
    (dx64,) = torch.autograd.grad((y64 * y64).sum(), x64, create_graph=True)
    want = torch.autograd.grad((dx64 * dx64).sum(), (x64, w64))
    for name, a, b in zip(("x", "w"), got, want):
        _close(a, b, torch.float32, f"second derivative in {name}")


@pytest.mark.parametrize("family", ["vendor", "igemm"])
def test_both_gradients_in_one_vendor_call_where_both_picks_are_the_vendor(monkeypatch, family):
    """joint.py: where the dispatcher picks the vendor for backward-data and for backward-weight, one
    convolution_backward gives dx, dw and dbias (checked against float64 autograd); where it picks
    another family, each gradient is left to its own pick."""
    from types import SimpleNamespace

    from tiledispatch.ops.conv.joint import both_gradients

    d = Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)
    monkeypatch.setattr(d, "select", lambda problem, device=None: SimpleNamespace(
        family=family, is_vendor=family == "vendor"))
    monkeypatch.setattr(hostcost, "eager_host_s", lambda dispatcher: 0.0)  # the picks as given (test_hostcost weighs)
    g = torch.Generator().manual_seed(7)
    x, w = _leaf((2, 6, 7, 5), g, torch.float32), _leaf((4, 3, 3, 2), g, torch.float32)
    geometry = {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2}
    shape = F.conv2d(x.detach().cpu(), w.detach().cpu(), **geometry).shape
    dy = torch.randn(shape, generator=g).to(DEVICE).contiguous(memory_format=torch.channels_last)
    _, grads = _reference({"x": x, "w": w, "bias": _leaf((4,), g, torch.float32)}, None, dy, **geometry)
    got = both_gradients(dy, x.detach(), w.detach(), (*geometry.values(), False), d, with_bias=True)
    if family != "vendor":
        assert got is None
        return
    for name, value in zip(("x", "w", "bias"), got):
        _close(value, grads[name], torch.float32, f"joint d{name}")


@pytest.mark.parametrize("picks", [("vendor",) * 3, ("vendor", "vendor", "igemm"), ("direct", "vendor", "vendor")])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_a_recorded_conv_whose_three_picks_are_the_vendors_is_pytorchs_own(monkeypatch, picks, activation):
    """joint.native_forward: where the forward and both gradients go to the vendor, an eager recorded
    call is PyTorch's conv, which autograd records with its own backward: results and gradients are
    F.conv's own, bit for bit. Any other pick, or fp32, keeps the op's twin."""
    from types import SimpleNamespace

    from tiledispatch.ops.conv.joint import native_forward

    d = Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)
    by_direction = dict(zip(("forward", "bwd_data", "bwd_weight"), picks))
    monkeypatch.setattr(d, "select", lambda problem, device=None: SimpleNamespace(
        family=by_direction[problem.direction.value], is_vendor=by_direction[problem.direction.value] == "vendor"))
    monkeypatch.setattr(hostcost, "eager_host_s", lambda dispatcher: 0.0)  # the picks as given (test_hostcost weighs)
    monkeypatch.setattr(hostcost, "recorded_host_s", lambda dispatcher: 0.0)
    g = torch.Generator().manual_seed(11)
    x, w, b = (_leaf(s, g, torch.bfloat16) for s in ((2, 6, 7, 5), (4, 3, 3, 2), (4,)))
    geometry = {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2}
    options = (*geometry.values(), False)
    native = native_forward(x, w, b, options, d)
    if picks != ("vendor",) * 3:
        assert native is None
        return
    y = tiledispatch.conv(x, w, bias=b, activation=activation, dispatcher=d, **geometry)
    z = F.conv2d(x, w, b, **geometry)
    want = z if activation is None else F.relu(z.float()).to(z.dtype)
    assert torch.equal(y, want)
    if activation is None:
        assert y.grad_fn.name() == "ConvolutionBackward0"  # PyTorch's own node, not the twin's
    dy = torch.randn(y.shape, generator=g).to(DEVICE, y.dtype)
    got, expected = torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(want, (x, w, b), dy)
    assert all(torch.equal(a, e) for a, e in zip(got, expected))
    assert native_forward(x.float(), w.float(), b.float(), options, d) is None  # fp32: TF32 is the vendor's call


def test_a_plain_recorded_call_is_decided_once_under_its_fast_path_key(monkeypatch):
    """function.recorded_native: a plain recorded call (no activation, residual or forced kernel) keyed
    as the fast path keys it asks the decision once; later calls are PyTorch's conv straight from the
    memo, results and gradients F.conv2d's own. (Keys exist for GPU tensors only: faked here.)"""
    from types import SimpleNamespace

    from tiledispatch.core.replay import tensor_meta
    from tiledispatch.ops.conv import fastpath, joint

    d = Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)
    monkeypatch.setattr(d, "select", lambda problem, device=None: SimpleNamespace(family="vendor", is_vendor=True))
    monkeypatch.setattr(fastpath, "forward_key", lambda x, w, bias, *options: (
        "conv-forward", tensor_meta(x), tensor_meta(w), None if bias is None else tensor_meta(bias), options))
    decided = []
    real = joint._decide_native
    monkeypatch.setattr(joint, "_decide_native", lambda *a: decided.append(1) or real(*a))
    g = torch.Generator().manual_seed(13)
    x, w, b = (_leaf(s, g, torch.bfloat16) for s in ((2, 6, 7, 5), (4, 3, 3, 2), (4,)))
    geometry = {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2}
    for _ in range(3):
        y = tiledispatch.conv(x, w, bias=b, dispatcher=d, **geometry)
        want = F.conv2d(x, w, b, **geometry)
        assert torch.equal(y, want) and y.grad_fn.name() == "ConvolutionBackward0"
    assert len(decided) == 1 and any(k[0] == "recorded" for k in d._bound.keys())
    dy = torch.randn(y.shape, generator=g).to(DEVICE, y.dtype)
    got, expected = torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(want, (x, w, b), dy)
    assert all(torch.equal(a, e) for a, e in zip(got, expected))
