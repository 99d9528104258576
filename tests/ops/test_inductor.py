"""ops/inductor.py: under inductor, a traced conv or gemm that the dispatcher gives the vendor becomes
PyTorch's own aten op; any other pick keeps the custom op, which selects at run time."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import tiledispatch
from tiledispatch import arch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.ops import inductor

from ..conftest import requires_interpreter

ARCH = arch.load("interpreter")


@pytest.fixture(scope="module")
def table():
    pytest.importorskip("torch._inductor.decomposition")
    from torch._inductor.decomposition import select_decomp_table

    inductor.register()
    return select_decomp_table()


def picking(op: str, vendor: bool, saving_us: float = 1e6) -> Dispatcher:
    """A dispatcher whose every pick is the vendor's kernel, or never is, the vendor's modelled time
    `saving_us` above the pick's; it runs nothing."""
    d = Dispatcher(Registry.from_rule_set(op, "tests", ARCH), ARCH)
    pick = SimpleNamespace(name="pick", is_vendor=vendor)
    d.select = lambda problem, device=None: pick

    def candidate(spec, modelled_us):
        return SimpleNamespace(spec=spec, score=SimpleNamespace(terms={"modelled_us": modelled_us}))
    d.ranked = lambda problem: (candidate(pick, 100.0),
                                candidate(SimpleNamespace(name="vendor", is_vendor=True), 100.0 + saving_us))

    def ran(*args, **kwargs):
        raise AssertionError("the custom op ran its kernel")
    d.prepare = d.run = ran
    return d


def traced(fn, table, *args, mode="fake"):
    return [n.target for n in make_fx(fn, decomposition_table=table, tracing_mode=mode)(*args).graph.nodes
            if n.op == "call_function"]


def channels_last(*shape):
    return torch.randn(*shape).half().contiguous(memory_format=torch.channels_last)


def conv(x, w):
    return torch.ops.tiledispatch.conv.default(x, w, None, None, [2, 1], [1, 0], [1, 2], 2, None, False, None, 0)


def forced_conv(x, w):
    return torch.ops.tiledispatch.conv.default(x, w, None, None, [2, 1], [1, 0], [1, 2], 2, None, False, "k", 0)


def test_a_conv_the_vendor_takes_is_aten_convolution_and_any_other_keeps_the_op(table):
    x, w = channels_last(2, 6, 7, 5), channels_last(4, 3, 3, 2)
    op = torch.ops.tiledispatch.conv.default
    with tiledispatch.using(picking("conv", vendor=True)):
        assert traced(conv, table, x, w) == [torch.ops.aten.convolution.default]
        assert traced(forced_conv, table, x, w) == [op]  # forced: the op's
        assert traced(conv, table, x.float(), w.float()) == [op]  # fp32: TF32 is the vendor family's choice
        assert op in traced(conv, table, x, w, mode="symbolic")  # symbolic sizes: many problems, no one pick
    with tiledispatch.using(picking("conv", vendor=False)):
        assert traced(conv, table, x, w) == [op]


@pytest.mark.parametrize("with_bias", [False, True])
def test_a_product_the_vendor_takes_is_aten_mm_and_any_other_keeps_the_op(table, with_bias):
    a, w = torch.randn(5, 8).half(), torch.randn(6, 8).half()
    bias = torch.randn(6).half() if with_bias else None
    op = torch.ops.tiledispatch.gemm.default

    def gemm(a, w, bias):
        return op(a, w.t(), bias, None, None, None, False, None, None, None, 0)
    aten = torch.ops.aten.addmm.default if with_bias else torch.ops.aten.mm.default
    with tiledispatch.using(picking("gemm", vendor=True)):
        assert traced(gemm, table, a, w, bias)[-1] == aten and op not in traced(gemm, table, a, w, bias)
        assert op in traced(gemm, table, a.unsqueeze(0), w, bias)  # batched: the op's broadcast
    with tiledispatch.using(picking("gemm", vendor=False)):
        assert op in traced(gemm, table, a, w, bias)


