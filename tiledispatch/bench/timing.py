"""Timing a callable: CUDA-event medians on the GPU, one wall-clock run under the interpreter."""

from __future__ import annotations

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
