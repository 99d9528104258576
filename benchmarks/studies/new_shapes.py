"""What a shape seen for the first time costs the host, in the loops that keep posing new ones (GPU).

A decode loop grows its KV cache by a token a step, so each step's attention has a new key
length; a server's prefill linears see a new token count with each batch. Each of these calls
is a first sight for the dispatcher. This times such loops call by call, ours against PyTorch's
op, in one process:

    decode    attention of one query token over a cache of L, L+1, ... keys (a view of one
              buffer, as transformers' cache gives), GQA as Llama's, bf16
    linear    F.linear / tiledispatch.gemm of T, T+1, ... tokens by a 2048x2048 weight, bf16

Each call's wall time is taken with the GPU synchronised after it, so it is the host's time plus
the (small) kernel; then the same loop again over the same shapes (every shape seen): what the
first sights cost is the difference. Prints the median and P90 of each.

    python benchmarks/studies/new_shapes.py [--steps 200] [--start 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import tiledispatch


def timed(fn, count: int) -> list[float]:
    """Each call's wall time in us, the GPU synchronised after each."""
    out = []
    for i in range(count):
        start = time.perf_counter()
        fn(i)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - start) * 1e6)
    return out


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    return f"median {statistics.median(ordered):8.1f} us  P90 {ordered[int(0.9 * len(ordered))]:8.1f} us"


def decode_calls(start: int, steps: int):
    b, hq, hkv, d = 4, 16, 4, 128
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, start + steps, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ours = lambda i: tiledispatch.attention(q, k[:, :, :start + i], v[:, :, :start + i])  # noqa: E731
    torch_op = lambda i: F.scaled_dot_product_attention(q, k[:, :, :start + i], v[:, :, :start + i],  # noqa: E731
                                                        enable_gqa=True)
    return ours, torch_op


def linear_calls(start: int, steps: int):
    x = torch.randn(start + steps, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    ours = lambda i: tiledispatch.gemm(x[:start + i], w.t())  # noqa: E731
    torch_op = lambda i: F.linear(x[:start + i], w)  # noqa: E731
    return ours, torch_op


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--start", type=int, default=1000)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  tiledispatch {tiledispatch.__version__}")
    with torch.no_grad():
        for name, make in (("decode", decode_calls), ("linear", linear_calls)):
            ours, torch_op = make(args.start, args.steps)
            ours(args.steps - 1), torch_op(args.steps - 1)  # imports, kernel loads and cuDNN plans outside
            torch.cuda.synchronize()
            rows = {"pytorch, new shapes": timed(torch_op, args.steps),
                    "ours, new shapes": timed(ours, args.steps),
                    "pytorch, seen": timed(torch_op, args.steps),
                    "ours, seen": timed(ours, args.steps)}
            for label, times in rows.items():
                print(f"{name:7s} {label:20s} {summary(times)}", flush=True)
            first = sum(rows["ours, new shapes"]) - sum(rows["ours, seen"])
            print(f"{name:7s} ours: {first / args.steps:.1f} us more a call on its first sight "
                  f"({args.steps} shapes from {args.start})", flush=True)


if __name__ == "__main__":
    main()