def test_a_compiled_model_whose_picks_are_the_vendors_computes_pytorchs_result(table):
    """End to end through torch.compile with inductor's decompositions (aot_eager_decomp_partition:
    inductor's table without its code generation): the result is F.conv2d's and F.linear's, bit for bit,
    and the ops' kernels never run (the dispatcher would raise)."""
    torch.manual_seed(3)
    x, w, lw = channels_last(2, 6, 7, 5), channels_last(4, 3, 3, 2), torch.randn(5, 4 * 4 * 3).half()

    def model(x, w, lw):
        y = tiledispatch.conv(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
        return tiledispatch.gemm(y.flatten(1), lw.t())
    expected = F.linear(F.conv2d(x, w, None, (2, 1), (1, 0), (1, 2), 2).flatten(1), lw)
    torch._dynamo.reset()
    with tiledispatch.using(picking("conv", vendor=True)):
        got = torch.compile(model, fullgraph=True, backend="aot_eager_decomp_partition")(x, w, lw)
    torch._dynamo.reset()
    assert torch.equal(got, expected)


@pytest.mark.parametrize("vendor", [True, pytest.param(False, marks=requires_interpreter)])
def test_inductor_compiles_a_model_with_either_pick(table, vendor):
    """torch.compile with inductor itself: the vendor's pick is PyTorch's conv (bit for bit, our
    kernels never run); any other pick stays the custom op, which inductor calls as a fallback
    beside the decomposition (its implicit fallback would refuse an op that has one)."""
    torch.manual_seed(4)
    x, w = channels_last(2, 6, 7, 5), channels_last(4, 3, 3, 2)
    if vendor:
        d = picking("conv", vendor=True)
    else:
        registry = Registry.from_rule_set("conv", "tests", ARCH)
        d = Dispatcher(registry.filter(lambda s: not s.is_vendor), ARCH)

    def model(x, w):
        return tiledispatch.conv(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    expected = F.conv2d(x, w, None, (2, 1), (1, 0), (1, 2), 2)
    torch._dynamo.reset()
    from torch._inductor import config

    with tiledispatch.using(d), config.patch(force_disable_caches=True):  # a cached graph keeps its decision
        got = torch.compile(model, fullgraph=True)(x, w)
    torch._dynamo.reset()
    if vendor:
        assert torch.equal(got, expected)
    else:
        reference = F.conv2d(x.double(), w.double(), None, (2, 1), (1, 0), (1, 2), 2)
        assert torch.allclose(got.double(), reference, rtol=2e-3, atol=2e-3)


def test_the_backward_convs_the_vendor_takes_are_aten_convolution_backward(table):
    dy, w, x = channels_last(2, 4, 4, 3), channels_last(4, 3, 3, 2), channels_last(2, 6, 7, 5)
    geometry = ([2, 1], [1, 0], [1, 2], 2, False, None, 0)

    def data(dy, w):
        return torch.ops.tiledispatch.conv_backward_data.default(dy, w, [2, 6, 7, 5], *geometry)

    def weight(x, dy):
        return torch.ops.tiledispatch.conv_backward_weight.default(x, dy, [4, 3, 3, 2], *geometry)
    with tiledispatch.using(picking("conv", vendor=True)):
        for fn, args in ((data, (dy, w)), (weight, (x, dy))):
            targets = traced(fn, table, *args)
            assert torch.ops.aten.convolution_backward.default in targets
            assert not any("tiledispatch" in str(t) for t in targets)
    with tiledispatch.using(picking("conv", vendor=False)):
        assert traced(data, table, dy, w) == [torch.ops.tiledispatch.conv_backward_data.default]
        assert traced(weight, table, x, dy) == [torch.ops.tiledispatch.conv_backward_weight.default]


def test_a_compiled_training_step_whose_picks_are_the_vendors_computes_pytorchs_gradients(table):
    """Forward and both gradients decomposed (aot_eager_decomp_partition): the output and the
    gradients are PyTorch's, and our kernels never run."""
    torch.manual_seed(5)
    x, w = channels_last(2, 6, 7, 5).requires_grad_(), channels_last(4, 3, 3, 2).requires_grad_()
    dy = channels_last(2, 4, 4, 3)

    def model(x, w):
        return tiledispatch.conv(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    torch._dynamo.reset()
    with tiledispatch.using(picking("conv", vendor=True)):
        y = torch.compile(model, fullgraph=True, backend="aot_eager_decomp_partition")(x, w)
        got = torch.autograd.grad(y, (x, w), dy)
    torch._dynamo.reset()
    want = F.conv2d(x, w, None, (2, 1), (1, 0), (1, 2), 2)
    expected = torch.autograd.grad(want, (x, w), dy)
    assert torch.equal(y, want) and all(torch.equal(g, e) for g, e in zip(got, expected))


def test_a_table_inductor_copied_before_the_first_trace_gets_the_decompositions(table, monkeypatch):
    """Inductor compiles with a memoised copy of its table, made at the process's first compile: a
    compile without our ops before the first trace of one must not leave our decompositions out."""
    import threading

    from torch._inductor import decomposition

    for op in inductor._DECOMPOSITIONS:
        monkeypatch.delitem(decomposition.decompositions, op, raising=False)
    decomposition.fast_random_decomps.cache_clear()
    monkeypatch.setattr(inductor, "_REGISTERED", threading.Event())
    copied = decomposition.select_decomp_table()  # a compile of some other model, earlier in the process
    assert not any(op in copied for op in inductor._DECOMPOSITIONS)
    inductor.register()
    table = decomposition.select_decomp_table()
    assert inductor._DECOMPOSITIONS and all(table[op] is fn for op, fn in inductor._DECOMPOSITIONS.items())


def test_under_inductor_without_cuda_graphs_a_pick_that_saves_less_than_its_call_is_aten(table):
    """A kept call costs the compiled graph's host `compiled_call_host_s` more than aten's: a forward
    pick expected to save less device time becomes the vendor's op, unless CUDA graphs replay the
    launches (no host time) or the call is a gradient (cuDNN's cliffs there are not modelled)."""
    from torch._inductor import config

    host_us = ARCH.calibration.compiled_call_host_s * 1e6
    x, w, dy = channels_last(2, 6, 7, 5), channels_last(4, 3, 3, 2), channels_last(2, 4, 4, 3)
    a, b = torch.randn(5, 8).half(), torch.randn(6, 8).half()
    op, aten = torch.ops.tiledispatch.conv.default, torch.ops.aten.convolution.default

    def gemm(a, b):
        return torch.ops.tiledispatch.gemm.default(a, b.t(), None, None, None, None, False, None, None, None, 0)

    def data(dy, w):
        return torch.ops.tiledispatch.conv_backward_data.default(dy, w, [2, 6, 7, 5], [2, 1], [1, 0], [1, 2], 2,
                                                                  False, None, 0)
    with tiledispatch.using(picking("conv", vendor=False, saving_us=host_us / 2)):
        assert traced(conv, table, x, w) == [aten]
        assert traced(data, table, dy, w) == [torch.ops.tiledispatch.conv_backward_data.default]
    with tiledispatch.using(picking("conv", vendor=False, saving_us=host_us / 2)), config.patch(
            {"triton.cudagraphs": True}):
        assert traced(conv, table, x, w) == [op]
    with tiledispatch.using(picking("conv", vendor=False, saving_us=host_us * 2)):
        assert traced(conv, table, x, w) == [op]
    with tiledispatch.using(picking("gemm", vendor=False, saving_us=host_us / 2)):
        assert traced(gemm, table, a, b)[-1] == torch.ops.aten.mm.default
    with tiledispatch.using(picking("gemm", vendor=False, saving_us=host_us * 2)):
        assert torch.ops.tiledispatch.gemm.default in traced(gemm, table, a, b)


def test_a_pick_with_no_vendor_beside_it_or_no_estimate_stays_the_op(table):
    x, w = channels_last(2, 6, 7, 5), channels_last(4, 3, 3, 2)
    d = picking("conv", vendor=False, saving_us=0.0)
    ranked = d.ranked(None)
    d.ranked = lambda problem: ranked[:1]  # the vendor refuses the problem
    with tiledispatch.using(d):
        assert traced(conv, table, x, w) == [torch.ops.tiledispatch.conv.default]
    d = picking("conv", vendor=False, saving_us=0.0)
    d.ranked = lambda problem: tuple(SimpleNamespace(spec=c.spec, score=None) for c in ranked)
    with tiledispatch.using(d):
        assert traced(conv, table, x, w) == [torch.ops.tiledispatch.conv.default]


def attention(q, k, v, causal="none", needs_lse=False, mask=None):
    return torch.ops.tiledispatch.attention.default(q, k, v, None, None, mask, *(None,) * 6, causal, None, None, None,
                                                    0.0, 0, 0, needs_lse, False, None, None, 0)[0]


@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
def test_a_masked_attention_the_vendor_takes_is_cudnn_with_the_mask_as_its_bias(table, additive):
    """As the vendor runs it eagerly (vendor.mask_bias): 0 where a bool mask attends, -inf elsewhere,
    added by cuDNN's op, in rows of 16 bytes (7 keys: a row of 8, the view of 7)."""
    torch.manual_seed(6)
    q = torch.randn(2, 4, 6, 32).half()
    kv, kv_odd = torch.randn(2, 2, 8, 32).half(), torch.randn(2, 2, 7, 32).half()
    op, cudnn = torch.ops.tiledispatch.attention.default, torch.ops.aten._scaled_dot_product_cudnn_attention.default

    def mask_for(keys):
        mask = torch.rand(2, 1, 6, keys.shape[2]) > 0.3
        return torch.zeros(mask.shape).half().masked_fill(~mask, float("-inf")) if additive else mask
    with tiledispatch.using(picking("attention", vendor=True)):
        graph = make_fx(lambda q, k, v, m: attention(q, k, v, mask=m), decomposition_table=table,
                        tracing_mode="fake")(q, kv, kv, mask_for(kv)).graph
        calls = [n for n in graph.nodes if n.op == "call_function"]
        assert op not in [n.target for n in calls]
        (call,) = [n for n in calls if n.target == cudnn]
        bias = call.args[3].meta["val"]
        assert tuple(bias.shape) == (2, 4, 6, 8) and bias.dtype == torch.float16
        graph = make_fx(lambda q, k, v, m: attention(q, k, v, mask=m), decomposition_table=table,
                        tracing_mode="fake")(q, kv_odd, kv_odd, mask_for(kv_odd)).graph
        (call,) = [n for n in graph.nodes if n.op == "call_function" and n.target == cudnn]
        bias = call.args[3].meta["val"]
        assert tuple(bias.shape) == (2, 4, 6, 7) and bias.stride()[-2:] == (8, 1)
        assert op in traced(lambda q, k, v, m: attention(q, k, v, needs_lse=True, mask=m), table, q, kv, kv,
                            mask_for(kv))
    with tiledispatch.using(picking("attention", vendor=False)):
        assert op in traced(lambda q, k, v, m: attention(q, k, v, mask=m), table, q, kv, kv, mask_for(kv))


def test_an_attention_the_vendor_takes_is_sdpa_and_any_other_keeps_the_op(table):
    """Plain SDPA calls only: a traced call that asks for its LSE, or whose causal mask SDPA aligns
    otherwise (bottom-right where Sq != Skv), stays the op whatever the pick."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 4, 6, 32).half() for _ in range(3))
    kv_short = torch.randn(1, 2, 3, 32).half()  # GQA, and Skv != Sq
    op = torch.ops.tiledispatch.attention.default
    with tiledispatch.using(picking("attention", vendor=True)):
        for causal in ("none", "causal", "causal-br"):
            assert op not in traced(lambda q, k, v: attention(q, k, v, causal), table, q, k, v)
        assert op not in traced(lambda q, k, v: attention(q, k, v), table, q, kv_short, kv_short)
        assert op in traced(lambda q, k, v: attention(q, k, v, "causal-br"), table, q, kv_short, kv_short)
        assert op in traced(lambda q, k, v: attention(q, k, v, needs_lse=True), table, q, k, v)
        torch._dynamo.reset()
        for causal, keys in (("causal", k), ("none", kv_short)):
            got = torch.compile(lambda q, k, v: attention(q, k, v, causal), fullgraph=True, dynamic=False,
                                backend="aot_eager_decomp_partition")(q, keys, keys)
            expected = F.scaled_dot_product_attention(q, keys, keys, is_causal=causal == "causal",
                                                      enable_gqa=keys is kv_short)
            assert torch.allclose(got.float(), expected.float(), rtol=1e-3, atol=1e-3)
        torch._dynamo.reset()
    with tiledispatch.using(picking("attention", vendor=False)):
        assert op in traced(lambda q, k, v: attention(q, k, v), table, q, k, v)
