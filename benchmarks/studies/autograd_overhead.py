"""Host time of a call that autograd records (GPU): each op's public function (its eager twin), the
custom op called directly, and the PyTorch op it replaces, on small shapes whose GPU work is tiny,
with grad and under torch.no_grad().

    python benchmarks/studies/autograd_overhead.py [--calls 3000] [--profile]

--profile then prints a cProfile of each case's own call with grad.

The gemm is 16x16 bf16; the convs take channels-last bf16 tensors of a resnet50 stage (a 3x3 on
cuDNN's path, a 1x1 on the gemm family's); the weights are Parameters, as in a model.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch.bench.timing import host_us_per_call, profiled
from tiledispatch.library import DEFAULT_DISPATCHER

OPS = torch.ops.tiledispatch


def cases() -> dict:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    a = torch.randn(16, 16, **bf16)
    weight = torch.nn.Parameter(torch.randn(16, 16, **bf16))
    bias = torch.nn.Parameter(torch.randn(16, **bf16))
    x = torch.randn(8, 64, 14, 14, **bf16).to(memory_format=torch.channels_last)
    w3 = torch.nn.Parameter(torch.randn(64, 64, 3, 3, **bf16).to(memory_format=torch.channels_last))
    w1 = torch.nn.Parameter(torch.randn(256, 64, 1, 1, **bf16).to(memory_format=torch.channels_last))
    return {
        "linear 16x16 + bias": {
            "ours": lambda: tiledispatch.gemm(a, weight.t(), bias=bias),
            "custom op": lambda: OPS.gemm.default(a, weight.t(), bias, None, None, None, False, None, None, None,
                                                  DEFAULT_DISPATCHER),
            "PyTorch": lambda: F.linear(a, weight, bias)},
        "conv 3x3 (cuDNN's path)": {
            "ours": lambda: tiledispatch.conv(x, w3, padding=1),
            "custom op": lambda: OPS.conv.default(x, w3, None, None, [1, 1], [1, 1], [1, 1], 1, None, False, None,
                                                  DEFAULT_DISPATCHER),
            "PyTorch": lambda: F.conv2d(x, w3, padding=1)},
        "conv 1x1 (the gemm family)": {
            "ours": lambda: tiledispatch.conv(x, w1),
            "custom op": lambda: OPS.conv.default(x, w1, None, None, [1, 1], [0, 0], [1, 1], 1, None, False, None,
                                                  DEFAULT_DISPATCHER),
            "PyTorch": lambda: F.conv2d(x, w1)},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    print(f"{'case':28s} {'mode':8s} {'ours us':>8s} {'custom op us':>13s} {'PyTorch us':>11s}")
    for name, providers in cases().items():
        for mode in ("grad", "no_grad"):
            with torch.set_grad_enabled(mode == "grad"):
                us = {p: host_us_per_call(fn, calls=args.calls, warmup=200) for p, fn in providers.items()}
            print(f"{name:28s} {mode:8s} {us['ours']:8.2f} {us['custom op']:13.2f} {us['PyTorch']:11.2f}")
    if args.profile:
        for name, providers in cases().items():
            stats, _ = profiled(providers["ours"], args.calls)
            print(f"--- {name}, with grad")
            stats.sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
