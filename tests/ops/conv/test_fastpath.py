"""The conv fast path (ops/conv/fastpath.py): a bound plan replayed on new tensors of the same signature.

A call is bound on one set of inputs and replayed on a fresh one (other values, NaN-poisoned out),
which must match the float64 reference, for each family the interpreter runs and the vendor, split
workspaces (written whole and atomic) and padded channels among them. Public calls bind only
GPU tensors; here `bind` is driven directly.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tiledispatch
from tiledispatch import Dispatcher, Registry
from tiledispatch.core.errors import InvalidProblemError
from tiledispatch.ops.conv import (
    ConvOperands,
    ConvSignature,
    Direction,
    Family,
    ImplicitGemmConfig,
    SplitMode,
    VendorConfig,
    check_operands,
    fastpath,
    plan,
)
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.problem import ConvEpilogue
from tiledispatch.ops.conv.reference import compare

from .helpers import ARCH, DEVICE, ON_GPU, problem, spec_name


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)


CASES = {  # direction, n, c, k, g, size, filter, stride, padding, dilation
    "forward-grouped": ("forward", 2, 8, 12, 2, (7, 6), (3, 3), 1, 1, 1),
    "forward-depthwise": ("forward", 2, 16, 16, 16, (5, 6), (3, 3), 1, 1, 1),
    "bwd_data-strided": ("bwd_data", 2, 8, 8, 2, (9, 7), (3, 3), 2, 1, 1),
    "bwd_weight-grouped": ("bwd_weight", 2, 8, 8, 2, (7, 6), (3, 3), 1, 1, 1),
    "forward-stem": ("forward", 2, 3, 8, 1, (9, 9), (3, 3), 2, 1, 1),
}


def _first_of_each_family(dispatcher, p) -> list[str]:
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    first: dict[str, str] = {}
    for candidate in dispatcher.explain(ops.problem).ranked:
        first.setdefault(candidate.spec.family, candidate.spec.name)
    return sorted(first.values())


def _kernels() -> list[tuple[str, str]]:
    picked = Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)
    out = []
    for case, args in CASES.items():
        p = problem(*args, dtype="fp32")
        out += [(case, name) for name in _first_of_each_family(picked, p)]
    weight = problem(*CASES["bwd_weight-grouped"], dtype="fp32")
    sig = ConvSignature(weight.direction, weight.types)
    for config in (ImplicitGemmConfig(sig, 32, 16, 16, 2, 2, 2, 3, SplitMode.WORKSPACE),
                   ImplicitGemmConfig(sig, 16, 32, 32, 1, 2, 2, 2, SplitMode.ATOMIC)):
        out.append(("bwd_weight-grouped", spec_name(config)))
    stem = problem(*CASES["forward-stem"], dtype="fp32")
    out.append(("forward-stem", spec_name(ImplicitGemmConfig(ConvSignature(stem.direction, stem.types), 32, 16, 32,
                                                             4, 2, 2, family=Family.IMPLICIT_GEMM_FLAT,
                                                             pad_channels=True))))
    return out


def _tensors(inputs, out) -> tuple:
    return tuple(out if role == "out" else getattr(inputs, role) for role in fastpath.ROLES)


def _family(kernel: str) -> str:
    return kernel.split("_fp32_")[-1].split("_")[0]


def _replays() -> list:
    """(case, kernel, own_out): each kernel binds once, with the caller's out or without it in turn over a
    case's kernels and from case to case, so that every case and every family meets both (not every kernel
    x both)."""
    out, every = [], _kernels()
    for i, case in enumerate(CASES):
        kernels = [kernel for c, kernel in every if c == case]
        for j, kernel in enumerate(kernels):
            own_out = (i + j) % 2 == 0
            out.append(pytest.param(case, kernel, own_out,
                                    id=f"{'out' if own_out else 'allocated'}-{case}-{kernel.split('_fp32_')[-1]}"))
    return out


def test_the_replays_meet_both_outs_in_every_case_and_family():
    met: dict[str, set[bool]] = {}
    for param in _replays():
        case, kernel, own_out = param.values
        met.setdefault(case, set()).add(own_out)
        met.setdefault(_family(kernel), set()).add(own_out)
    assert all(outs == {True, False} for outs in met.values()), met


@pytest.mark.skipif(ON_GPU, reason="the GPU's own calls bind through the public functions (test below)")
@pytest.mark.parametrize(("case", "kernel", "own_out"), _replays())
def test_a_bound_call_replays_on_new_tensors(dispatcher, case, kernel, own_out):
    p = problem(*CASES[case], dtype="fp32")
    first = make_inputs(p, device=DEVICE, seed=0)
    kwargs = first.kwargs(p) | ({} if own_out else {"out": None})
    bound = fastpath.bind(dispatcher, check_operands(p.direction, **kwargs), kernel)
    assert isinstance(bound, fastpath.BoundConv)
    for seed in (1, 2):  # twice: the second call finds the workspaces, descriptors and pointers of the first
        fresh = make_inputs(p, device=DEVICE, seed=seed)  # out poisoned with NaN
        result = bound(_tensors(fresh, fresh.out if own_out else None))
        if own_out:
            assert result is fresh.out
        assert result.shape == fresh.out.shape
        cmp = compare(result, check_operands(p.direction, **fresh.kwargs(p)))
        assert cmp.passed, f"{kernel} replayed: {cmp.to_dict()}"


@pytest.mark.skipif(ON_GPU, reason="driven through bind on the interpreter; the GPU's calls bind publicly")
def test_a_forward_pick_weighed_for_eager_calls_binds_both_and_a_capture_runs_the_device_pick(dispatcher,
                                                                                              monkeypatch):
    """core.hostcost: where the forward's pick is not expected to save an eager call's host time, the
    signature binds the cheaper kernel for eager calls and the pick for graph captures; both compute."""
    from tiledispatch.core import hostcost

    p = problem(*CASES["forward-grouped"], dtype="fp32")
    ops = check_operands(p.direction, **(make_inputs(p, device=DEVICE, seed=0).kwargs(p) | {"out": None}))
    pick = dispatcher.select(ops.problem)
    cheaper = next(c.spec for c in dispatcher.ranked(ops.problem) if c.spec.family != pick.family)
    monkeypatch.setattr(fastpath, "for_eager", lambda d, problem, spec: cheaper if spec is pick else spec)
    bound = fastpath.bind(dispatcher, ops, None)
    assert isinstance(bound, hostcost.ByCapture)
    assert isinstance(bound.eager, fastpath.BoundConv) and isinstance(bound.replayed, fastpath.BoundConv)
    ran = []
    for which in (bound.eager, bound.replayed):
        monkeypatch.setattr(which, "_run", lambda *a, run=which._run, **k: (ran.append(run), run(*a, **k))[1])
    for capturing in (False, True):
        monkeypatch.setattr(hostcost, "capturing", lambda capturing=capturing: capturing)
        fresh = make_inputs(p, device=DEVICE, seed=int(capturing) + 1)
        cmp = compare(bound(_tensors(fresh, None)), check_operands(p.direction, **fresh.kwargs(p)))
        assert cmp.passed, cmp.to_dict()
    assert len(ran) == 2 and ran[0] is not ran[1]  # the eager call ran one bound kernel, the capture the other
    assert isinstance(fastpath.bind(dispatcher, ops, pick.name), fastpath.BoundConv)  # a forced kernel: unweighed


@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
@pytest.mark.parametrize("own_out", [True, False], ids=["out", "allocated"])
def test_the_vendor_stage_replays_on_new_tensors(direction, own_out):
    """cuDNN's stage takes the whole operands, rebuilt a call; its plan is bound by hand here (the
    interpreter's registry has no vendor), on PyTorch's CPU convolution, with a residual and a bias."""
    from tiledispatch.core.kernel import PythonLauncher
    from tiledispatch.ops.conv.plan import kernel_units

    epilogue = {"bias": True, "residual": True} if direction is Direction.FORWARD else {}
    p = problem(direction.value, 2, 8, 12, 2, (7, 6), (3, 3), 1, 1, 1, dtype="fp32",
                **({"epilogue": ConvEpilogue(**epilogue)} if epilogue else {}))
    config = VendorConfig(ConvSignature(p.direction, p.types, p.epilogue))
    first = make_inputs(p, device=DEVICE, seed=0)
    ops = check_operands(p.direction, **(first.kwargs(p) | ({} if own_out else {"out": None})))
    launchers = {unit.stage: PythonLauncher(unit) for unit in kernel_units(config)}
    bound = fastpath.BoundConv(ops, plan(config, ops), launchers)
    for seed in (1, 2):
        fresh = make_inputs(p, device=DEVICE, seed=seed)
        result = bound(_tensors(fresh, fresh.out if own_out else None))
        assert result is fresh.out or not own_out
        cmp = compare(result, check_operands(p.direction, **fresh.kwargs(p)))
        assert cmp.passed, cmp.to_dict()


def test_a_call_whose_operands_were_copied_is_not_bound(dispatcher):
    """A contiguous (NC...) x is copied into channels-last by the checks: the plan reads the copy,
    which a replay would not refresh, so the signature takes the checked path each time."""
    p = problem(*CASES["forward-grouped"], dtype="fp32")
    inputs = make_inputs(p, device=DEVICE, channels_last=False)
    ops = check_operands(p.direction, **inputs.kwargs(p))
    assert "x" in ops.converted
    assert fastpath.bind(dispatcher, ops, None) is fastpath.UNBOUND


def test_a_replay_checks_aliasing_where_the_pointers_change(dispatcher):
    p = problem("forward", 2, 8, 8, 1, (5, 5), (1, 1), 1, 0, 1, dtype="fp32")  # out is shaped as x
    inputs = make_inputs(p, device=DEVICE)
    bound = fastpath.bind(dispatcher, check_operands(p.direction, **inputs.kwargs(p)), None)
    assert isinstance(bound, fastpath.BoundConv)
    with pytest.raises(InvalidProblemError, match="out overlaps x"):
        bound(_tensors(inputs, inputs.x))


def test_plans_list_the_tensors_they_make():
    """Plan.scratch: what a replay may make anew (split workspaces, padded copies)."""
    weight = problem(*CASES["bwd_weight-grouped"], dtype="fp32")
    ops = check_operands(weight.direction, **make_inputs(weight, device=DEVICE).kwargs(weight))
    sig = ConvSignature(weight.direction, weight.types)
    split = plan(ImplicitGemmConfig(sig, 32, 16, 16, 2, 2, 2, 3, SplitMode.WORKSPACE), ops)
    (workspace,) = split.scratch
    assert workspace.dtype == torch.float32 and split.zeroed == ()
    assert plan(ImplicitGemmConfig(sig, 32, 32, 32, 4, 4, 2), ops).scratch == ()
    stem = problem(*CASES["forward-stem"], dtype="fp32")
    ops = check_operands(stem.direction, **make_inputs(stem, device=DEVICE).kwargs(stem))
    padded = plan(ImplicitGemmConfig(ConvSignature(stem.direction, stem.types), 32, 16, 32, 4, 2, 2,
                                     family=Family.IMPLICIT_GEMM_FLAT, pad_channels=True), ops)
    assert [t.shape[1] for t in padded.scratch] == [4, 4]  # x and w, C = 3 padded to a 16-byte fp32 vector


def test_the_roles_are_the_operands_fields_in_order():
    """The vendor stage's operands are rebuilt as ConvOperands(problem, *tensors)."""
    assert fastpath.ROLES == tuple(f.name for f in dataclasses.fields(ConvOperands))[1:7]


