"""The custom ops (tiledispatch/library.py): torch.library.opcheck of every op, and torch.compile of a
small model (a Linear by gemm, a conv, attention) with no graph break and no warning from
tiledispatch, against the same model run eagerly.

opcheck runs each op eagerly, on fake tensors and through AOT autograd (forward and backward,
dynamic shapes) and compares the results; the shapes are tiny, as every kernel runs under
Triton's interpreter on the CPU.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import tiledispatch
from tiledispatch.core.runtime import current_arch
from tiledispatch.library import dispatcher_token
from tiledispatch.ops.library_common import DEFAULT_DISPATCHER

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
OPS = torch.ops.tiledispatch


def _t(*shape, dtype=torch.float32, grad=False, channels_last=False):
    t = torch.randn(*shape).to(DEVICE, dtype)
    if channels_last:
        t = t.movedim(1, -1).contiguous().movedim(-1, 1)
    return t.requires_grad_(grad)


def _opcheck(op, args):
    result = torch.library.opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_opcheck_gemm(dtype):
    grad = dtype is torch.float32
    a, b = _t(8, 16, dtype=dtype, grad=grad), _t(16, 8, dtype=dtype, grad=grad)
    bias, residual = _t(8, dtype=dtype, grad=grad), _t(8, 8, dtype=dtype, grad=grad)
    _opcheck(OPS.gemm.default, (a, b, bias, None, residual, None, False, None, None, None, DEFAULT_DISPATCHER))


def test_opcheck_gemm_batched_with_activation():
    a, b = _t(2, 8, 16, grad=True), _t(16, 8, grad=True)  # b shared by the batch: dB sums over it
    _opcheck(OPS.gemm.default, (a, b, None, None, None, None, False, None, None, None, DEFAULT_DISPATCHER))
    with torch.no_grad():  # an activation is fused where nothing is recorded
        _opcheck(OPS.gemm.default, (a, b, None, "gelu", None, None, False, None, None, None, DEFAULT_DISPATCHER))


GEOMETRY = ([1, 1], [1, 1], [1, 1], 2, False)  # stride, padding, dilation, groups, allow_tf32


@pytest.fixture(scope="module")
def conv_dispatcher() -> tiledispatch.Dispatcher:
    """The conv tests' rule set: small tiles, seconds under the interpreter (the op takes it by its token)."""
    arch = current_arch()
    return tiledispatch.Dispatcher(tiledispatch.Registry.from_rule_set("conv", "tests", arch), arch)


def test_opcheck_conv(conv_dispatcher):
    dtype = torch.float16  # fp32 in the backward convs' check below
    x, w = _t(1, 4, 5, 5, dtype=dtype, grad=True, channels_last=True), _t(4, 2, 3, 3, dtype=dtype, grad=True)
    bias, residual = _t(4, dtype=dtype, grad=True), _t(1, 4, 5, 5, dtype=dtype, grad=True, channels_last=True)
    token = dispatcher_token(conv_dispatcher)
    _opcheck(OPS.conv.default, (x, w, bias, residual, *GEOMETRY[:4], None, False, None, token))


def test_opcheck_conv_backward_data_and_weight(conv_dispatcher):
    """Each backward conv with inputs that require grad: their own autograd (a double backward) checked too."""
    x, w = _t(1, 4, 5, 5, grad=True, channels_last=True), _t(4, 2, 3, 3, grad=True, channels_last=True)
    dy = _t(1, 4, 5, 5, grad=True, channels_last=True)
    token = dispatcher_token(conv_dispatcher)
    _opcheck(OPS.conv_backward_data.default, (dy, w, [1, 4, 5, 5], *GEOMETRY, None, token))
    _opcheck(OPS.conv_backward_weight.default, (x, dy, [4, 2, 3, 3], *GEOMETRY, None, token))


ATTENTION_OPTIONS = ("causal", None, None, None, 0.0, 0, 0)  # causal, window, scale, softcap, dropout p/seed/offset


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_opcheck_attention(dtype):
    q, k, v = (_t(1, 2, 16, 32, dtype=dtype, grad=True) for _ in range(3))
    sinks = _t(2, grad=True)
    args = (q, k, v, None, sinks, None, None, None, None, None, None, None, *ATTENTION_OPTIONS, True, False, None,
            None, DEFAULT_DISPATCHER)
    _opcheck(OPS.attention.default, args)


def test_opcheck_attention_backward():
    q, k, v = (_t(1, 2, 16, 32) for _ in range(3))
    bias = _t(1, 1, 16, 16)
    with torch.no_grad():
        out, lse = OPS.attention(q, k, v, bias, None, None, None, None, None, None, None, None,
                                 *ATTENTION_OPTIONS, True, False, None, None, DEFAULT_DISPATCHER)
    grad_out = torch.randn_like(out)
    args = (grad_out, q, k, v, out, lse, bias, None, None, None, None, None, *ATTENTION_OPTIONS, False, None, True,
            DEFAULT_DISPATCHER)
    _opcheck(OPS.attention_backward.default, args)


def _grads(y, inputs) -> tuple:
    return torch.autograd.grad(y.float().square().sum(), inputs)


@pytest.mark.parametrize("name", ["gemm", "conv", "conv_backward_data", "conv_backward_weight", "attention",
                                  "attention_backward"])
def test_each_op_has_its_kernel_at_the_device_keys(name):
    """The device keys hold the op's kernel itself, ahead of the custom op's checked default,
    which inductor's code would otherwise pay on every call."""
    for key in ("CPU", "CUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"tiledispatch::{name}", key), key
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"tiledispatch::{name}", "XPU")


