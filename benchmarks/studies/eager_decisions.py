"""Which path each conv and linear of a model takes in eager calls that autograd records, and why
(no GPU needed: the shapes come from a forward on the meta device, the picks from an arch's rules
or shipped models).

For every layer: the pick for its forward and for each gradient, the forward's pick an eager
inference call runs (weighed against an eager call's host time, core.hostcost), and the path a
recorded call runs: `native` (PyTorch's own op, where the three picks together are not expected to
save the twin's host time, `calibration.recorded_call_host_s`) or `twin` (the op's
autograd.Function, whose forward and backward run our picks).

    python benchmarks/studies/eager_decisions.py [--model resnet50] [--batch 32] [--arch sm_90]
        [--strategy model|rules]
"""

from __future__ import annotations

import argparse
import collections
import importlib

import torch
import torch.nn as nn

from tiledispatch import Dispatcher, Registry, arch as arches
from tiledispatch.core.dispatcher import Strategy
from tiledispatch.core.hostcost import for_eager, native_for_recorded
from tiledispatch.core.op import RuleSet, all_ops


def layer_inputs(name: str, batch: int) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """(layer name, module, its input on the meta device) for every Conv2d and Linear of a torchvision model."""
    model = getattr(importlib.import_module("torchvision.models"), name)(weights=None)
    model = model.to(device="meta", dtype=torch.bfloat16, memory_format=torch.channels_last)
    seen = []
    for layer, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module.register_forward_pre_hook(lambda m, args, layer=layer: seen.append((layer, m, args[0])))
    x = torch.empty(batch, 3, 224, 224, device="meta", dtype=torch.bfloat16)
    with torch.no_grad():
        model.eval()(x.contiguous(memory_format=torch.channels_last))
    return seen


def conv_problems(module: nn.Conv2d, x: torch.Tensor) -> list:
    from tiledispatch.ops.conv import Direction, check_operands
    from tiledispatch.ops.conv.operands import channels_last_empty

    geometry = dict(stride=module.stride, padding=module.padding, dilation=module.dilation, groups=module.groups)
    w = module.weight.contiguous(memory_format=torch.channels_last)
    forward = check_operands(Direction.FORWARD, x=x, w=w, bias=module.bias, **geometry).problem
    dy = channels_last_empty((forward.n, forward.k, *forward.output_size), x.dtype, "meta")
    data = check_operands(Direction.BWD_DATA, dy=dy, w=w, input_size=tuple(x.shape), **geometry).problem
    weight = check_operands(Direction.BWD_WEIGHT, x=x, dy=dy, weight_size=tuple(w.shape), **geometry).problem
    return [forward, data, weight]


def gemm_problems(module: nn.Linear, x: torch.Tensor) -> list:
    from tiledispatch.ops.gemm import check_operands

    a = x.reshape(-1, x.shape[-1])
    b = module.weight.t()
    dc = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="meta")
    return [check_operands(a, b, bias=module.bias).problem, check_operands(dc, b.t()).problem,
            check_operands(a.t(), dc).problem]


def family(spec) -> str:
    return spec.definition.family_of(spec.config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--strategy", default="model", choices=[s.value for s in Strategy if s is not Strategy.AUTOTUNE])
    args = parser.parse_args()
    target = arches.load(args.arch)
    registry = Registry.from_rule_sets([d.kind for d in all_ops()], RuleSet.DEFAULT, target)
    dispatcher = Dispatcher(registry, target, strategy=args.strategy)
    dispatcher.load_for = lambda problem, spec: None  # decisions only: nothing is built for a capture here
    calibration = target.calibration
    paths = collections.Counter()
    print(f"{args.model} batch {args.batch} on {args.arch}, {args.strategy}: an eager call's host time weighed "
          f"{calibration.eager_call_host_s * 1e6:.0f} us, a recorded call's {calibration.recorded_call_host_s * 1e6:.0f} "
          "us; picks forward / backward-data (dA) / backward-weight (dB)")
    for layer, module, x in layer_inputs(args.model, args.batch):
        problems = conv_problems(module, x) if isinstance(module, nn.Conv2d) else gemm_problems(module, x)
        picks = [dispatcher.select(p) for p in problems]
        inference = for_eager(dispatcher, problems[0], picks[0])
        recorded = "twin" if native_for_recorded(dispatcher, problems, None) is None else "native"
        kind = "conv" if isinstance(module, nn.Conv2d) else "linear"
        paths[(kind, "inference " + family(inference))] += 1
        paths[(kind, "recorded " + recorded)] += 1
        print(f"  {layer:28s} {kind:6s} {' / '.join(family(s) for s in picks):34s} "
              f"inference: {family(inference):10s} recorded: {recorded}")
    print("paths:", ", ".join(f"{k[0]} {k[1]}: {n}" for k, n in sorted(paths.items())))


if __name__ == "__main__":
    main()
