"""What a problem's first sight costs the host: the ranking of every problem of a problem file
by a fresh dispatcher (`_rank`: candidates, refusals, rule scores and, with `--strategy model`,
the learned model's batched prediction) and its pick (`select` reads the first candidate, made
when read), for an arch given by name, so it runs without a GPU.

The first two problems are ranked before the clock starts: they generate their problem
classes' kernels (once per class and process) and load the models.

    python benchmarks/studies/ranking_cost.py [--problems FILE] [--strategy rules|model] [--arch sm_90] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import time

from tiledispatch import arch as arch_facts
from tiledispatch.bench.problemsets import load_problems
from tiledispatch.bench.timing import profiled
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.op import all_ops
from tiledispatch.core.registry import Registry

DEFAULT_PROBLEMS = "benchmarks/results/h200/selection/problems/sweep_gemm_main.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", default=DEFAULT_PROBLEMS)
    parser.add_argument("--strategy", default="rules")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--profile", action="store_true", help="a cProfile of the rankings too")
    args = parser.parse_args()
    problems = load_problems(args.problems)
    arch = arch_facts.load(args.arch)
    registry = Registry.from_rule_sets([definition.kind for definition in all_ops()], "default", arch)
    dispatcher = Dispatcher(registry, arch, strategy=args.strategy)
    for problem in problems[:2]:
        dispatcher._rank(problem)
    times, candidates = [], []
    for problem in problems[2:]:
        start = time.perf_counter()
        ranking = dispatcher._rank(problem)
        if ranking.accepted:
            ranking.accepted[0]
        times.append(time.perf_counter() - start)
        candidates.append(len(ranking.accepted))
    times.sort()
    print(f"{args.problems} ({len(times)} problems), {args.strategy}, {args.arch}: median "
          f"{statistics.median(times) * 1e3:.2f} ms, P90 {times[int(0.9 * len(times))] * 1e3:.2f} ms a first sight, "
          f"{statistics.median(candidates):g} candidates (median)")
    if args.profile:
        def rank_all() -> None:
            for problem in problems[2:]:
                ranking = dispatcher._rank(problem)
                if ranking.accepted:
                    ranking.accepted[0]

        stats, _ = profiled(rank_all, 1)
        stats.sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
