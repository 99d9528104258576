"""Timing a callable: CUDA-event medians on the GPU, one wall-clock run under the interpreter;
and the statistics the benchmark summaries share."""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    median_ms: float
    repeats: int
    method: str  # "cuda-events" or "wall-clock"


def time_call(fn: Callable[[], object], *, on_gpu: bool, repeats: int = 50, warmup: int = 5) -> Timing:
    if not on_gpu:
        start = time.perf_counter()
        fn()
        return Timing((time.perf_counter() - start) * 1e3, 1, "wall-clock")
    import torch

    # Back to back, an event after each call and no sync between them: the warm-up calls keep
    # the GPU busy while the host queues the timed ones, so host time hides behind the GPU's.
    for _ in range(max(1, warmup)):
        fn()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    events[0].record()
    for event in events[1:]:
        fn()
        event.record()
    events[-1].synchronize()
    times = [begin.elapsed_time(end) for begin, end in zip(events, events[1:])]
    return Timing(statistics.median(times), repeats, "cuda-events")


def calls_lasting(fn: Callable[[], object], sample_ms: float, *, least: int, most: int, repeats: int = 1) -> int:
    """How many back-to-back calls of `fn` take about `sample_ms` on the GPU (its median over
    `repeats` calls, after one warm-up), within [least, most]: the size of one timing sample."""
    once_ms = time_call(fn, on_gpu=True, repeats=repeats, warmup=1).median_ms
    return max(least, min(most, round(sample_ms / max(once_ms, 1e-4))))


def host_us_per_call(fn: Callable[[], object], calls: int = 3000, warmup: int = 200) -> float:
    """Host time of a call, in microseconds: wall clock over back-to-back calls whose GPU work
    is tiny, so the host is what paces them (a final synchronize is left out of the count)."""
    return _seconds_per_call(fn, calls, warmup, until_done=False) * 1e6


def wall_ms_per_call(fn: Callable[[], object], calls: int, warmup: int) -> float:
    """Wall-clock milliseconds a call, the GPU synchronised before the first and after the last of
    `calls` back-to-back calls: what a program of such calls takes, its host and its GPU together
    (a step that is bound by the host reads its host time, one bound by the GPU its kernels')."""
    return _seconds_per_call(fn, calls, warmup, until_done=True) * 1e3


def _seconds_per_call(fn: Callable[[], object], calls: int, warmup: int, *, until_done: bool) -> float:
    """Wall-clock seconds a call over `calls` back-to-back calls after `warmup` and a synchronize; the
    clock stops after the GPU has finished them (`until_done`) or as the host has queued the last."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if until_done:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if not until_done:  # the GPU still finishes before the caller goes on
        torch.cuda.synchronize()
    return elapsed / calls


def profiled(fn: Callable[[], object], calls: int):
    """cProfile of `calls` back-to-back calls of `fn` (the GPU, where there is one, synchronised after them): the
    `pstats.Stats` to print, and the wall-clock seconds a call took under the profiler."""
    import cProfile
    import pstats

    import torch

    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    if torch.cuda.is_available():  # a host-only loop (a ranking) has nothing to wait for
        torch.cuda.synchronize()
    return pstats.Stats(profiler), (time.perf_counter() - start) / calls


def graph_sampler(fn: Callable[[object], object], sets: list, calls: int) -> Callable[[], float]:
    """A sampler of the GPU time per call of `fn`: `calls` calls over the rotating input `sets`
    are captured once in a CUDA graph, and each sample times one replay with CUDA events.

    A graph takes host overhead out of the kernel's time, for every provider alike; the
    host cost of a call is measured on its own.
    """
    import torch

    for i in range(2):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    calls = max(calls, len(sets))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()

    def sample() -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / calls

    # The graph reads the buffers of `sets` and of whatever `fn` holds (a plan's outputs and
    # workspace, in its closure) at their capture-time addresses: they live as long as it does.
    sample.inputs = (sets, fn)
    return sample


def event_sampler(fn: Callable[[], object], calls: int) -> Callable[[], float]:
    """A sampler of the time per call of `fn` run `calls` times back to back, CUDA events around them.

    One call is queued before the first event, so the GPU is busy while the host queues
    the timed calls: the time is the GPU's, as long as the host keeps up with it.
    """
    import torch

    fn()
    torch.cuda.synchronize()

    def sample() -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / calls

    return sample


def interleaved_medians(samplers: dict[str, Callable[[], float]], rounds: int, seed: int = 0) -> dict[str, float]:
    """The median per-call time of each sampler, sampled in rounds: one sample of each per round,
    in an order shuffled afresh each round (seeded, so a run can be repeated).

    Why rounds: the H200's clock drifts with its power state by more than 10 % over seconds
    (1.63 against 1.84 ms for the same attention kernel, timed one after the other). Providers
    timed one after another compare their moments as much as their kernels; taken in turns,
    each median is drawn from the same moments as the others.

    Why shuffled: under the power cap a sample also inherits the clock its predecessor left.
    On the long causal attention case (H100, 30 ms calls) a forward+backward sampled right after
    SDPA flash's ran 3-5 % slower than after any other provider (the dispatcher 30.40 ms after
    it, 28.79 after cuDNN), and the suite's fixed order put the dispatcher after flash in every
    round: it read 0.960-0.968x cuDNN there in two suite runs, 1.008x shuffled
    (benchmarks/studies/sampling_order.py; benchmarks/results/h100/sampling_order.txt).
    """
    order, shuffle = list(samplers), random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(rounds):
        shuffle.shuffle(order)
        for name in order:
            samples[name].append(samplers[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def graph_median_ms(fn: Callable[[object], object], sets: list, repeats: int) -> float:
    """GPU time per call of `fn` over the rotating `sets`: the median of 5 replays of a graph of
    `repeats` calls (see `graph_sampler`)."""
    return interleaved_medians({"fn": graph_sampler(fn, sets, repeats)}, rounds=5)["fn"]


def geomean(values) -> float | None:
    """Geometric mean of the values that are set (None and 0 are left out)."""
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def percentile(values, q: float) -> float | None:
    """The nearest-rank q-quantile (q in [0, 1]), or None for no values."""
    values = sorted(values)
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]
