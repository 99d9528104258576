"""The timing helpers: interleaved_medians (one sample of each sampler a round, in an order that
varies, medians kept apart) and the wall clock of a run of calls."""

import pytest

from tiledispatch.bench.timing import graph_sampler, interleaved_medians, wall_ms_per_call

from ..conftest import on_gpu


def test_each_sampler_once_a_round_in_varying_orders():
    rounds, calls = 6, []
    values = {"a": [3.0, 1.0, 2.0, 9.0, 2.0, 2.0], "b": [5.0] * 6, "c": [7.0, 8.0, 6.0, 7.0, 7.0, 0.0]}

    def sampler(name):
        def sample():
            calls.append(name)
            return values[name][sum(1 for c in calls if c == name) - 1]
        return sample

    medians = interleaved_medians({name: sampler(name) for name in values}, rounds)
    assert medians == {"a": 2.0, "b": 5.0, "c": 7.0}
    chunks = [tuple(calls[i:i + 3]) for i in range(0, len(calls), 3)]
    assert all(sorted(chunk) == ["a", "b", "c"] for chunk in chunks)  # every sampler once a round
    assert len(set(chunks)) > 1  # the order changes between rounds
    assert {chunk[0] for chunk in chunks} != {"a"}  # not always the first sampler first


def test_seeded_order_repeats():
    def orders(seed):
        calls = []
        samplers = {n: (lambda n=n: calls.append(n) or 1.0) for n in "abcd"}
        interleaved_medians(samplers, 5, seed=seed)
        return calls

    assert orders(3) == orders(3)


@pytest.mark.skipif(not on_gpu(), reason="CUDA graphs need a GPU")
def test_graph_sampler_keeps_its_inputs_alive():
    """The graph replays reads of the sets' buffers: a caller that drops its own references (a loop
    rebinding them, say) must not leave the graph reading freed memory, or another tensor's."""
    import gc

    import torch

    def sampler_of_doubling():
        sets = [torch.randn(1 << 16, device="cuda") for _ in range(2)]
        outs = [torch.empty_like(s) for s in sets]
        pairs = [{"src": s, "dst": d} for s, d in zip(sets, outs)]
        expected = [s * 2 for s in sets]
        return graph_sampler(lambda p: torch.mul(p["src"], 2, out=p["dst"]), pairs, 4), outs, expected

    sample, outs, expected = sampler_of_doubling()
    gc.collect()
    # Same-size blocks: the caching allocator hands out the sources' blocks, were they freed.
    clobber = [torch.full((1 << 16,), float("nan"), device="cuda") for _ in range(8)]
    for out in outs:
        out.fill_(float("nan"))
    assert sample() > 0
    torch.cuda.synchronize()
    for out, want in zip(outs, expected):
        assert torch.equal(out, want)  # read from the sources, not from a NaN-filled block
    assert all(torch.isnan(c).all() for c in clobber)


def test_wall_time_counts_the_timed_calls_between_two_synchronisations(monkeypatch):
    """The warm-up runs before the first synchronisation and is not counted; the last synchronisation is."""
    import time

    import torch

    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))

    def call():
        events.append("call")
        time.sleep(0.002)
    ms = wall_ms_per_call(call, calls=5, warmup=2)
    assert events == ["call"] * 2 + ["sync"] + ["call"] * 5 + ["sync"]
    assert 2.0 <= ms < 20.0


def test_graph_sampler_keeps_what_its_function_holds(monkeypatch):
    """A sweep's sampler is made from a closure over a kernel's plans (its outputs, a split-K
    workspace) and outlives the function that made it: the graph writes those buffers at their
    capture-time addresses, so the sampler must hold the closure."""
    import gc
    import weakref

    import torch

    class Graph:  # stands in for a CUDA graph: replay runs what was captured
        def replay(self):
            pass

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: __import__("contextlib").nullcontext())

    class Workspace:
        pass

    def make():
        workspace = Workspace()
        return graph_sampler(lambda _: workspace, [None], 2), weakref.ref(workspace)

    sample, held = make()
    gc.collect()
    assert held() is not None
    del sample
    gc.collect()
    assert held() is None  # held by the sampler, not leaked
