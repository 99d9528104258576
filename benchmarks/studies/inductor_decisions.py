"""What inductor's trace decides for each conv and gemm of a model (GPU): for every traced call, the
default dispatcher's strategy, its pick and whether the op became PyTorch's aten op; then the picks
the same dispatcher makes for the model's eager calls. The two should agree (ops/inductor.py).

    python benchmarks/studies/inductor_decisions.py [--model resnet50]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

from tiledispatch.core import dispatcher as dispatcher_module  # noqa: E402
from tiledispatch.ops import inductor  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    args = parser.parse_args()
    traced = collections.Counter()
    original = inductor.picks_vendor

    def spy(key, like, problem_of, **options):
        vendor = original(key, like, problem_of, **options)
        d = dispatcher_module.dispatcher_or_default(None, like)
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            tensors = [None if m is None else torch.empty_strided(m[0], m[1], dtype=m[2], device="meta")
                       for m in key[1]]
            problem = problem_of(tensors)
            name = d.select(problem, device=like.device).name if problem is not None else "no problem"
        traced[(d.strategy.value, name, vendor)] += 1
        return vendor
    inductor.picks_vendor = spy

    picked = collections.Counter()
    select = dispatcher_module.Dispatcher.select

    def spy_select(self, problem, *, device=None):
        spec = select(self, problem, device=device)
        picked[(self.strategy.value, spec.name, spec.is_vendor)] += 1
        return spec
    dispatcher_module.Dispatcher.select = spy_select  # warm-up's selections included
    work = models.workloads(False)[args.model]
    variants = models.make_variants(work, models.GPU, warmup=True, backward=False)
    model = variants.ours.eval()
    with torch.no_grad():
        work.session(model, model, variants.inputs)()
        torch.cuda.synchronize()
        print("eager selections, warm-up's included (strategy, pick, vendor): count")
        for k, n in sorted(picked.items()):
            print(f"  {k}: {n}")
        work.session(model, torch.compile(model), variants.inputs)()
        torch.cuda.synchronize()
    print("traced decisions (strategy, pick, became aten): count")
    for k, n in sorted(traced.items()):
        print(f"  {k}: {n}")


if __name__ == "__main__":
    main()
