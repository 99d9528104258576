"""What tiledispatch's conv op meets under torch.compile (GPU): how many calls take the checked
path rather than a bound replay, and the layouts inductor hands the op.

A conv-BN-ReLU stack (bf16, channels-last) compiled with inductor runs --calls times; the
custom op's eager function counts its calls, its checked calls and the strides of x it got.

    python benchmarks/studies/compile_probe.py [--calls 20]
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
import torch.nn as nn

import tiledispatch
from tiledispatch.ops.conv import function


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(c, c, 3, 3) * 0.05)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(tiledispatch.conv(x, self.w, padding=1)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    counts, layouts = collections.Counter(), collections.Counter()
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
    model = nn.Sequential(*[Block(128) for _ in range(8)]).cuda().to(torch.bfloat16).eval()
    model.to(memory_format=torch.channels_last)
    x = torch.randn(32, 128, 28, 28, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    for label, runner in (("eager", model), ("inductor", torch.compile(model))):
        with torch.no_grad():
            for _ in range(3):
                runner(x)
            counts.clear(), layouts.clear()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.calls):
                runner(x)
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / args.calls * 1e3
        print(f"{label}: {ms:.3f} ms a forward; per forward: " +
              ", ".join(f"{k} {v / args.calls:g}" for k, v in counts.items()))
        for layout, n in layouts.items():
            print(f"   x {layout}: {n / args.calls:g} a forward")


if __name__ == "__main__":
    main()
