"""Where a model's eager host time goes (GPU): every conv and linear call timed on the host, by the
kernel family the dispatcher picked for it, beside the PyTorch module's own call on the same input.

The model is benchmarks/models.py's (bf16, channels-last, ours: every Conv2d and Linear through
tiledispatch). Each wrapped call's host time is the wall clock of the Python call alone (the GPU
runs behind it), summed per layer over --calls forwards after a warm-up; PyTorch's module call is
timed the same way on the same input, the two in alternating order. Then a cProfile of whole
forwards. `--grad` runs them with grad on, so that autograd records each call.

    python benchmarks/studies/model_host_profile.py [--model resnet50] [--batch 32] [--calls 20] [--grad]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

import tiledispatch.nn as tdnn  # noqa: E402
from tiledispatch.core.dispatcher import dispatcher_or_default  # noqa: E402
from tiledispatch.bench.timing import profiled  # noqa: E402


def pick_of(module: nn.Module, x: torch.Tensor):
    """The kernel the default dispatcher picks for this layer's call on `x`."""
    dispatcher = dispatcher_or_default(None, x)
    if isinstance(module, tdnn.Conv2d):
        from tiledispatch.ops.conv import check_operands
        operands = check_operands("forward", x=x, w=module.weight, bias=module.bias, stride=module.stride,
                                  padding=module.padding, dilation=module.dilation, groups=module.groups)
    else:
        from tiledispatch.ops.gemm import check_operands
        operands = check_operands(x.reshape(-1, x.shape[-1]), module.weight.t(), bias=module.bias)
    return dispatcher.select(operands.problem)


def family_of(spec) -> str:
    return f"{spec.op.value} {spec.definition.family_of(spec.config)}"


def path_of(module: nn.Module) -> str:
    """What the module's eager call runs (tiledispatch.nn's kept call): PyTorch's op, a bound call
    (by its class), or the function's checked path."""
    kept = module.__dict__.get("_tiledispatch_last")
    if kept is None:
        return "nothing kept"
    call, vendor = kept.call, kept.vendor
    if vendor is not None:
        return "pytorch op" + ("" if call is None else ", graphs ours")
    if getattr(call, "__func__", None) is not None:
        return "checked path"
    cells = [c.cell_contents for c in call.__closure__ or ()]
    return "bound " + "/".join(sorted({type(v).__name__ for v in cells if hasattr(v, "__call__")}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--train", action="store_true", help="only a cProfile of our model's training steps")
    parser.add_argument("--grad", action="store_true",
                        help="forwards with grad on, as a model called outside torch.no_grad() runs: autograd records")
    args = parser.parse_args()
    setting = models.GPU
    work = models.cnn(args.model, args.batch, 1000)
    variants = models.make_variants(work, setting, warmup=True)
    ours, x = variants.ours, variants.inputs["x"]
    if args.train:
        return profile_training(work, variants, args.calls)
    host = collections.defaultdict(float)  # layer -> our call's host seconds
    theirs = collections.defaultdict(float)  # layer -> PyTorch's call's host seconds, same input
    kernels: dict = {}  # layer -> the KernelSpec picked
    layers = [(name, m) for name, m in ours.named_modules()
              if isinstance(m, (tdnn.Conv2d, tdnn.Linear))]

    def timed(name, module, forward, pytorch):
        turn = [0]

        def call(inp):
            if name not in kernels:
                kernels[name] = pick_of(module, inp)
            turn[0] += 1  # who goes first alternates: the second call finds the host's caches warm
            for which in ((forward, pytorch) if turn[0] % 2 else (pytorch, forward)):
                start = time.perf_counter()
                result = which(inp)
                (host if which is forward else theirs)[name] += time.perf_counter() - start
                if which is forward:
                    y = result
            return y
        return call

    for name, module in layers:
        pytorch = (lambda inp, m=module: F.conv2d(inp, m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups)) \
            if isinstance(module, tdnn.Conv2d) else (lambda inp, m=module: F.linear(inp, m.weight, m.bias))
        module.forward = timed(name, module, module.forward, pytorch)
    recording = torch.enable_grad() if args.grad else torch.no_grad()
    with recording:
        for _ in range(3):
            ours(x)
        host.clear(), theirs.clear()
        for _ in range(args.calls):
            ours(x)
        torch.cuda.synchronize()
    by_family = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for name, _ in layers:
        entry = by_family[f"{family_of(kernels[name])}: {path_of(dict(layers)[name])}"]
        entry[0] += 1
        entry[1] += host[name] / args.calls * 1e6
        entry[2] += theirs[name] / args.calls * 1e6
    print(f"{args.model} batch {args.batch}, grad {'on' if args.grad else 'off'}: host microseconds per forward, "
          "summed over the layers of each family")
    print(f"{'family: eager path':44s} {'layers':>6s} {'ours us':>9s} {'PyTorch us':>11s} {'ours/layer':>11s} {'PyTorch/layer':>14s}")
    for family, (count, ours_us, torch_us) in sorted(by_family.items(), key=lambda kv: -kv[1][1]):
        print(f"{family:44s} {count:6d} {ours_us:9.1f} {torch_us:11.1f} {ours_us / count:11.1f} {torch_us / count:14.1f}")
    for name, _ in layers:
        print(f"  {name:32s} {kernels[name].name:60s} {host[name] / args.calls * 1e6:7.1f} us  "
              f"PyTorch {theirs[name] / args.calls * 1e6:7.1f} us  {path_of(dict(layers)[name])}")
    for name, module in layers:  # the plain wrapped modules again, for the profile
        del module.forward
    with torch.enable_grad() if args.grad else torch.no_grad():
        stats, _ = profiled(lambda: ours(x), args.calls)
    stats.sort_stats("tottime").print_stats(30)


def profile_training(work, variants, steps: int) -> None:
    """cProfile of our model's training steps (forward, loss, backward), after three unprofiled ones."""
    variants.ours.train()
    step = models.train_step(variants.ours, work, variants.inputs)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    stats, seconds = profiled(step, steps)
    print(f"{work.name} training step, ours: {seconds * 1e3:.2f} ms under cProfile")
    stats.sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
