"""Selection quality of the conv `rules` ranking, offline, from a benchmark table: no GPU needed.

benchmarks/conv.py timed the Triton candidates of every case (provider `triton-candidate`)
and cuDNN (`cudnn`). This re-ranks the timed candidates with the current `rule_score`
(ops/conv/ranking.py) and reports, per case-direction-dtype:
  - selection efficiency, time(fastest timed) / time(pick);
  - the pick's speed against cuDNN, cudnn_ms / pick_ms: mean, geomean, median, P10,
    minimum and the worst cases (the issue's "dispatcher never below 0.98x" is about
    this figure with the vendor taking part).
Twice: among the Triton kernels alone, and with the vendor candidate taking part, timed
as the table's cuDNN row (what the dispatcher with the vendor family runs).
Edit ops/conv/ranking.py, rerun, compare.

    python benchmarks/evaluate_conv_rules.py benchmarks/results/h200/conv.csv [--arch sm_90]
        [--worst 10] [--by-direction]

Only the kernels the table timed can be picked (the benchmark times the rules pick and
the top two of each family when it ran), so a ranking that now prefers an untimed kernel
is judged on its best timed one: rerun the benchmark to see the rest.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import tiledispatch  # noqa: F401  (first: it picks the backend)
from tiledispatch import arch as arch_facts
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.ops.conv import ConvProblem, ConvTypes, Direction

SUITE = Path(__file__).parent / "suites" / "conv.json"


def problem_of(case: dict, direction: str, dtype: str) -> ConvProblem:
    """The benchmark's problem (benchmarks/conv.py): fresh dense channels-last tensors."""
    p = ConvProblem(Direction.parse(direction), case["N"], case["C"], case["K"], case["G"], tuple(case["input"]),
                    tuple(case["filter"]), case["stride"], tuple(case["pad"]), case["dilation"],
                    ConvTypes.parse(dtype))
    return replace(p, specialization=p.dense_specialization())


def load(table: str, suite: Path) -> tuple[dict, dict, dict]:
    """Timed Triton kernels, the cuDNN time, and the problem, per (case, direction, dtype)."""
    cases = {c["name"]: c for c in json.loads(suite.read_text())["cases"]}
    times: dict[tuple, dict[str, float]] = defaultdict(dict)
    vendor_ms: dict[tuple, float] = {}
    problems: dict[tuple, ConvProblem] = {}
    with open(table) as f:
        for row in csv.DictReader(f):
            key = (row["case"], row["direction"], row["dtype"])
            if not row["ms"]:
                continue
            if row["provider"] == "triton-candidate":
                times[key][row["kernel"]] = float(row["ms"])
            elif row["provider"] == "cudnn":
                vendor_ms[key] = float(row["ms"])
            else:
                continue
            if key not in problems:
                problems[key] = problem_of(cases[row["case"]], row["direction"], row["dtype"])
    return times, vendor_ms, problems


def pick(registry: Registry, arch, problem: ConvProblem, measured: dict[str, float]) -> str:
    """The dispatcher's own ranking (ties keep registry order), over the kernels that were timed."""
    dispatcher = Dispatcher(registry.filter(lambda s, names=measured: s.name in names), arch)
    return dispatcher.select(problem).name


def evaluate(times, vendor_ms, problems, registry, arch, with_vendor: bool) -> tuple[dict, dict, dict]:
    efficiency, vs_vendor, picks = {}, {}, {}
    for key, measured in times.items():
        p = problems[key]
        if with_vendor and key in vendor_ms:
            vendor = next(s for s in registry if s.family == "vendor"
                          and s.definition.supports(s.config, p) is None)
            measured = {**measured, vendor.name: vendor_ms[key]}
        chosen = pick(registry, arch, p, measured)
        picks[key] = chosen.removeprefix("conv_").removesuffix("_none_sm90")
        efficiency[key] = min(measured.values()) / measured[chosen]
        if key in vendor_ms:
            vs_vendor[key] = vendor_ms[key] / measured[chosen]
    return efficiency, vs_vendor, picks


def summary(values: list[float]) -> str:
    values = sorted(values)
    geomean = math.exp(statistics.mean(map(math.log, values)))
    return (f"mean {statistics.mean(values):.3f}  geomean {geomean:.3f}  median {statistics.median(values):.3f}  "
            f"P10 {values[len(values) // 10]:.3f}  min {values[0]:.3f}")


def report(title: str, values_by_case: dict, picks: dict, worst: int, by_direction: bool) -> None:
    print(f"{title}, {len(values_by_case)} cases: {summary(list(values_by_case.values()))}")
    if by_direction:
        for d in Direction:
            subset = [v for k, v in values_by_case.items() if k[1] == d.value]
            if subset:
                print(f"    {d.value:<10} {summary(subset)}")
    for key, value in sorted(values_by_case.items(), key=lambda kv: kv[1])[:worst]:
        print(f"  {value:.3f}  {' '.join(key)}  ({picks[key]})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--rule-set", default="default", help="the registry the table's kernels come from")
    parser.add_argument("--worst", type=int, default=10)
    parser.add_argument("--by-direction", action="store_true", help="the summaries per direction too")
    args = parser.parse_args()
    arch = arch_facts.load(args.arch)
    times, vendor_ms, problems = load(args.table, args.suite)
    registry = Registry.from_rule_set("conv", args.rule_set, arch)
    known = {s.name for s in registry}
    missing = sorted({name for measured in times.values() for name in measured} - known)
    if missing:
        print(f"{len(missing)} timed kernels are not in rule set {args.rule_set!r} and cannot be picked, "
              f"e.g. {missing[0]}")
        times = {key: {n: ms for n, ms in measured.items() if n in known} for key, measured in times.items()}
        times = {key: measured for key, measured in times.items() if measured}
    for with_vendor in (False, True):
        efficiency, vs_vendor, picks = evaluate(times, vendor_ms, problems, registry, arch, with_vendor)
        who = "with the vendor" if with_vendor else "Triton only"
        report(f"[{who}] selection efficiency (oracle / pick)", efficiency, picks, args.worst, args.by_direction)
        report(f"[{who}] pick vs cuDNN", vs_vendor, picks, args.worst, args.by_direction)
        print()


if __name__ == "__main__":
    main()
