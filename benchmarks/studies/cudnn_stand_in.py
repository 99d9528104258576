"""How cuDNN's backward convs run with the operand they do not read given two ways (bf16, H100 or H200).

`torch.ops.aten.convolution_backward` takes x for backward-data (and w for backward-weight) by
its shape only. torch.nn.grad passes one element expanded to that shape, which has no memory
layout; autograd passes the real, channels-last tensor. Times (us, CUDA-graph replays over 4
input sets, median of 5) of dgrad and wgrad alone with each stand-in, and of both at once.

    python benchmarks/studies/cudnn_stand_in.py [--cases resnet50_3x3,unet_3x3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite runners
import conv as bench  # noqa: E402  (benchmarks/conv.py: the suite's problems)

from tiledispatch.bench.timing import graph_sampler, interleaved_medians  # noqa: E402
from tiledispatch.ops.conv.operands import channels_last_empty  # noqa: E402


def timings(p) -> dict[str, float]:
    def tensor(*shape):
        return channels_last_empty(shape, torch.bfloat16, torch.device("cuda")).normal_()

    sets = [{"dy": tensor(p.n, p.k, *p.output_size), "w": tensor(p.k, p.c_per_group, *p.filter_size),
             "x": tensor(p.n, p.c, *p.input_size)} for _ in range(4)]
    args = (list(p.stride), list(p.padding), list(p.dilation), False, [0] * p.spatial_dims, p.groups)

    def backward(s, x, w, mask):
        return torch.ops.aten.convolution_backward(s["dy"], x, w, None, *args, mask)

    def expanded(s, shape):
        return s["dy"].new_empty(1).expand(*shape)

    x_shape, w_shape = (p.n, p.c, *p.input_size), (p.k, p.c_per_group, *p.filter_size)
    fns = {"dgrad expanded x": lambda s: backward(s, expanded(s, x_shape), s["w"], [True, False, False]),
           "dgrad channels-last x": lambda s: backward(s, s["x"], s["w"], [True, False, False]),
           "wgrad expanded w": lambda s: backward(s, s["x"], expanded(s, w_shape), [False, True, False]),
           "wgrad channels-last w": lambda s: backward(s, s["x"], s["w"], [False, True, False]),
           "both": lambda s: backward(s, s["x"], s["w"], [True, True, False])}
    return interleaved_medians({name: graph_sampler(fn, sets, 20) for name, fn in fns.items()}, 5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="resnet50_3x3,resnet50_1x1,resnext50_32x4d_g32,regnet_g8,"
                        "depthwise_mbv2_3x3,convnext_dw7x7,unet_3x3,dilated_3x3_d2,conv1d_g16_k3,conv3d_video_3x3x3")
    args = parser.parse_args()
    cases = {c["name"]: c for c in json.loads(bench.SUITE.read_text())["cases"]}
    names = ("dgrad expanded x", "dgrad channels-last x", "wgrad expanded w", "wgrad channels-last w", "both")
    print(f"{'case':<22}" + "".join(f"{n:>23}" for n in names), flush=True)
    for name in args.cases.split(","):
        times = timings(bench.problem_of(cases[name], bench.Direction.BWD_DATA, "bf16"))
        print(f"{name:<22}" + "".join(f"{times[n] * 1e3:23.1f}" for n in names), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
