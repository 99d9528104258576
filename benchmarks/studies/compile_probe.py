"""Where tiledispatch's conv spends host time under torch.compile (GPU): a conv-BN-ReLU stack
(bf16, channels-last, inference) timed eager and under inductor, ours and PyTorch's, then a
cProfile of our compiled forward and a torch.profiler table of its CPU time, so that the cost
of a compiled call has a name.

The custom op's eager function also counts its calls, its checked calls and the strides of x
it got: every call should be a bound replay in inductor's layout.

    python benchmarks/studies/compile_probe.py [--calls 50] [--layers 8]
"""

from __future__ import annotations

import argparse
import collections

import torch
import torch.nn as nn
import torch.nn.functional as F

import tiledispatch
from tiledispatch.bench.timing import profiled, wall_ms_per_call
from tiledispatch.ops.conv import function


class Block(nn.Module):
    def __init__(self, c: int, ours: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(c, c, 3, 3) * 0.05)
        self.bn = nn.BatchNorm2d(c)
        self.conv = tiledispatch.conv if ours else F.conv2d

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x, self.w, padding=1)))


def spy(counts: collections.Counter, layouts: collections.Counter) -> None:
    """Counts the custom op's eager calls, its checked calls and the layouts of x."""
    checked, eager = function._checked, function._eager

    def spy_checked(*a, **k):
        counts["checked"] += 1
        return checked(*a, **k)

    def spy_eager(direction, dispatcher, kernel, arguments):
        counts["eager calls"] += 1
        x = arguments.get("x")
        layouts[(tuple(x.shape), x.stride(), type(arguments.get("stride")).__name__)] += 1
        return eager(direction, dispatcher, kernel, arguments)

    function._checked, function._eager = spy_checked, spy_eager


def time_forward(runner, x, calls: int) -> float:
    """Milliseconds a forward, wall clock over `calls` back-to-back forwards."""
    return wall_ms_per_call(lambda: runner(x), calls, warmup=3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    counts, layouts = collections.Counter(), collections.Counter()
    spy(counts, layouts)
    x = torch.randn(32, 128, 28, 28, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    compiled = {}
    with torch.no_grad():
        for ours in (False, True):
            model = nn.Sequential(*[Block(128, ours) for _ in range(args.layers)]).cuda().to(torch.bfloat16).eval()
            model.to(memory_format=torch.channels_last)
            for label, runner in (("eager", model), ("inductor", torch.compile(model))):
                counts.clear(), layouts.clear()
                ms = time_forward(runner, x, args.calls)
                print(f"{'ours' if ours else 'PyTorch'} {label}: {ms:.3f} ms a forward; per forward: " +
                      ", ".join(f"{k} {v / (args.calls + 3):g}" for k, v in counts.items()))
                for layout, n in layouts.items():
                    print(f"   x {layout}: {n / (args.calls + 3):g} a forward")
                compiled[(ours, label)] = runner
        stats, seconds = profiled(lambda: compiled[(True, "inductor")](x), args.calls)
        print(f"\ncProfile of ours under inductor ({seconds * 1e3:.3f} ms a forward under the profiler):")
        stats.sort_stats("tottime").print_stats(25)
        for ours in (False, True):
            runner = compiled[(ours, "inductor")]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(args.calls):
                    runner(x)
                torch.cuda.synchronize()
            print(f"\ntorch.profiler, {'ours' if ours else 'PyTorch'} under inductor, CPU time of {args.calls} forwards:")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