def test_an_eager_recorded_call_runs_the_twin_with_the_ops_gradients(conv_dispatcher):
    """An eager call that autograd records goes through the op's autograd.Function twin (a fraction of
    the custom op's dispatch), and its gradients are the custom op's, bit for bit."""
    a, b, bias = _t(8, 16, grad=True), _t(16, 8, grad=True), _t(8, grad=True)
    twin = tiledispatch.gemm(a, b, bias=bias)
    op = OPS.gemm.default(a, b, bias, None, None, None, False, None, None, None, DEFAULT_DISPATCHER)
    assert type(twin.grad_fn).__name__ == "GemmFunctionBackward" != type(op.grad_fn).__name__
    assert all(torch.equal(g, h) for g, h in zip(_grads(twin, (a, b, bias)), _grads(op, (a, b, bias))))

    x, w = _t(1, 4, 5, 5, grad=True, channels_last=True), _t(4, 2, 3, 3, grad=True)
    twin = tiledispatch.conv(x, w, padding=1, groups=2, dispatcher=conv_dispatcher)
    token = dispatcher_token(conv_dispatcher)
    op = OPS.conv.default(x, w, None, None, *GEOMETRY[:4], None, False, None, token)
    assert type(twin.grad_fn).__name__ == "ConvFunctionBackward" != type(op.grad_fn).__name__
    assert all(torch.equal(g, h) for g, h in zip(_grads(twin, (x, w)), _grads(op, (x, w))))

    q, k, v = (_t(1, 2, 16, 32, grad=True) for _ in range(3))
    twin = tiledispatch.attention(q, k, v, causal=True)
    op, _ = OPS.attention.default(q, k, v, None, None, None, None, None, None, None, None, None, *ATTENTION_OPTIONS,
                                  True, False, None, None, DEFAULT_DISPATCHER)
    assert type(twin.grad_fn).__name__ == "AttentionFunctionBackward" != type(op.grad_fn).__name__
    assert all(torch.equal(g, h) for g, h in zip(_grads(twin, (q, k, v)), _grads(op, (q, k, v))))


class TinyModel(torch.nn.Module):
    """A Linear by gemm, a conv (bias, ReLU) and causal attention over the Linear's output."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(64, 64, device=DEVICE) / 8)
        self.bias = torch.nn.Parameter(torch.randn(64, device=DEVICE))
        self.filter = torch.nn.Parameter(torch.randn(4, 2, 3, 3, device=DEVICE) / 4)

    def forward(self, x, h):
        y = tiledispatch.conv(x, self.filter, padding=1, groups=2, activation="relu")
        z = tiledispatch.gemm(h, self.weight, bias=self.bias)  # (16, 64): 16 tokens, 2 heads of 32
        q = z.view(1, 16, 2, 32).transpose(1, 2)  # BSHD
        out = tiledispatch.attention(q, q, q, causal=True)
        return y, out


def _run(model, x, h):
    y, out = model(x, h)
    loss = y.float().square().sum() + out.float().square().sum()
    grads = torch.autograd.grad(loss, [x, h, *model.parameters()])
    return (y, out, *grads)


def _compiled_matches_eager(backend: str) -> None:
    torch.manual_seed(0)
    model = TinyModel()
    x, h = _t(1, 4, 6, 6, grad=True, channels_last=True), _t(16, 64, grad=True)
    want = _run(model, x, h)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # fullgraph: a graph break is an error
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(compiled, x, h)
    ours = [w for w in caught if "tiledispatch" in str(w.filename) + str(w.message)]
    assert not ours, [f"{w.filename}:{w.lineno}: {w.message}" for w in ours]
    for name, a, b in zip(("y", "attention", "dx", "dh", "dweight", "dbias", "dfilter"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_compile_aot_eager_has_no_graph_break_and_matches_eager():
    _compiled_matches_eager("aot_eager")


def test_dynamo_sees_one_graph_of_custom_ops():
    model = TinyModel()
    x, h = _t(1, 4, 6, 6, channels_last=True), _t(16, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x, h)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    targets = {str(node.target) for graph in explained.graphs for node in graph.graph.nodes}
    assert {"tiledispatch.gemm.default", "tiledispatch.conv.default", "tiledispatch.attention.default"} <= targets


# Skipped on the CPU: inductor compiles the model's graphs with the C++ compiler, about 200 s on
# the 2-core machine (measured; the test passes), past the ~60 s a test may take there.
@pytest.mark.skipif(not ON_GPU and os.environ.get("TILEDISPATCH_TEST_INDUCTOR") != "1",
                    reason="inductor's C++ build of the model takes about 200 s on the 2-core CPU machine, "
                           "over the suite's budget (TILEDISPATCH_TEST_INDUCTOR=1 runs it; it passes)")
def test_compile_inductor_matches_eager():
    _compiled_matches_eager("inductor")


def test_a_custom_dispatcher_under_compile_is_refused():
    arch = current_arch()
    dispatcher = tiledispatch.Dispatcher(tiledispatch.Registry.from_rule_set("gemm", "tests", arch), arch)
    a, b = _t(8, 16), _t(16, 8)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: tiledispatch.gemm(a, b, dispatcher=dispatcher), fullgraph=True,
                             backend="aot_eager")
    with pytest.raises(Exception, match="torch.compile traces tiledispatch's ops with the default dispatcher only"):
        compiled(a, b)