def test_only_gpu_tensors_and_hashable_options_have_a_signature():
    x = torch.zeros(1, 8, 4, 4)
    assert fastpath.call_key(Direction.FORWARD, (x, x, None, None, None, None), (("stride", 1),)) is None


PUBLIC = {  # each direction's function and its positional arguments
    Direction.FORWARD: (tiledispatch.conv, ("x", "w")),
    Direction.BWD_DATA: (tiledispatch.conv_backward_data, ("dy", "w", "input_size")),
    Direction.BWD_WEIGHT: (tiledispatch.conv_backward_weight, ("x", "dy", "weight_size")),
}


@pytest.mark.skipif(not ON_GPU, reason="public calls bind GPU tensors only")
@pytest.mark.parametrize("vendor", [False, True], ids=["selected", "vendor"])
@pytest.mark.parametrize("own_out", [True, False], ids=["out", "allocated"])
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_public_calls_bind_once_and_replay(direction, own_out, vendor):
    """The second and third calls of a signature replay the first one's bound plan, on their own tensors."""
    d = Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)
    p = problem(direction.value, 2, 16, 16, 16, (9, 10), (3, 3), 1, 1, 1, dtype="bf16")
    function, positional = PUBLIC[direction]
    kernel = spec_name(VendorConfig(ConvSignature(p.direction, p.types))) if vendor else None
    for seed in (0, 1, 2):
        inputs = make_inputs(p, device=DEVICE, seed=seed)
        kwargs = inputs.kwargs(p)
        args = [kwargs.pop(name) for name in positional]
        keywords = {k: v for k, v in kwargs.items() if k in ("stride", "padding", "dilation", "groups")}
        result = function(*args, **keywords, out=inputs.out if own_out else None, kernel=kernel, dispatcher=d)
        assert result is inputs.out or not own_out
        cmp = compare(result, check_operands(p.direction, **inputs.kwargs(p)))
        assert cmp.passed, cmp.to_dict()
    # a plain 16-bit forward on the vendor is PyTorch's own call; every other one a bound plan
    plain_vendor = direction is Direction.FORWARD and not own_out and (vendor or d.select(p).family == "vendor")
    assert [type(b) for b in d._bound.values()] == [fastpath.DirectConv if plain_vendor else fastpath.BoundConv]


