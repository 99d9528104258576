"""tiledispatch.nn: the modules compute what PyTorch's compute, forward and backward, keep one call
per signature and forget it when the signature changes, and leave nothing of it in a copy."""

import copy
import pickle

import pytest
import torch
import torch.nn as nn

import tiledispatch
import tiledispatch.nn as tdnn
from tests.conftest import on_gpu, requires_gpu, requires_interpreter

DEVICE = "cuda" if on_gpu() else "cpu"
pytestmark = [] if on_gpu() else [requires_interpreter]


@pytest.fixture(autouse=True)
def _exact_fp32():
    """fp32 without TF32, so that ours and PyTorch's both compare with float64 (on a GPU cuDNN's
    switch is on by default, and the modules follow it as nn.Conv2d does: see the TF32 test)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _pair(make, *args, **kwargs):
    """(PyTorch's module in float64, ours in fp32) with the same weights."""
    torch.manual_seed(0)
    theirs = make(*args, **kwargs).double().to(DEVICE)
    ours = tdnn.patch(copy.deepcopy(theirs)).float()
    return theirs, ours


def _check(theirs, ours, x, tol=2e-4):
    with torch.no_grad():
        want = theirs(x.double())
        got = ours(x.float().clone())
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


CASES = [
    (nn.Conv1d, (4, 6, 3), dict(padding=1), (2, 4, 9)),
    (nn.Conv2d, (4, 8, 3), dict(stride=2, padding=1, bias=False), (2, 4, 7, 7)),
    (nn.Conv2d, (8, 8, 3), dict(padding="same", groups=4, dilation=2), (1, 8, 6, 6)),
    (nn.Conv2d, (4, 4, 3), dict(padding=1, padding_mode="reflect"), (1, 4, 5, 5)),
    (nn.Conv3d, (2, 4, (1, 3, 3)), dict(padding=(0, 1, 1)), (1, 2, 3, 5, 5)),
    (nn.Linear, (12, 5), {}, (2, 3, 12)),
]


@pytest.mark.parametrize("make, args, kwargs, shape", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_a_module_matches_pytorch_and_keeps_one_call_per_signature(make, args, kwargs, shape):
    theirs, ours = _pair(make, *args, **kwargs)
    assert type(ours).__module__ == "tiledispatch.nn"
    x = torch.randn(*shape, device=DEVICE)
    for _ in range(2):  # the second call replays what the first kept
        _check(theirs, ours, x)
    kept = ours.__dict__["_tiledispatch_last"]
    bigger = torch.randn(shape[0] + 1, *shape[1:], device=DEVICE)
    _check(theirs, ours, bigger)  # a new signature: a new call kept, the right answer
    assert ours.__dict__["_tiledispatch_last"].shape == bigger.shape != kept.shape
    _check(theirs, ours, x)


def test_a_weight_replaced_in_place_or_through_data_is_seen():
    theirs, ours = _pair(nn.Conv2d, 4, 6, 3, padding=1)
    x = torch.randn(1, 4, 5, 5, device=DEVICE)
    _check(theirs, ours, x)
    with torch.no_grad():  # same storage, new values
        theirs.weight.mul_(-2)
        ours.weight.mul_(-2)
    _check(theirs, ours, x)
    fresh = torch.randn(6, 4, 1, 1, device=DEVICE)  # same Parameter object, another shape and storage
    theirs.weight.data, ours.weight.data = fresh.double(), fresh.clone()
    theirs.padding = ours.padding = (0, 0)
    _check(theirs, ours, x)


def test_setting_an_option_drops_the_kept_call():
    """The kept call's check reads none of the module's options: setting one (or any attribute)
    drops the call, and the next call binds for the new options."""
    theirs, ours = _pair(nn.Conv2d, 4, 6, 3, padding=1)
    x = torch.randn(2, 4, 7, 7, device=DEVICE)
    _check(theirs, ours, x)
    for name, value in (("stride", (2, 2)), ("dilation", (2, 1)), ("padding", (0, 2)), ("groups", 2)):
        if name == "groups":
            theirs.weight.data, ours.weight.data = theirs.weight.data[:, :2].clone(), ours.weight.data[:, :2].clone()
        setattr(theirs, name, value)
        setattr(ours, name, value)
        assert "_tiledispatch_last" not in ours.__dict__
        _check(theirs, ours, x)
    _, linear = _pair(nn.Linear, 4, 3)
    linear(torch.randn(2, 4, device=DEVICE))
    linear.bias = None
    h = torch.randn(2, 4, device=DEVICE)
    torch.testing.assert_close(linear(h), h @ linear.weight.t())


@pytest.mark.parametrize("make, args, shape", [(nn.Conv2d, (3, 4, 3), (2, 3, 6, 6)), (nn.Linear, (6, 4), (3, 6))])
def test_gradients_match_pytorch(make, args, shape):
    theirs, ours = _pair(make, *args)
    x = torch.randn(*shape, device=DEVICE)
    xt, xo = x.double().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn_like(theirs(xt))
    with torch.no_grad():
        ours(xo)  # kept without autograd first: a recorded call must not run that
    for _ in range(2):
        xo.grad = None
        for p in ours.parameters():
            p.grad = None
        ours(xo).backward(dy.float())
    theirs(xt).backward(dy)
    for name, got, want in (("x", xo.grad, xt.grad), ("weight", ours.weight.grad, theirs.weight.grad),
                            ("bias", ours.bias.grad, theirs.bias.grad)):
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4, msg=lambda m: f"d{name}: {m}")


def test_patch_swaps_exact_classes_in_place_and_leaves_subclasses():
    class Mine(nn.Linear):
        pass

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), Mine(4, 4)))
    weight = model[0].weight
    assert tdnn.patch(model) is model
    assert [type(m) for m in (model[0], model[1], model[2][0], model[2][1])] == [tdnn.Conv2d, nn.ReLU, tdnn.Linear,
                                                                                  Mine]
    assert model[0].weight is weight
    with pytest.raises(TypeError, match="nn.Module"):
        tdnn.patch(object())


