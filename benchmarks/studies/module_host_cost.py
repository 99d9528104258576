"""The host time `tiledispatch.nn`'s module adds to a call whose pick is the vendor's (CPU): the
module's kept call with PyTorch's op replaced by a stub that returns its input, against a module
whose forward reads `self.weight` and `self.bias` (as nn.Conv2d's does) and calls the same stub.
What is left is the module's own check of its kept call, the part of an eager model's host time
tiledispatch adds over PyTorch's module.

    python benchmarks/studies/module_host_cost.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn

import tiledispatch.nn as tdnn


def stub(x, w, b):
    return x


class Floor(nn.Conv2d):
    """PyTorch's module with the stub for its op."""

    def forward(self, x):
        return stub(x, self.weight, self.bias)


def best_us(module, x, calls: int) -> float:
    with torch.no_grad():
        module(x)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                module(x)
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    tdnn._ConvNd._bind = lambda self, x, w, b, grad: (None, stub)  # every signature's pick: the vendor's (the stub)
    x = torch.randn(2, 8, 5, 5)
    floor, ours = Floor(8, 8, 3, bias=False), tdnn.Conv2d(8, 8, 3, bias=False)
    for _ in range(2):  # in turns: this host's speed drifts
        for name, module in (("nn.Conv2d's forward, the stub for its op", floor), ("tiledispatch.nn.Conv2d", ours)):
            print(f"{name:42s} {best_us(module, x, args.calls):6.2f} us a call")


if __name__ == "__main__":
    main()
