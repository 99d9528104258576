"""A training step of one conv layer: `tiledispatch.conv` under autograd against PyTorch's conv.

For each case of the suite named, bf16, channels-last: x and w require grad, and a step is the
forward and `backward(dy)` (dx and dw; bias-free, no activation: the suite's layers), the steps
rotating over enough input sets that they do not stay in L2 (as benchmarks/conv.py). Two times
a step: `gpu us`, the median of CUDA-event timings of CUDA-graph replays of STEPS steps (no host
time), and `eager us`, wall time a step over STEPS eager steps (what eager training code sees,
host included). The ratio is PyTorch's time over tiledispatch's: above 1, tiledispatch is faster.

    python benchmarks/conv_train.py [--cases resnext50_32x4d_g32,convnext_dw7x7] [--steps 20]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import conv as bench  # noqa: E402  (benchmarks/conv.py: the suite and its problems)

import tiledispatch  # noqa: E402
from tiledispatch.bench.timing import wall_ms_per_call  # noqa: E402

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CASES = ("depthwise_mbv2_3x3,depthwise_5x5,convnext_dw7x7,conv1d_depthwise_k4_mamba,resnext50_32x4d_g32,"
         "regnet_g8,conv1d_g16_k3,resnet50_3x3")


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def step_fn(conv, sets: list):
    """A step on the next input set in turn."""
    turn = [0]

    def step():
        x, w, dy = sets[turn[0] % len(sets)]
        turn[0] += 1
        conv(x, w).backward(dy)
    return step


def gpu_us(step, steps: int, rounds: int = 7) -> float:
    """Median over `rounds` of a CUDA graph of `steps` steps, per step (x.grad and w.grad accumulate).
    The warm-up runs on a side stream, as PyTorch asks before capturing a backward."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(steps):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            step()
    graph.replay()
    samples = []
    for _ in range(rounds):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1e3 / steps)
    return statistics.median(samples)


def eager_us(step, steps: int) -> float:
    return wall_ms_per_call(step, steps, warmup=steps) * 1e3


def input_sets(p) -> list[tuple]:
    """(x, w, dy) sets, x and w requiring grad, enough of them that a turn over them passes L2."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def tensor(*shape, grad=True):
        return channels_last(torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)).requires_grad_(grad)

    count = max(2, min(8, math.ceil(3 * bench.L2_BYTES / p.bytes())))
    return [(tensor(p.n, p.c, *p.input_size), tensor(p.k, p.c_per_group, *p.filter_size),
             tensor(p.n, p.k, *p.output_size, grad=False)) for _ in range(count)]


def time_case(p, steps: int) -> dict[str, tuple[float, float]]:
    """(gpu us, eager us) a step, for tiledispatch and for PyTorch."""
    sets = input_sets(p)
    steps = math.ceil(steps / len(sets)) * len(sets)  # whole turns over the sets
    geometry = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation, "groups": p.groups}
    convs = {"ours": functools.partial(tiledispatch.conv, **geometry),
             "torch": functools.partial(CONV[p.spatial_dims], **geometry)}
    return {label: (gpu_us(step_fn(conv, sets), steps), eager_us(step_fn(conv, sets), steps))
            for label, conv in convs.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=CASES)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    cases = {c["name"]: c for c in json.loads(bench.SUITE.read_text())["cases"]}
    print(f"{'case':<28} {'gpu us':>8} {'torch':>8} {'ratio':>6}   {'eager us':>8} {'torch':>8} {'ratio':>6}",
          flush=True)
    for name in args.cases.split(","):
        times = time_case(bench.problem_of(cases[name], bench.Direction.FORWARD, "bf16"), args.steps)
        (og, oe), (tg, te) = times["ours"], times["torch"]
        print(f"{name:<28} {og:8.1f} {tg:8.1f} {tg / og:6.2f}   {oe:8.1f} {te:8.1f} {te / oe:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
