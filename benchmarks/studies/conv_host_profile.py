"""Where the host time of a conv call seen before goes (GPU): cProfile of the fast path.

    python benchmarks/studies/conv_host_profile.py [--shape N,C,H,W,K,R] [--groups G] [--calls 3000]

A grouped or depthwise shape (--groups, K = C for depthwise) takes a Triton family where a
dense one takes cuDNN: the two paths' host costs differ.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch.bench.timing import host_us_per_call, profiled
from tiledispatch.core.dispatcher import default_dispatcher


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="32,256,14,14,256,3", help="N,C,H,W,K,R (a dense RxR conv, padding R//2)")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--groups", type=int, default=1)
    args = parser.parse_args()
    n, c, h, w_, k, r = map(int, args.shape.split(","))
    g = args.groups
    x = torch.randn(n, c, h, w_, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.randn(k, c // g, r, r, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    call = lambda: tiledispatch.conv(x, w, padding=r // 2, groups=g)  # noqa: E731
    call()
    from tiledispatch.ops.conv import check_operands

    problem = check_operands("forward", x=x, w=w, padding=r // 2, groups=g).problem
    print("kernel:", default_dispatcher(backend=None).select(problem).name)
    for name, fn in {"F.conv2d": lambda: F.conv2d(x, w, padding=r // 2, groups=g), "tiledispatch.conv": call}.items():
        print(f"{name:20s} {host_us_per_call(fn, calls=args.calls, warmup=200):7.2f} us")
    stats, _ = profiled(call, args.calls)
    stats.sort_stats("tottime").print_stats(24)


if __name__ == "__main__":
    main()
