"""Where a sweep task's time goes: the first problems of a problem file, each planned as the sweep
plans it (the rule set's candidates, `CandidatePolicy()`), run by `sweep_worker.run_task` in this
process, with the wall time between its `started` marks summed by phase (build, prepare: operands
and float64 reference, check: a kernel's launchers, plan, poisoned run and comparison, and the
timed samples) and, with `--cprofile`, the functions that took it.

    python benchmarks/studies/sweep_task_profile.py --op attention --problems FILE [--count 3] [--cprofile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

from tiledispatch.bench.candidates import CandidatePolicy, planned
from tiledispatch.bench.problemsets import load_problems
from tiledispatch.bench.sweep_worker import BUILDING, PREPARING, Task, run_task
from tiledispatch.core.dispatcher import Dispatcher, Strategy
from tiledispatch.core.op import get_op
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch


class Phases:
    """Seconds by phase between consecutive `started` marks; a kernel's first mark is its check,
    its later marks its samples."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.seen: set[str] = set()
        self.phase, self.since = None, time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        if self.phase is not None:
            self.seconds[self.phase] += now - self.since
        self.phase = name if name in (BUILDING, PREPARING) else "sample" if name in self.seen else "check"
        self.seen.add(name)
        self.since = now

    def close(self) -> None:
        self.mark(BUILDING)
        self.phase = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", required=True)
    parser.add_argument("--problems", required=True)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    arch = current_arch()
    kind = get_op(args.op).kind
    dispatcher = Dispatcher(Registry.from_rule_sets([kind], "default", arch), arch, strategy=Strategy.RULES)
    profile = cProfile.Profile() if args.cprofile else None
    for problem in load_problems(args.problems)[:args.count]:
        kernels = tuple(p.spec for p in planned(dispatcher, problem, CandidatePolicy()) if p.refused is None)
        phases = Phases()
        start = time.perf_counter()
        if profile is not None:
            profile.enable()
        result = run_task(Task(problem, kernels, jobs=8), started=phases.mark)
        if profile is not None:
            profile.disable()
        phases.close()
        wall = time.perf_counter() - start
        statuses = defaultdict(int)
        for outcome in result.outcomes:
            statuses[outcome.status.value] += 1
        split = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(phases.seconds.items(), key=lambda kv: -kv[1]))
        print(f"{problem}\n  {len(kernels)} kernels {dict(statuses)}: {wall:.2f} s ({split})", flush=True)
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
