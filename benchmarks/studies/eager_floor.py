"""How low an eager model's host time can go (GPU): one torchvision model run eager (no grad),
its convs called in several ways, against PyTorch's own modules in the same run.

    pytorch   nn.Conv2d as it is
    ours      tiledispatch.conv (benchmarks/models.py's swap)
    module    tiledispatch.nn's modules (tiledispatch.nn.patch): a module keeps its last signature's bound call
    floor     torch.conv2d straight from forward: no signature, no choice (the least Python can add)
    cudnn     torch.cudnn_convolution straight from forward where there is no bias (PyTorch's conv2d
              without its backend choice): what a vendor call costs below PyTorch's own entry

Then the host time of one repeated call of a resnet 3x3 conv each way (the wall clock of the
Python call, the GPU behind it). Times are CUDA-event medians of back-to-back forwards, the
variants sampled in turns (tiledispatch.bench.timing.interleaved_medians).

    python benchmarks/studies/eager_floor.py [--models resnet50,convnext_tiny] [--batch 32]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn as nn

import tiledispatch
import tiledispatch.nn as tdnn
from tiledispatch.bench.timing import event_sampler, interleaved_medians


class Floor(nn.Conv2d):
    def forward(self, x):
        return torch.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Cudnn(nn.Conv2d):
    def forward(self, x):
        if self.bias is not None:
            return torch.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return torch.cudnn_convolution(x, self.weight, self.padding, self.stride, self.dilation, self.groups,
                                       False, False, False)


class Ours(nn.Conv2d):
    def forward(self, x):
        return tiledispatch.conv(x, self.weight, stride=self.stride, padding=self.padding, dilation=self.dilation,
                                 groups=self.groups, bias=self.bias)


def swapped(model: nn.Module, cls) -> nn.Module:
    model = copy.deepcopy(model)
    if cls is None:
        tdnn.patch(model)
        return model
    for module in model.modules():
        if type(module) is nn.Conv2d:
            module.__class__ = cls
    return model


def host_us(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet50,convnext_tiny,mobilenet_v3_large,regnet_y_1_6gf,resnext50_32x4d")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    import torchvision
    torch.backends.cudnn.benchmark = False
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    with torch.no_grad():
        x = torch.randn(32, 256, 14, 14, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        layers = {name: cls(256, 256, 3, padding=1, bias=False).cuda().bfloat16().to(memory_format=torch.channels_last)
                  for name, cls in (("pytorch", nn.Conv2d), ("floor", Floor), ("cudnn", Cudnn), ("ours", Ours))}
        layers["module"] = tdnn.Conv2d(256, 256, 3, padding=1, bias=False).cuda().bfloat16().to(
            memory_format=torch.channels_last)
        for name, layer in layers.items():
            layer(x)
            print(f"one 3x3 conv (32x256x14x14), host us a call: {name:8s} {host_us(lambda: layer(x)):7.2f}")
        a = torch.randn(4, 1, 2048, device="cuda", dtype=torch.bfloat16)
        linears = {"pytorch": nn.Linear(2048, 2048), "module": tdnn.Linear(2048, 2048)}
        for name, layer in linears.items():
            layer = layer.cuda().bfloat16()
            layer(a)
            print(f"one decode linear (4x1x2048 by 2048), host us a call: {name:8s} {host_us(lambda: layer(a)):7.2f}")
        ours = linears["pytorch"].cuda().bfloat16()
        print("one decode linear, host us a call: ours     "
              f"{host_us(lambda: tiledispatch.gemm(a.reshape(-1, 2048), ours.weight.t(), bias=ours.bias)):7.2f}")
        for name in args.models.split(","):
            torch.manual_seed(0)
            base = getattr(torchvision.models, name)(weights=None).cuda().to(torch.bfloat16).eval()
            base = base.to(memory_format=torch.channels_last)
            image = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16).to(
                memory_format=torch.channels_last)
            variants = {"pytorch": base, "ours": swapped(base, Ours), "module": swapped(base, None),
                        "floor": swapped(base, Floor), "cudnn": swapped(base, Cudnn)}
            reference = base(image).float()
            samplers = {}
            for key, model in variants.items():
                out = model(image).float()
                error = float((out - reference).norm() / reference.norm())
                print(f"{name} {key}: error against pytorch's {error:.2e}")
                samplers[key] = event_sampler(lambda m=model: m(image), 5)
            medians = interleaved_medians(samplers, args.rounds)
            line = "  ".join(f"{k} {ms:.3f} ms ({medians['pytorch'] / ms:.3f}x)" for k, ms in medians.items())
            print(f"{name} batch {args.batch} eager: {line}", flush=True)


if __name__ == "__main__":
    main()
