"""Selection quality of the `rules` ranking, offline, from a benchmark table: no GPU needed.

Every Triton candidate of every case was timed by benchmarks/gemm.py; this re-ranks them
with the current `rule_score` and reports time(oracle) / time(pick) per case: mean,
median, P10 and minimum, and the worst cases. Edit ops/gemm/ranking.py, rerun, compare.

With --vendor the vendor candidate takes part too, timed as the table's cuBLAS row (what
the dispatcher with the vendor family would run), and the report adds the pick's ratio to
cuBLAS: the figure the issue's "never below 0.98x" target is about.

With --autotune (which implies --vendor) the pick is the `autotune` strategy's instead: the
fastest of its finalists (heuristics/autotune.py) by the table's times, the vendor kept
within its margin. The table's medians stand in for the tuning run's own samples, so this
is the strategy with a noiseless tuning run: how good its finalists are, not its timer.

    python benchmarks/evaluate_rules.py benchmarks/results/h200/gemm.csv [--arch sm_90] [--vendor] [--autotune]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from dataclasses import replace

import torch

import tiledispatch  # noqa: F401  (first: it picks the backend)
from tiledispatch import arch as arch_facts
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.heuristics import autotune
from tiledispatch.ops.gemm import GemmLayout, GemmProblem, GemmTypes, check_operands
from tiledispatch.ops.gemm.ranking import replay_pick


def problem_of(row: dict) -> GemmProblem:
    """The benchmark's problem: A row-major, B column-major, C contiguous, fresh (aligned) allocations.

    Described from shape-only (meta) tensors laid out as benchmarks/gemm.py lays them out,
    by the library's own checks, so alignment follows its rule (16 bytes, not 16 elements).
    """
    m, n, k, batch = (int(row[x]) for x in ("m", "n", "k", "batch"))
    types = GemmTypes.parse(row["dtype"])
    lead = (batch,) if batch > 1 else ()
    a = torch.empty(*lead, m, k, device="meta", dtype=types.a.torch)
    b = torch.empty(*lead, n, k, device="meta", dtype=types.b.torch).transpose(-1, -2)
    problem = check_operands(a, b, out_dtype=types.c.torch).problem
    # The table's kernels are rcr ones (a dim of one may read as either layout).
    return replace(problem, layout=GemmLayout.parse("rcr"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--worst", type=int, default=10)
    parser.add_argument("--vendor", action="store_true", help="the vendor candidate takes part (timed as cuBLAS)")
    parser.add_argument("--autotune", action="store_true", help="the autotune strategy's pick (implies --vendor)")
    args = parser.parse_args()
    args.vendor |= args.autotune
    arch = arch_facts.load(args.arch)
    times: dict[tuple, dict[str, float]] = defaultdict(dict)
    vendor_ms: dict[tuple, float] = {}
    problems = {}
    for row in csv.DictReader(open(args.table)):
        key = (row["case"], row["dtype"])
        if row["provider"] == "triton-candidate" and row["ms"]:
            times[key][row["kernel"]] = float(row["ms"])
            problems[key] = problem_of(row)
        elif row["provider"] == "cublas" and row["ms"]:
            vendor_ms[key] = float(row["ms"])
    registry = Registry.from_rule_set("gemm", "default", arch)
    efficiency, vs_vendor, picks = {}, {}, {}
    for key, measured in times.items():
        if args.vendor and key in vendor_ms:
            vendor = next(s for s in registry if s.family == "vendor"
                          and s.definition.supports(s.config, problems[key]) is None)
            measured = {**measured, vendor.name: vendor_ms[key]}
        # The dispatcher's own ranking (ties keep registry order), over the kernels that were timed.
        dispatcher = Dispatcher(registry.filter(lambda s, names=measured: s.name in names), arch)
        if args.autotune:
            finalists = [c.spec for c in autotune.finalists(dispatcher.explain(problems[key]).ranked)]
            winner = autotune.winner({s.name: measured[s.name] for s in finalists},
                                     [s.name for s in finalists if s.family == "vendor"])
            pick = next(s for s in finalists if s.name == winner)
        else:
            pick = replay_pick(dispatcher, problems[key])  # the table's times are CUDA-graph replays
        picks[key] = pick.name
        efficiency[key] = min(measured.values()) / measured[pick.name]
        if key in vendor_ms:
            vs_vendor[key] = vendor_ms[key] / measured[pick.name]
    report("selection efficiency (oracle / pick)", efficiency, picks, args.worst)
    report("pick vs cuBLAS", vs_vendor, picks, args.worst)


def report(title: str, values_by_case: dict, picks: dict, worst: int) -> None:
    values = sorted(values_by_case.values())
    geomean = math.exp(statistics.mean(map(math.log, values)))
    print(f"{title}, {len(values)} cases: mean {statistics.mean(values):.3f}  geomean {geomean:.3f}  "
          f"median {statistics.median(values):.3f}  P10 {values[len(values) // 10]:.3f}  min {values[0]:.3f}")
    for dtype in sorted({key[1] for key in values_by_case}):
        of_dtype = sorted(v for key, v in values_by_case.items() if key[1] == dtype)
        print(f"  {dtype}: {len(of_dtype)} cases, mean {statistics.mean(of_dtype):.3f}  geomean "
              f"{math.exp(statistics.mean(map(math.log, of_dtype))):.3f}  min {of_dtype[0]:.3f}")
    for key, value in sorted(values_by_case.items(), key=lambda kv: kv[1])[:worst]:
        print(f"  {value:.3f}  {key[0]} {key[1]}  ({picks[key]})")


if __name__ == "__main__":
    main()
