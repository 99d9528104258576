"""Every kernel of one conv family in a rule set (`full` unless told), timed on suite cases against cuDNN.

The suite benchmark (conv.py) times only the rules' best few per family, so it cannot say
how far the ranking's pick is from the family's best. This sweep times them all (bf16, one
direction), checks each against the fp32 reference, and for the fastest four splits the time
by kernel with torch.profiler (a split backward-weight's main kernel and its reduction).
The CSV keeps the model's rank and modelled time beside the measured one, which is what a
refit of the ranking's constants reads.

    python benchmarks/conv_sweep.py --out DIR --direction bwd_weight --cases resnet50_3x3,unet_3x3 \
        [--family igemm-tma] [--rule-set full] [--suite FILE] [--match REGEX]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import conv as suite_bench  # the suite benchmark's operands, reference and timing
import torch

import tiledispatch  # noqa: F401  (first: it picks the backend)
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.kernel import build_all
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.conv import Direction

PROFILED = 4  # fastest candidates whose kernels are split by the profiler
PROFILE_CALLS = 20


def kernel_split(dispatcher: Dispatcher, ops, spec) -> str:
    """GPU time per call of each kernel a candidate launches, as 'name=us;...'."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILE_CALLS):
            dispatcher.run(ops, kernel=spec)
        torch.cuda.synchronize()
    return ";".join(f"{e.key[:40]}={e.device_time_total / e.count:.1f}"
                    for e in prof.key_averages() if e.count >= PROFILE_CALLS and e.device_time_total > 0)


def sweep_case(dispatcher: Dispatcher, case: dict, direction: Direction, family: str, match: str) -> list[dict]:
    p = suite_bench.problem_of(case, direction, "bf16")
    p = replace(p, specialization=p.dense_specialization())
    ranked = [c for c in dispatcher.explain(p).ranked if c.spec.family == family and re.search(match, c.spec.name)]
    start = time.perf_counter()
    build_all(sorted((c.spec for c in ranked), key=lambda s: s.name), dispatcher.cache, 16,
              specializations=(p.specialization,))
    print(f"{case['name']}: {len(ranked)} kernels built in {time.perf_counter() - start:.0f} s", flush=True)
    sets = suite_bench.make_sets(p)
    ref = suite_bench.reference(p, sets[0])
    vendor_us = suite_bench.median_ms(suite_bench.cudnn_fn(p), sets) * 1e3
    timed = []
    for rank, candidate in enumerate(ranked):
        error = suite_bench.rel_error(dispatcher.run(sets[0]["ops"], kernel=candidate.spec), ref)
        us = suite_bench.median_ms(suite_bench.call(dispatcher, candidate.spec), sets) * 1e3
        timed.append((us, rank, candidate, error))
    timed.sort(key=lambda t: t[0])
    rows = []
    for place, (us, rank, candidate, error) in enumerate(timed):
        split = kernel_split(dispatcher, sets[0]["ops"], candidate.spec) if place < PROFILED else ""
        rows.append({"case": case["name"], "kernel": candidate.spec.name, "us": round(us, 2),
                     "vendor_us": round(vendor_us, 2), "ratio": round(vendor_us / us, 4), "rel_error": f"{error:.2e}",
                     "modelled_us": round(candidate.score.terms.get("modelled_us", 0.0), 2), "model_rank": rank,
                     "split": split})
    best = ", ".join(f"{r['kernel'][10:60]} {r['us']}" for r in rows[:3])
    print(f"{case['name']}: cuDNN {vendor_us:.1f} us; fastest {best}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--direction", type=Direction, required=True)
    parser.add_argument("--cases", required=True, help="comma-separated suite case names")
    parser.add_argument("--family", default="igemm-tma")
    parser.add_argument("--rule-set", default="full")
    parser.add_argument("--match", default="", help="a regular expression the kernels' names must contain")
    parser.add_argument("--suite", type=Path, default=suite_bench.SUITE, help="a suite file in conv.json's format")
    args = parser.parse_args()
    arch = current_arch()
    dispatcher = Dispatcher(Registry.from_rule_set("conv", args.rule_set, arch), arch)
    cases = {c["name"]: c for c in json.loads(args.suite.read_text())["cases"]}
    rows = [row for name in args.cases.split(",")
            for row in sweep_case(dispatcher, cases[name], args.direction, args.family, args.match)]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"conv_sweep_{args.family}_{args.direction.value}.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
