"""Which layers of a model lose GPU time to PyTorch's (GPU): every Conv2d and Linear of
benchmarks/models.py's model, PyTorch's module and ours, timed alone on the input it receives in the
network, in turns (bench.timing.interleaved_medians), each sample one replay of a CUDA graph of
`--calls` calls. Under a CUDA graph only GPU time counts, so these layer times are what a graph's
ratio is made of (bar the cache effects of the layers around each one). The profiler cannot
attribute our kernels to a layer: Triton's launcher calls the driver outside any torch op.

Prints one line a layer (its shape, PyTorch's and our microseconds, the ratio, our pick), the
layers sorted by the time ours loses, then the totals by our kernel family.

    python benchmarks/studies/model_layer_times.py [--model resnet50] [--calls 20] [--rounds 15] [--top 25]
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

from tiledispatch.bench.timing import graph_sampler, interleaved_medians  # noqa: E402
from tiledispatch.core import dispatcher as dispatcher_module  # noqa: E402


def layer_inputs(model: nn.Module, step) -> dict:
    """{layer name: the input its forward received} over one forward of `model`."""
    seen, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            hooks.append(module.register_forward_pre_hook(
                lambda m, args, _name=name: seen.setdefault(_name, args[0].detach().clone())))
    step()
    for hook in hooks:
        hook.remove()
    return seen


def pick_of(module: nn.Module, x: torch.Tensor) -> str:
    """The kernel the default dispatcher selects for our conv's forward on `x` (a Linear: its op)."""
    if not isinstance(module, nn.Conv2d):
        return "gemm op"
    from tiledispatch.ops.conv.operands import check_operands
    from tiledispatch.ops.conv.problem import Direction

    problem = check_operands(Direction.FORWARD, x=x, w=module.weight, bias=module.bias, stride=module.stride,
                             padding=module.padding, dilation=module.dilation, groups=module.groups).problem
    return dispatcher_module.dispatcher_or_default(None, x).select(problem, device=x.device).name


def describe(module: nn.Module, shape: tuple) -> str:
    if isinstance(module, nn.Linear):
        return f"linear {shape} -> {module.out_features}"
    return (f"conv {shape[1]}->{module.out_channels} {shape[2]}x{shape[3]} k{module.kernel_size[0]}"
            f" s{module.stride[0]} g{module.groups}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    work = models.workloads(False)[args.model]
    variants = models.make_variants(work, models.GPU, warmup=True)
    theirs, ours = dict(variants.pytorch.eval().named_modules()), dict(variants.ours.eval().named_modules())
    rows = []
    with torch.no_grad():
        inputs = layer_inputs(variants.pytorch, work.session(variants.pytorch, variants.pytorch, variants.inputs))
        for layer, x in inputs.items():
            samplers = {"pytorch": graph_sampler(theirs[layer], [x], args.calls),
                        "ours": graph_sampler(ours[layer], [x], args.calls)}
            times = interleaved_medians(samplers, args.rounds)
            t_us, o_us = times["pytorch"] * 1e3, times["ours"] * 1e3
            rows.append((o_us - t_us, layer, t_us, o_us, describe(theirs[layer], tuple(x.shape)),
                         pick_of(ours[layer], x)))
    total_t, total_o = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"{args.model}: {len(rows)} layers, GPU time a forward: PyTorch {total_t:.1f} us, ours {total_o:.1f} us "
          f"(ratio PyTorch/ours {total_t / max(total_o, 1e-9):.3f}); layers where ours is slower: "
          f"{sum(r[0] > 0 for r in rows)}, their loss {sum(r[0] for r in rows if r[0] > 0):.1f} us; "
          f"where faster, the gain {-sum(r[0] for r in rows if r[0] < 0):.1f} us")
    for loss, layer, t_us, o_us, shape, pick in sorted(rows, reverse=True)[:args.top]:
        print(f"  {layer:28s} {shape:40s} PyTorch {t_us:7.1f} us  ours {o_us:7.1f} us"
              f"  ratio {t_us / max(o_us, 1e-9):5.2f}  ours: {pick}")
    by_pick = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for loss, layer, t_us, o_us, shape, pick in rows:
        pick = pick.split("_")[3] if pick.startswith("conv_") else pick  # the family
        by_pick[pick][0] += t_us
        by_pick[pick][1] += o_us
        by_pick[pick][2] += 1
    print("by our family: layers, PyTorch us, ours us, ratio")
    for pick, (t_us, o_us, count) in sorted(by_pick.items(), key=lambda kv: kv[1][0] - kv[1][1]):
        print(f"  {pick[:60]:60s} {count:3d}  {t_us:8.1f}  {o_us:8.1f}  {t_us / max(o_us, 1e-9):5.2f}")


if __name__ == "__main__":
    main()
