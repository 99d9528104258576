"""Where one step of a model goes (GPU): PyTorch's model and ours under torch.profiler, side by side.

For each provider and mode (eager inference, a training step, torch.compile's inference), the step's wall time, the GPU's
busy time (the sum of its kernels' times) and the host time of the ops we replace, then the
kernels that take the most GPU time. A step whose wall time is well above its GPU time is bound
by the host; one near it, by its kernels. The model is benchmarks/models.py's (bf16,
channels-last; ours: every Conv2d and Linear through tiledispatch, its picks compiled ahead).

    python benchmarks/studies/model_step_profile.py [--model resnet50] [--modes eager,train,compile] [--steps 10]
        [--cprofile] [--backward-cprofile] [--first-call]

--backward-cprofile profiles our autograd twins' backward calls, which run on autograd's device
thread, where a profile of the step's own thread does not look.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

from tiledispatch.bench.timing import profiled, wall_ms_per_call  # noqa: E402

OUR_OPS = ("tiledispatch", "aten::conv", "aten::cudnn", "aten::mm", "aten::addmm", "aten::linear")


def step_of(mode: str, work, model, inputs):
    if mode == "train":
        model.train()
        return models.train_step(model, work, inputs)
    model.eval()
    return work.session(model, torch.compile(model) if mode == "compile" else model, inputs)


def profile(step, steps: int):
    """(wall ms a step, GPU-busy ms a step, the profiler's key averages) over `steps` steps."""
    from torch.profiler import ProfilerActivity
    wall = wall_ms_per_call(step, steps, warmup=3)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    kernels = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / steps / 1e3
    return wall, busy, averages, kernels


def report(name: str, steps: int, wall: float, busy: float, averages, kernels, top: int) -> None:
    print(f"  {name}: {wall:.3f} ms a step (no profiler), GPU busy {busy:.3f} ms a step")
    host = sorted((e for e in averages if e.key.startswith(OUR_OPS)), key=lambda e: -e.cpu_time_total)
    for e in host[:8]:
        print(f"    host {e.key:48s} {e.count // steps:4d} calls  {e.cpu_time_total / steps / 1e3:7.3f} ms a step "
              f"({e.cpu_time_total / max(e.count, 1):6.1f} us a call)")
    waits = [e for e in averages if "Synchronize" in e.key or "Memcpy" in e.key]
    for e in waits:  # a wait for the device in the step: the host's time and the device's no longer overlap
        print(f"    wait {e.key:48s} {e.count / steps:6.1f} calls a step  {e.cpu_time_total / steps / 1e3:7.3f} ms a step")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"    gpu  {e.key[:70]:70s} {e.count // steps:4d}  {e.self_device_time_total / steps / 1e3:7.3f} ms")


class BackwardProfile:
    """Our twins' backward calls, each under one cProfile enabled on the thread that runs it."""

    def __init__(self) -> None:
        from tiledispatch.ops.attention.library import AttentionFunction
        from tiledispatch.ops.conv.library import ConvFunction
        from tiledispatch.ops.gemm.library import GemmFunction
        self.profile, self.seconds, self.calls = cProfile.Profile(), {}, {}
        for twin in (AttentionFunction, ConvFunction, GemmFunction):
            twin.backward = staticmethod(self.wrapped(twin.__name__, twin.backward))

    def wrapped(self, name, backward):
        def timed(ctx, *grads):
            start = time.perf_counter()
            self.profile.enable()
            try:
                return backward(ctx, *grads)
            finally:
                self.profile.disable()
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed

    def report(self, steps: int, top: int) -> None:
        for name, seconds in self.seconds.items():
            print(f"  {name}.backward: {self.calls[name] / steps:.1f} calls a step, "
                  f"{seconds / self.calls[name] * 1e6:.1f} us a call (wall, under cProfile)")
        if self.seconds:
            pstats.Stats(self.profile).sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--modes", default="eager,train")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--cprofile", action="store_true", help="then a cProfile of each model's steps in each mode")
    parser.add_argument("--sort", default="tottime", help="the cProfile's order: tottime or cumulative")
    parser.add_argument("--cprofile-top", type=int, default=25)
    parser.add_argument("--backward-cprofile", action="store_true",
                        help="then a cProfile of our twins' backward calls over the training steps")
    parser.add_argument("--first-call", action="store_true",
                        help="only a cProfile of our model's first eager call after tiledispatch.warmup")
    args = parser.parse_args()
    modes = args.modes.split(",")
    work = models.workloads(False)[args.model]
    variants = models.make_variants(work, models.GPU, warmup=True, backward="train" in modes)
    if args.first_call:
        with torch.no_grad():
            stats, seconds = profiled(step_of("eager", work, variants.ours, variants.inputs), 1)
        print(f"{args.model}: our first eager call after warmup {seconds * 1e3:.1f} ms under cProfile "
              f"(warmup {variants.first_call_s.get('tiledispatch warmup')} s)")
        stats.sort_stats("cumulative").print_stats(args.cprofile_top)
        return
    for mode in modes:
        print(f"{args.model} {mode}")
        for name, model in (("pytorch", variants.pytorch), ("tiledispatch", variants.ours)):
            with torch.set_grad_enabled(mode == "train"):
                report(name, args.steps, *profile(step_of(mode, work, model, variants.inputs), args.steps), args.top)
        for name, model in (("pytorch", variants.pytorch), ("tiledispatch", variants.ours)) if args.cprofile else ():
            with torch.set_grad_enabled(mode == "train"):
                stats, seconds = profiled(step_of(mode, work, model, variants.inputs), args.steps)
            print(f"{name} {mode} under cProfile: {seconds * 1e3:.2f} ms a step")
            stats.sort_stats(args.sort).print_stats(args.cprofile_top)
    if args.backward_cprofile and "train" in modes:
        backward = BackwardProfile()
        with torch.enable_grad():
            step = step_of("train", work, variants.ours, variants.inputs)
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        print(f"{args.model} train: our twins' backward calls")
        backward.report(args.steps, args.cprofile_top)


if __name__ == "__main__":
    main()
