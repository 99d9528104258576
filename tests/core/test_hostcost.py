"""core.hostcost: where a call's host time is exposed, a pick that is not the vendor's must save more
device time than it costs the host; eager recorded calls whose picks together do not save the twin's
host time run PyTorch's own op, and a graph capture runs the device's picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core import hostcost
from tiledispatch.core.hostcost import ByCapture, eager_host_s, weighed

SM90 = arch.load("sm_90")
HOST_S = SM90.calibration.eager_call_host_s
RECORDED_S = SM90.calibration.recorded_call_host_s
# a pick's saving over the vendor a direction: below an eager call's host time; above it, though the
# three directions' together stay below a recorded call's; and above that
SAVINGS_US = [5.0, 50.0, 500.0]


def spec(name: str, vendor: bool, family: str | None = None):
    return SimpleNamespace(name=name, is_vendor=vendor, family=family or ("vendor" if vendor else "igemm"),
                           definition=SimpleNamespace(specialization_of=lambda problem: None))


def candidate(s, modelled_us):
    return SimpleNamespace(spec=s, score=None if modelled_us is None else SimpleNamespace(
        terms={"modelled_us": modelled_us}))


def ranked_by(*candidates):
    return SimpleNamespace(ranked=lambda problem: candidates)


PICK, VENDOR = spec("pick", False), spec("vendor", True)


@pytest.mark.parametrize("saving_us, kept", [(HOST_S * 1e6 / 2, False), (HOST_S * 1e6 * 2, True), (-5.0, False)])
def test_a_pick_is_kept_only_where_it_saves_more_device_time_than_the_host_time(saving_us, kept):
    d = ranked_by(candidate(PICK, 40.0), candidate(VENDOR, 40.0 + saving_us))
    assert weighed(d, None, PICK, HOST_S) is (PICK if kept else VENDOR)


def test_no_host_time_a_vendor_pick_no_vendor_or_no_estimate_keep_the_pick():
    cheap = ranked_by(candidate(PICK, 40.0), candidate(VENDOR, 40.1))
    assert weighed(cheap, None, PICK, 0.0) is PICK  # a graph replay: no host time to weigh
    assert weighed(cheap, None, VENDOR, HOST_S) is VENDOR
    assert weighed(ranked_by(candidate(PICK, 40.0)), None, PICK, HOST_S) is PICK  # the vendor refuses it
    assert weighed(ranked_by(candidate(PICK, None), candidate(VENDOR, 40.1)), None, PICK, HOST_S) is PICK
    assert weighed(ranked_by(candidate(PICK, 40.0), candidate(VENDOR, None)), None, PICK, HOST_S) is PICK


def test_an_eager_call_weighs_the_arch_figure_and_the_interpreter_weighs_nothing():
    assert HOST_S == 30e-6
    assert eager_host_s(SimpleNamespace(arch=SM90)) == HOST_S
    assert eager_host_s(SimpleNamespace(arch=arch.load("interpreter"))) == 0.0


def test_by_capture_runs_the_device_pick_only_while_a_graph_is_captured(monkeypatch):
    calls = []
    both = ByCapture(lambda *a: calls.append(("eager", a)), lambda *a: calls.append(("replayed", a)))
    for capturing in (False, True):
        monkeypatch.setattr(hostcost, "capturing", lambda capturing=capturing: capturing)
        both(1, 2)
    assert calls == [("eager", (1, 2)), ("replayed", (1, 2))]


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="a CUDA build answers with its own query")
def test_a_pytorch_without_cuda_is_never_capturing():
    """Its raw query raises ("dummy base class"): a weighed recorded call on the CPU asks it."""
    assert hostcost.capturing() is False


def test_a_pick_that_fails_to_load_ahead_of_a_capture_leaves_the_eager_pick(monkeypatch):
    """eager_pick loads the device's pick for a later capture; a build failure there is the capture's
    to meet (its own call selects past a failing kernel), not this eager call's."""
    from tiledispatch.core.errors import BuildError

    d = _weighing("gemm", monkeypatch, 5.0)

    def fails(spec, specialization):
        raise BuildError("no compiler here")
    monkeypatch.setattr(d, "launchers", fails)
    pick, eager = hostcost.eager_pick(d, None, None)
    assert pick.name == "pick" and eager.is_vendor


def _weighing(op: str, monkeypatch, saving_us: float) -> Dispatcher:
    """An sm_90 dispatcher (on this CPU) whose picks are Triton kernels that save `saving_us` over the vendor."""
    d = Dispatcher(Registry.from_rule_set(op, "tests", SM90), SM90)
    pick, vendor = spec("pick", False, "igemm" if op == "conv" else "tiled"), spec("vendor", True)
    monkeypatch.setattr(d, "select", lambda problem, device=None: pick)
    monkeypatch.setattr(d, "ranked", lambda problem: (candidate(pick, 40.0), candidate(vendor, 40.0 + saving_us)))
    d.loaded = []  # the kernels loaded ahead of a capture
    monkeypatch.setattr(d, "launchers", lambda s, specialization: d.loaded.append(s.name))
    return d


@pytest.mark.parametrize("saving_us", SAVINGS_US)
def test_a_recorded_conv_whose_picks_save_less_than_the_host_time_is_pytorchs_own_but_not_in_a_capture(
        monkeypatch, saving_us):
    """The forward's and both gradients' savings together are weighed against the twin's host time; a
    capture runs the device's picks, loaded beforehand."""
    from tiledispatch.ops.conv import joint

    d = _weighing("conv", monkeypatch, saving_us)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 7, 5, generator=g).bfloat16().contiguous(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 2, generator=g).bfloat16().contiguous(memory_format=torch.channels_last)
    options = ((2, 1), (1, 0), (1, 2), 2, False)
    monkeypatch.setattr(joint, "capturing", lambda: False)
    native = joint.native_forward(x, w, None, options, d)
    assert HOST_S * 1e6 < 50.0 < 3 * 50.0 < RECORDED_S * 1e6 < 500.0
    if 3 * saving_us > RECORDED_S * 1e6:
        assert native is None  # the saving pays for the host time: the op's twin runs our picks
        return
    assert native is not None and native.weighed and d.loaded == ["pick"] * 3
    assert torch.equal(native(x, w, None), F.conv2d(x, w, None, (2, 1), (1, 0), (1, 2), 2))
    monkeypatch.setattr(joint, "capturing", lambda: True)
    assert joint.native_forward(x, w, None, options, d) is None  # a capture: the device's picks


@pytest.mark.parametrize("saving_us", SAVINGS_US)
def test_a_recorded_gemm_whose_picks_save_less_than_the_host_time_is_pytorchs_own_but_not_in_a_capture(
        monkeypatch, saving_us):
    from tiledispatch.ops.gemm import native as gemm_native

    d = _weighing("gemm", monkeypatch, saving_us)
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(24, 40, generator=g).bfloat16(), torch.randn(16, 40, generator=g).bfloat16().t()
    bias = torch.randn(16, generator=g).bfloat16()
    monkeypatch.setattr(gemm_native, "capturing", lambda: False)
    native = gemm_native.native_forward(a, b, bias, d)
    if 3 * saving_us > RECORDED_S * 1e6:
        assert native is None
        return
    assert torch.equal(native(a, b, bias), torch.addmm(bias, a, b))
    assert d.loaded == ["pick"] * 3  # the forward's, dA's and dB's, which a capture's twin runs
    monkeypatch.setattr(gemm_native, "capturing", lambda: True)
    assert gemm_native.native_forward(a, b, bias, d) is None