def test_a_model_s_parameters_have_a_signature():
    """A layer's weight and bias are nn.Parameters: a signature stands for them as for tensors
    (a model whose calls all took the checked path ran 0.15x PyTorch eager)."""
    x = torch.randn(2, 4, 5, 5).to(memory_format=torch.channels_last)
    w = torch.nn.Parameter(torch.randn(8, 4, 3, 3).to(memory_format=torch.channels_last))
    bias = torch.nn.Parameter(torch.randn(8))
    tensors = (x, w, None, bias, None, None)
    assert fastpath.replayable(tensors)
    assert not fastpath.replayable((x, w, None, bias.neg().detach()._neg_view(), None, None))


@pytest.mark.parametrize("with_bias", [False, True], ids=["plain", "bias"])
def test_a_plain_vendor_forward_is_pytorch_s_own_call(with_bias):
    """DirectConv: the vendor bound to a plain 2-D forward calls torch.conv2d on the caller's
    tensors (here on the CPU), and only such calls: an epilogue, an out or fp32 keep the plan."""
    from types import SimpleNamespace

    p = problem("forward", 2, 8, 12, 2, (7, 6), (3, 3), 2, 1, 1, dtype="fp16",
                **({"epilogue": ConvEpilogue(bias=True)} if with_bias else {}))
    inputs = make_inputs(p, device=DEVICE, seed=3)
    ops = check_operands(p.direction, **(inputs.kwargs(p) | {"out": None}))
    vendor = SimpleNamespace(family="vendor")
    assert fastpath.DirectConv.takes(vendor, ops)
    assert not fastpath.DirectConv.takes(SimpleNamespace(family="igemm"), ops)
    assert not fastpath.DirectConv.takes(vendor, check_operands(p.direction, **inputs.kwargs(p)))  # out given
    fp32 = problem("forward", 2, 8, 12, 2, (7, 6), (3, 3), 2, 1, 1, dtype="fp32")
    assert not fastpath.DirectConv.takes(vendor, check_operands(fp32.direction, **(
        make_inputs(fp32, device=DEVICE).kwargs(fp32) | {"out": None})))
    fresh = make_inputs(p, device=DEVICE, seed=4)
    y = fastpath.DirectConv(ops)((fresh.x, fresh.w, None, fresh.bias, None, None))
    assert y.is_contiguous(memory_format=torch.channels_last)
    cmp = compare(y.float().to(fresh.out.dtype), check_operands(p.direction, **fresh.kwargs(p)))
    assert cmp.passed, cmp.to_dict()


def test_the_custom_ops_list_arguments_reach_the_fast_path_as_tuples(monkeypatch):
    """torch.library hands int[] arguments over as lists, which no signature can hold: eager_run
    passes them on as tuples, and every training step's conv took the checked path before it."""
    from tiledispatch.ops.conv import function

    seen = {}
    monkeypatch.setattr(function, "_eager", lambda direction, d, kernel, arguments: seen.update(arguments))
    function.eager_run(Direction.FORWARD, None, None, x=None, w=None, stride=[1, 2], padding=[0, 1], groups=1)
    assert seen["stride"] == (1, 2) and type(seen["stride"]) is tuple and type(seen["padding"]) is tuple
    key = fastpath.typed(tuple(seen.items()))
    assert hash(key) is not None
