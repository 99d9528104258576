"""Which layers of a model lose GPU time to PyTorch's (GPU): every Conv2d and Linear of
benchmarks/models.py's model, PyTorch's and ours, under torch.profiler, each layer's call inside a
range of its own, so that the kernels it launches (ours or cuDNN's / cuBLAS's) add up to the layer's
GPU time. Under a CUDA graph only GPU time counts, so the layers listed here are what a graph's
ratio is made of.

Prints one line a layer (its shape, PyTorch's and our GPU microseconds a forward, the ratio, the
kernels each launched), the layers sorted by the time ours loses, and the totals.

    python benchmarks/studies/model_layer_times.py [--model resnet50] [--forwards 10] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

PREFIX = "layer:"


def annotate(model: nn.Module, shapes: dict) -> None:
    """Runs each Conv2d and Linear of `model` inside a profiler range named after it, and notes the
    shape of its input."""
    for name, module in model.named_modules():
        if not isinstance(module, (nn.Conv2d, nn.Linear)):
            continue
        forward = module.forward

        def ranged(x, *args, _name=name, _forward=forward, **kwargs):
            shapes[_name] = tuple(x.shape)
            with torch.profiler.record_function(PREFIX + _name):
                return _forward(x, *args, **kwargs)
        module.forward = ranged


def kernels_of(event) -> list:
    """The GPU kernels launched inside a CPU event and its children."""
    found, todo = [], [event]
    while todo:
        e = todo.pop()
        found.extend(e.kernels)
        todo.extend(e.cpu_children)
    return found


def layer_times(step, forwards: int) -> dict:
    """{layer: (GPU microseconds a forward, {kernel name: launches a forward})}."""
    from torch.profiler import ProfilerActivity

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            step()
        torch.cuda.synchronize()
    times, names = collections.defaultdict(float), collections.defaultdict(collections.Counter)
    for event in prof.events():
        if not event.name.startswith(PREFIX):
            continue
        layer = event.name[len(PREFIX):]
        for kernel in kernels_of(event):
            times[layer] += kernel.duration / forwards
            names[layer][kernel.name[:48]] += 1
    return {layer: (times[layer], {k: n / forwards for k, n in names[layer].items()}) for layer in times}


def describe(module: nn.Module, shape: tuple) -> str:
    if isinstance(module, nn.Linear):
        return f"linear {shape} -> {module.out_features}"
    return (f"conv {shape[1]}->{module.out_channels} {shape[2]}x{shape[3]} k{module.kernel_size[0]}"
            f" s{module.stride[0]} g{module.groups}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--forwards", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    work = models.workloads(False)[args.model]
    variants = models.make_variants(work, models.GPU, warmup=True)
    results, shapes = {}, {}
    for provider, model in (("pytorch", variants.pytorch), ("tiledispatch", variants.ours)):
        model.eval()
        annotate(model, shapes)
        with torch.no_grad():
            results[provider] = layer_times(work.session(model, model, variants.inputs), args.forwards)
    modules = dict(variants.pytorch.named_modules())
    theirs, ours = results["pytorch"], results["tiledispatch"]
    rows = []
    for layer in theirs:
        if layer not in ours:
            continue
        (t_us, t_kernels), (o_us, o_kernels) = theirs[layer], ours[layer]
        rows.append((o_us - t_us, layer, t_us, o_us, t_kernels, o_kernels))
    total_t, total_o = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"{args.model}: {len(rows)} layers, GPU time a forward: PyTorch {total_t:.1f} us, ours {total_o:.1f} us "
          f"(ratio PyTorch/ours {total_t / max(total_o, 1e-9):.3f}); layers where ours is slower: "
          f"{sum(r[0] > 0 for r in rows)}, their loss {sum(r[0] for r in rows if r[0] > 0):.1f} us; "
          f"where faster, the gain {-sum(r[0] for r in rows if r[0] < 0):.1f} us")
    for loss, layer, t_us, o_us, t_kernels, o_kernels in sorted(rows, reverse=True)[:args.top]:
        print(f"  {layer:28s} {describe(modules[layer], shapes[layer]):42s} PyTorch {t_us:7.1f} us  ours {o_us:7.1f} us"
              f"  ratio {t_us / max(o_us, 1e-9):5.2f}  ours: {', '.join(o_kernels)}  PyTorch: {', '.join(t_kernels)}")
    by_kernel = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for loss, layer, t_us, o_us, t_kernels, o_kernels in rows:
        key = ", ".join(sorted(o_kernels))
        by_kernel[key][0] += t_us
        by_kernel[key][1] += o_us
        by_kernel[key][2] += 1
    print("by our kernels: layers, PyTorch us, ours us, ratio")
    for key, (t_us, o_us, count) in sorted(by_kernel.items(), key=lambda kv: kv[1][0] - kv[1][1]):
        print(f"  {key[:60]:60s} {count:3d}  {t_us:8.1f}  {o_us:8.1f}  {t_us / max(o_us, 1e-9):5.2f}")


if __name__ == "__main__":
    main()
