"""What ranking a problem as its bucket's stand-in costs the picks (no GPU needed).

GEMM ranks as the largest M of its bucket, attention as the largest sequence lengths of theirs
(`OpDefinition.ranking_problem`, `core.arith.rank_bucket`), once per bucket. For every problem of
a sweep table, this picks with the problem's own ranking and with its stand-in's (the stand-in's
order of the kernels the problem takes), under the `model` strategy on sm_90, and reads both
picks' measured times against the table's fastest: how often the pick changes and what the mean,
P10 and minimum efficiency become.

    python benchmarks/studies/rank_buckets.py [TABLE ...]
"""

from __future__ import annotations

import statistics
import sys

import pandas as pd

from tiledispatch import arch as arch_facts
from tiledispatch.bench.table import problem_from_row
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.op import all_ops
from tiledispatch.core.registry import Registry

TABLES = [f"benchmarks/results/h200/selection/{name}_sweep.parquet"
          for name in ("gemm_bf16", "gemm_fp16", "gemm_fp8e4m3", "attention_fwd_bf16", "attention_bwd_bf16")]


def picks(table: str, op: str, bucketed: bool) -> dict[str, str]:
    """Each problem's pick, by a fresh dispatcher that ranks by buckets or each problem itself."""
    arch = arch_facts.load("sm_90")
    registry = Registry.from_rule_sets([d.kind for d in all_ops()], "default", arch)
    dispatcher = Dispatcher(registry, arch, strategy="model", rank_buckets=bucketed)
    frame = pd.read_parquet(table, columns=["problem_id", "problem"]).drop_duplicates("problem_id")
    return {pid: dispatcher.select(problem_from_row(op, text)).name
            for pid, text in zip(frame.problem_id, frame.problem)}


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return f"mean {statistics.mean(ordered):.4f}, P10 {ordered[len(ordered) // 10]:.4f}, min {ordered[0]:.3f}"


def main() -> None:
    for table in sys.argv[1:] or TABLES:
        frame = pd.read_parquet(table)
        frame = frame[frame.status == "ok"]
        times = {pid: dict(zip(g.kernel, g.time_ms)) for pid, g in frame.groupby("problem_id")}
        op = frame.op.iloc[0]
        own, bucketed = picks(table, op, False), picks(table, op, True)
        judged = [pid for pid in times if own.get(pid) in times[pid] and bucketed.get(pid) in times[pid]]
        efficiency = {name: [min(times[p].values()) / times[p][chosen[p]] for p in judged]
                      for name, chosen in (("own", own), ("bucketed", bucketed))}
        changed = sum(own[p] != bucketed[p] for p in judged)
        print(f"{table}: {len(judged)} problems, {changed} picks changed; own ranking {summary(efficiency['own'])}; "
              f"by buckets {summary(efficiency['bucketed'])}", flush=True)


if __name__ == "__main__":
    main()