def test_copies_and_pickles_leave_the_kept_call_behind():
    _, ours = _pair(nn.Linear, 4, 3)
    ours(torch.randn(2, 4, device=DEVICE))
    assert "_tiledispatch_last" in ours.__dict__
    for twin in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert "_tiledispatch_last" not in twin.__dict__
        x = torch.randn(2, 4, device=DEVICE)
        torch.testing.assert_close(twin(x), ours(x))


def test_an_input_that_is_not_a_tensor_is_named():
    _, ours = _pair(nn.Conv2d, 3, 4, 3)
    with pytest.raises(tiledispatch.TiledispatchError, match="x"):
        ours([[1.0]])
    _, linear = _pair(nn.Linear, 3, 4)
    with pytest.raises(TypeError, match="takes a tensor"):
        linear("x")


def test_compile_fullgraph_of_a_patched_model_matches_eager():
    torch.manual_seed(0)
    model = tdnn.patch(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                     nn.Linear(4 * 5 * 5, 6))).to(DEVICE)
    x = torch.randn(2, 3, 5, 5, device=DEVICE)
    with torch.no_grad():
        want = model(x)
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@requires_gpu
def test_a_cuda_graph_capture_of_patched_bf16_modules_matches_their_eager_calls():
    torch.manual_seed(0)
    model = tdnn.patch(nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1, groups=64),
                                     nn.Flatten(), nn.Linear(64 * 16 * 16, 32)))
    model = model.cuda().bfloat16().to(memory_format=torch.channels_last)
    x = torch.randn(8, 32, 16, 16, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        eager = model(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = model(x)
        replayed.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(replayed.float(), eager.float(), rtol=2e-2, atol=2e-2)
    # the same modules, now recorded by autograd: the gradients are PyTorch's own modules'
    theirs = copy.deepcopy(model)
    for module in theirs.modules():
        if type(module).__module__ == "tiledispatch.nn":
            module.__class__ = next(c for c in type(module).__mro__ if c.__module__.startswith("torch.nn"))
    grads = []
    for net in (model, theirs):
        xg = x.clone().requires_grad_()
        net(xg).float().square().sum().backward()
        grads.append((xg.grad.float(), net[0].weight.grad.float(), net[3].bias.grad.float()))
    for name, got, want in zip(("x", "conv weight", "linear bias"), *grads):
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2, msg=lambda m: f"d{name}: {m}")


def test_a_parametrized_weight_is_read_through_its_parametrization():
    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w

    theirs, ours = _pair(nn.Conv2d, 3, 4, 3, padding=1)
    x = torch.randn(1, 3, 5, 5, device=DEVICE)
    _check(theirs, ours, x)
    for module in (theirs, ours):
        nn.utils.parametrize.register_parametrization(module, "weight", Doubled())
    _check(theirs, ours, x)


def test_the_modules_follow_pytorchs_tf32_switches():
    theirs, ours = _pair(nn.Conv2d, 8, 8, 3, padding=1)
    linear_theirs, linear_ours = _pair(nn.Linear, 16, 8)
    theirs, linear_theirs = theirs.float(), linear_theirs.float()
    x, h = torch.randn(2, 8, 6, 6, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    for tf32 in (False, True):
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
        tol = 5e-3 if tf32 and on_gpu() else 1e-4
        with torch.no_grad():
            torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)
            torch.testing.assert_close(linear_ours(h), linear_theirs(h), rtol=tol, atol=tol)
        assert ours.__dict__["_tiledispatch_last"].tf32 is tf32  # the switch the kept call was bound under


@pytest.mark.parametrize("make, args, shape", [(nn.Conv2d, (3, 4, 3), (2, 3, 6, 6)), (nn.Linear, (6, 4), (3, 6))])
def test_under_autocast_the_modules_run_in_its_dtype_as_pytorchs_do(make, args, shape):
    dtype = torch.bfloat16 if on_gpu() else torch.float16  # the interpreter has no bf16 tl.dot
    torch.manual_seed(0)
    theirs = make(*args).to(DEVICE)
    ours = tdnn.patch(copy.deepcopy(theirs))
    x = torch.randn(*shape, device=DEVICE)
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast(DEVICE, dtype=dtype):
        want, got = theirs(xt), ours(xo)
        assert got.dtype == want.dtype == dtype
        with torch.no_grad():
            assert ours(x).dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    want.float().sum().backward()
    got.float().sum().backward()
    assert ours.weight.grad.dtype == torch.float32  # the parameters stay fp32, their gradients too
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(xo.grad, xt.grad, rtol=3e-2, atol=3e-2)


def test_calls_the_ops_do_not_take_run_pytorchs_own_op_as_the_module_would():
    """fp64, an empty batch and a conv's unbatched input: PyTorch's op, with PyTorch's answer."""
    torch.manual_seed(0)
    for make, args, shapes in ((nn.Conv2d, (3, 4, 3), ((3, 5, 5), (0, 3, 5, 5))), (nn.Linear, (4, 3), ((0, 4),))):
        theirs = make(*args).to(DEVICE)
        ours = tdnn.patch(copy.deepcopy(theirs))
        for shape in shapes:
            x = torch.randn(*shape, device=DEVICE)
            assert torch.equal(ours(x), theirs(x))
        wide_theirs, wide_ours = theirs.double(), ours.double()
        x = torch.randn(*((2, 3, 5, 5) if make is nn.Conv2d else (2, 4)), device=DEVICE, dtype=torch.float64)
        assert torch.equal(wide_ours(x), wide_theirs(x))
