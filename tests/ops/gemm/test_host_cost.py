"""The host term of the GEMM ranking: a call costs the longer of its launches and its kernels."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.ops.gemm import check_operands
from tiledispatch.ops.gemm.config import Family, GemmConfig, VendorConfig
from tiledispatch.ops.gemm.problem import Epilogue, GemmLayout, GemmTypes
from tiledispatch.ops.gemm.ranking import device_score, host_seconds, replay_pick, rule_score

SM90 = arch.load("sm_90")


def problem(m: int, n: int, k: int, dtype=torch.bfloat16):
    a = torch.empty(m, k, device="meta", dtype=dtype)
    b = torch.empty(k, n, device="meta", dtype=dtype)
    return check_operands(a, b).problem


def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "default", SM90), SM90)


def ranked(p):
    return dispatcher().explain(p).ranked


def test_a_launch_bound_problem_goes_to_the_cheapest_launch():
    """16x16: every kernel ends before any launch returns; torch.mm takes 3 us more host time
    than a bound Triton launch, so the rules take a one-launch Triton kernel."""
    candidates = ranked(problem(16, 16, 16))
    first = candidates[0]
    assert first.spec.family != "vendor", first.spec.name
    assert first.spec.config.split_k == 1
    vendor = next(c for c in candidates if c.spec.family == "vendor")
    assert vendor.score.terms["modelled_us"] < first.score.terms["modelled_us"]  # faster on the device alone
    assert vendor.score.terms["call_us"] > first.score.terms["call_us"]


def test_launch_bound_kernels_of_one_host_cost_keep_their_device_order():
    p = problem(256, 256, 256)
    single = [c for c in ranked(p) if c.spec.family != "vendor" and c.spec.config.layout == p.layout
              and host_seconds(c.spec.config, p, SM90) == host_seconds(replace(c.spec.config, split_k=1), p, SM90)]
    assert len(single) > 3
    devices = [device_score(c.spec.config, p, SM90).value for c in single]
    assert devices == sorted(devices, reverse=True)


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (256, 8192, 8192)])
def test_kernels_longer_than_their_launches_are_ranked_by_device_time(shape):
    p = problem(*shape)
    for candidate in ranked(p)[:5]:
        config = candidate.spec.config
        device = device_score(config, p, SM90)
        assert device.terms["modelled_us"] > 2 * candidate.score.terms["host_us"]
        assert rule_score(config, p, SM90).value == pytest.approx(device.value, rel=5e-3)


def test_each_stage_is_one_more_launch():
    bf16 = GemmTypes.parse("bf16")
    p = problem(64, 64, 65536)
    base = GemmConfig(Family.TILED, bf16, GemmLayout.parse("rrr"), Epilogue(), 64, 64, 64, group_m=8,
                      num_warps=4, num_stages=3)
    split = replace(base, split_k=8)
    launch_s = SM90.calibration.host_launch_s
    assert host_seconds(split, p, SM90) == pytest.approx(host_seconds(base, p, SM90) + launch_s)
    vendor = VendorConfig(bf16, GemmLayout.parse("sss"), Epilogue())
    with_bias = replace(p, epilogue=Epilogue(bias=True))
    assert host_seconds(vendor, with_bias, SM90) == pytest.approx(host_seconds(vendor, p, SM90) + launch_s)


def test_graph_replays_of_a_launch_bound_call_take_the_fastest_kernel_on_the_device():
    """A replay has no host time: 16x16 replays cuBLAS (the model's shortest kernel) while eager
    calls launch Triton; a problem whose kernels outlast the launches replays the selection."""
    d = dispatcher()
    tiny = problem(16, 16, 16)
    assert d.select(tiny).family != "vendor"
    replayed = replay_pick(d, tiny)
    best = max(ranked(tiny), key=lambda c: device_score(c.spec.config, tiny, SM90).value)
    assert replayed.name == best.spec.name and replayed.family == "vendor"
    for shape in ((4096, 4096, 4096), (128, 4096, 4096)):
        p = problem(*shape)
        assert replay_pick(d, p).name == d.select(p).name


def test_replays_under_autotune_run_the_eager_pick():
    """`autotune` times kernels on the device, so its winner is already the graph's pick."""
    from tiledispatch.core.dispatcher import Strategy

    d = Dispatcher(Registry.from_rule_set("gemm", "default", SM90), SM90, strategy=Strategy.AUTOTUNE)
    tiny = problem(16, 16, 16)
    eager = next(c.spec for c in ranked(tiny) if c.spec.family != "vendor")
    assert replay_pick(d, tiny, eager).name == eager.name
