"""Host time of PyTorch's entry points into cuDNN's convolution (GPU), and whether they agree.

F.conv2d goes through aten::conv2d -> convolution -> _convolution, which picks a backend on
every call; torch.cudnn_convolution is the cuDNN call itself. A wrapper around the vendor
cannot cost less host time than the entry point it calls, so this is the floor of conv's
vendor path.

    python benchmarks/studies/vendor_entry_points.py [--calls 3000]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from tiledispatch.bench.timing import host_us_per_call

SHAPES = {"dense 3x3 32x256x14x14": (32, 256, 14, 256, 3, 1), "depthwise 3x3 32x256x14x14": (32, 256, 14, 256, 3, 256),
          "pointwise 32x256x56x56->64": (32, 256, 56, 64, 1, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    for label, (n, c, hw, k, r, g) in SHAPES.items():
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w = torch.randn(k, c // g, r, r, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        p = r // 2
        calls = {
            "F.conv2d": lambda: F.conv2d(x, w, None, 1, p, 1, g),
            "torch.conv2d": lambda: torch.conv2d(x, w, None, (1, 1), (p, p), (1, 1), g),
            "torch.convolution": lambda: torch.convolution(x, w, None, (1, 1), (p, p), (1, 1), False, (0, 0), g),
            "torch.cudnn_convolution": lambda: torch.cudnn_convolution(x, w, (p, p), (1, 1), (1, 1), g, False, False,
                                                                       True),
            "aten.cudnn_convolution.default": lambda: torch.ops.aten.cudnn_convolution.default(
                x, w, [p, p], [1, 1], [1, 1], g, False, False, True),
        }
        reference = calls["F.conv2d"]()
        print(label)
        for name, fn in calls.items():
            same = torch.equal(fn(), reference)
            print(f"  {name:32s} {host_us_per_call(fn, calls=args.calls):7.2f} us   equal to F.conv2d: {same}")


if __name__ == "__main__":
    main()
