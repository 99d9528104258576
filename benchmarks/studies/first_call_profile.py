"""Where a fresh process's first call goes (GPU): a cProfile of the first `tiledispatch.conv` or
`tiledispatch.gemm` call, after the imports and the inputs and after PyTorch's own call of the same
kind (which makes the cuDNN or cuBLAS handle), with the kernel cache warm.

Run it twice with the same TILEDISPATCH_CACHE_DIR: the first run fills the cache (compiles), the
second is the measurement (benchmarks/startup.py gives the same first-call figure without the
profiler, over several processes).

    python benchmarks/studies/first_call_profile.py conv|gemm [--rows 45]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import tiledispatch


def first_call(op: str):
    dev, dt = "cuda", torch.bfloat16
    if op == "conv":
        x = torch.randn(32, 128, 56, 56, device=dev).to(dt).contiguous(memory_format=torch.channels_last)
        w = torch.randn(128, 128, 3, 3, device=dev).to(dt).contiguous(memory_format=torch.channels_last)
        torch.nn.functional.conv2d(x, w, padding=1)
        return lambda: tiledispatch.conv(x, w, padding=1)
    a, w = (torch.randn(2048, 2048, device=dev).to(dt) for _ in range(2))
    torch.mm(a, w.t())
    return lambda: tiledispatch.gemm(a, w.t())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("op", choices=("conv", "gemm"))
    parser.add_argument("--rows", type=int, default=45)
    args = parser.parse_args()
    call = first_call(args.op)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    call()
    torch.cuda.synchronize()
    profiler.disable()
    print(f"{args.op} first call {(time.perf_counter() - start) * 1e3:.1f} ms under cProfile, strategy "
          f"{tiledispatch.default_dispatcher().strategy.value}")
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumtime").print_stats(args.rows)
    stats.sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
