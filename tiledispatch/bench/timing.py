"""Timing a callable: CUDA-event medians on the GPU, one wall-clock run under the interpreter;
and the statistics the benchmark summaries share."""

from __future__ import annotations

import math
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

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return Timing(statistics.median(times), repeats, "cuda-events")


def host_us_per_call(fn: Callable[[], object], calls: int = 3000, warmup: int = 200) -> float:
    """Host time of a call, in microseconds: wall clock over back-to-back calls whose GPU work
    is tiny, so the host is what paces them (a final synchronize is left out of the count)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def graph_median_ms(fn: Callable[[object], object], sets: list, repeats: int) -> float:
    """GPU time per call: `repeats` calls over the rotating input `sets` are captured in one
    CUDA graph, and the median over 5 replays (CUDA events) of the time per call is returned.

    A graph takes host overhead out of the kernel's time, for every provider alike; the
    host cost of a call is measured on its own.
    """
    import torch

    for i in range(2):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    calls = max(repeats, len(sets))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(sets[i % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


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
