"""`gemm()` under autograd: its gradients against PyTorch's float64 autograd, on fresh random inputs.

dA and dB are GEMMs through the dispatcher (on the CPU interpreter in CI, natively on a GPU),
dbias and dresidual sums of dC, and an activation's derivative PyTorch's own (gemm applies it
as a PyTorch op while recording). Batched operands, and operands the batch shares, included.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import Dispatcher, Registry
from tiledispatch.core import hostcost
from tiledispatch.core.errors import UnsupportedError
from tiledispatch.core.runtime import current_arch

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
ARCH = current_arch()
ACTIVATIONS = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def _leaf(shape, generator, dtype):
    return torch.randn(*shape, generator=generator).to(DEVICE, dtype).requires_grad_()


def _close(got, want, dtype, what):
    tol = TOLERANCE[dtype]
    err = (got.detach().cpu().double() - want).norm() / want.norm()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    assert torch.isfinite(got).all() and err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


CASES = [  # (a shape, b shape, bias, activation, residual shape)
    ((8, 16), (16, 12), False, None, None),
    ((8, 16), (16, 12), True, "gelu", (8, 12)),
    ((3, 8, 16), (3, 16, 12), True, None, (3, 8, 12)),
    ((3, 8, 16), (16, 12), True, "relu", None),  # a Linear over a batch: b shared by it
    ((8, 16), (3, 16, 12), False, "silu", (8, 12)),  # a shared, the residual broadcast too
    ((1, 8, 16), (3, 16, 12), True, None, (1, 8, 12)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}@{'x'.join(map(str, c[1]))}"
                         f"-{c[3] or 'none'}{'-bias' if c[2] else ''}{'-res' if c[4] else ''}")
def test_gradients_match_float64(dispatcher, case, dtype):
    a_shape, b_shape, with_bias, activation, residual_shape = case
    g = torch.Generator().manual_seed(hash(case) % 2**31)
    n = b_shape[-1]
    tensors = {"a": _leaf(a_shape, g, dtype), "b": _leaf(b_shape, g, dtype),
               "bias": _leaf((n,), g, dtype) if with_bias else None,
               "residual": _leaf(residual_shape, g, dtype) if residual_shape else None}
    c = tiledispatch.gemm(tensors["a"], tensors["b"], bias=tensors["bias"], activation=activation,
                          residual=tensors["residual"], dispatcher=dispatcher)
    dc = torch.randn(c.shape, generator=g).to(DEVICE, dtype)
    leaves = {name: t for name, t in tensors.items() if t is not None}
    got = torch.autograd.grad(c, list(leaves.values()), dc)

    ref = {name: t.detach().cpu().double().requires_grad_() for name, t in leaves.items()}
    want_c = torch.matmul(ref["a"], ref["b"]) + (ref["bias"] if "bias" in ref else 0)
    want_c = ACTIVATIONS[activation](want_c) + (ref["residual"] if "residual" in ref else 0)
    want = torch.autograd.grad(want_c, list(ref.values()), dc.detach().cpu().double())
    _close(c, want_c.detach(), dtype, "C")
    for name, got_grad, want_grad in zip(leaves, got, want):
        assert got_grad.dtype == leaves[name].dtype, name
        _close(got_grad, want_grad, dtype, f"d{name}")


def test_only_the_gradients_asked_for(dispatcher):
    g = torch.Generator().manual_seed(1)
    a, b = _leaf((8, 16), g, torch.float32), torch.randn(16, 12, generator=g).to(DEVICE)
    tiledispatch.gemm(a, b, dispatcher=dispatcher).sum().backward()  # dC: an expanded (stride 0) tensor
    assert b.grad is None
    _close(a.grad, torch.ones(8, 12, dtype=torch.float64) @ b.cpu().double().T, torch.float32, "da")


def test_no_grad_and_plain_tensors_take_the_plain_call(dispatcher):
    a, b = torch.randn(8, 16, device=DEVICE), torch.randn(16, 12, device=DEVICE, requires_grad=True)
    with torch.no_grad():
        assert tiledispatch.gemm(a, b, dispatcher=dispatcher).grad_fn is None
    assert tiledispatch.gemm(a, b.detach(), dispatcher=dispatcher).grad_fn is None


@pytest.mark.parametrize("role", ["a", "b", "bias"])
def test_fp8_refuses_autograd(role):
    e4m3 = torch.float8_e4m3fn
    a, b = torch.randn(16, 16).to(DEVICE, e4m3), torch.randn(16, 16).to(DEVICE, e4m3).T
    args = {"a": a, "b": b, "bias": torch.randn(16, device=DEVICE, dtype=torch.bfloat16)}
    args[role].requires_grad_()
    message = f"and {role} requires grad: fp8 gemm is forward only (inference)"
    with pytest.raises(UnsupportedError, match=re.escape(message)):
        tiledispatch.gemm(args.pop("a"), args.pop("b"), **args)


@pytest.mark.parametrize("picks", [("vendor",) * 3, ("vendor", "tiled", "vendor"), ("tiled", "vendor", "vendor")])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_recorded_gemm_whose_three_picks_are_the_vendors_is_pytorchs_own(monkeypatch, picks, with_bias):
    """native.py: where the forward, dA and dB all go to the vendor, an eager recorded 2-D call is
    PyTorch's mm/addmm, which autograd records with its own backward: the result and gradients are
    PyTorch's, bit for bit. Any other pick, fp32, or a batched operand keeps the op's twin."""
    from types import SimpleNamespace

    from tiledispatch.ops.gemm.native import native_forward

    d = Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)
    order = iter(picks * 4)  # forward, dA, dB: in the order the decision poses them
    monkeypatch.setattr(d, "select", lambda problem, device=None: SimpleNamespace(
        family=(family := next(order)), is_vendor=family == "vendor"))
    monkeypatch.setattr(hostcost, "eager_host_s", lambda dispatcher: 0.0)  # the picks as given (test_hostcost weighs)
    monkeypatch.setattr(hostcost, "recorded_host_s", lambda dispatcher: 0.0)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(24, 40, generator=g).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(16, 40, generator=g).to(torch.bfloat16).requires_grad_()
    bias = torch.randn(16, generator=g).to(torch.bfloat16).requires_grad_() if with_bias else None
    native = native_forward(a, weight.t(), bias, d)
    if picks != ("vendor",) * 3:
        assert native is None
        return
    y = tiledispatch.gemm(a, weight.t(), bias=bias, dispatcher=d)
    want = torch.mm(a, weight.t()) if bias is None else torch.addmm(bias, a, weight.t())
    assert torch.equal(y, want) and y.grad_fn.name() == want.grad_fn.name()
    leaves = [t for t in (a, weight, bias) if t is not None]
    dy = torch.randn(y.shape, generator=g).to(y.dtype)
    assert all(torch.equal(p, q) for p, q in zip(torch.autograd.grad(y, leaves, dy),
                                                   torch.autograd.grad(want, leaves, dy)))
    assert native_forward(a.float(), weight.float().t(), None, d) is None  # fp32: TF32 is the vendor's call
    assert native_forward(a.unsqueeze(0), weight.t(), None, d) is None  # batched: the twin's broadcast


def test_a_plain_recorded_linear_is_decided_once_under_its_fast_path_key(monkeypatch):
    """native.recorded_native: a recorded call with no epilogue but a bias, keyed as the fast path keys
    it, asks the decision once; later calls are PyTorch's addmm straight from the memo, result and
    gradients PyTorch's own. (Keys exist for GPU tensors only: faked here.)"""
    from types import SimpleNamespace

    from tiledispatch.core.replay import tensor_meta
    from tiledispatch.ops.gemm import fastpath, native

    d = Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)
    monkeypatch.setattr(d, "select", lambda problem, device=None: SimpleNamespace(family="vendor", is_vendor=True))
    monkeypatch.setattr(fastpath, "call_key", lambda a, b, bias, *options: (
        "gemm", tensor_meta(a), tensor_meta(b), None if bias is None else tensor_meta(bias), options))
    decided = []
    real = native._decide
    monkeypatch.setattr(native, "_decide", lambda *args: decided.append(1) or real(*args))
    g = torch.Generator().manual_seed(17)
    a = torch.randn(24, 40, generator=g).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(16, 40, generator=g).to(torch.bfloat16).requires_grad_()
    bias = torch.randn(16, generator=g).to(torch.bfloat16).requires_grad_()
    for _ in range(3):
        y = tiledispatch.gemm(a, weight.t(), bias=bias, dispatcher=d)
        want = torch.addmm(bias, a, weight.t())
        assert torch.equal(y, want) and y.grad_fn.name() == want.grad_fn.name()
    assert len(decided) == 1 and any(k[0] == "recorded" for k in d._bound.keys())
    dy = torch.randn(y.shape, generator=g).to(y.dtype)
    assert all(torch.equal(p, q) for p, q in zip(torch.autograd.grad(y, (a, weight, bias), dy),
                                                   torch.autograd.grad(want, (a, weight, bias), dy)))
