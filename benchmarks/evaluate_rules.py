"""Selection quality of the `rules` ranking, offline, from a benchmark table: no GPU needed.

Every Triton candidate of every case was timed by benchmarks/gemm.py; this re-ranks them
with the current `rule_score` and reports time(oracle) / time(pick) per case: mean,
median, P10 and minimum, and the worst cases. Edit ops/gemm/ranking.py, rerun, compare.

    python benchmarks/evaluate_rules.py benchmarks/results/h200/gemm.csv [--arch sm_90]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict

import tiledispatch  # noqa: F401  (first: it picks the backend)
from tiledispatch import arch as arch_facts
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm import Alignment, GemmLayout, GemmProblem, GemmTypes


def problem_of(row: dict) -> GemmProblem:
    """The benchmark's problem: A row-major, B column-major, C contiguous, fresh (aligned) allocations."""
    m, n, k, batch = (int(row[x]) for x in ("m", "n", "k", "batch"))
    alignment = Alignment(a=k % 16 == 0 or m == 1, b=k % 16 == 0, c=n % 16 == 0 or m == 1,
                          m=m % 16 == 0, n=n % 16 == 0, k=k % 16 == 0)
    return GemmProblem(m, n, k, batch, types=GemmTypes.parse(row["dtype"]), layout=GemmLayout.parse("rcr"),
                       alignment=alignment)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--worst", type=int, default=10)
    args = parser.parse_args()
    arch = arch_facts.load(args.arch)
    times: dict[tuple, dict[str, float]] = defaultdict(dict)
    problems = {}
    for row in csv.DictReader(open(args.table)):
        if row["provider"] == "triton-candidate" and row["ms"]:
            key = (row["case"], row["dtype"])
            times[key][row["kernel"]] = float(row["ms"])
            problems[key] = problem_of(row)
    registry = Registry.from_rule_set("gemm", "default", arch)
    efficiency = {}
    for key, measured in times.items():
        # The dispatcher's own ranking (ties keep registry order), over the kernels that were timed.
        dispatcher = Dispatcher(registry.filter(lambda s, names=measured: s.name in names), arch)
        pick = dispatcher.select(problems[key])
        efficiency[key] = min(measured.values()) / measured[pick.name]
    values = sorted(efficiency.values())
    print(f"{len(values)} cases: mean {statistics.mean(values):.3f}  median {statistics.median(values):.3f}  "
          f"P10 {values[len(values) // 10]:.3f}  min {values[0]:.3f}")
    for key, value in sorted(efficiency.items(), key=lambda kv: kv[1])[:args.worst]:
        print(f"  {value:.3f}  {key[0]} {key[1]}")


if __name__ == "__main__":
    main()
