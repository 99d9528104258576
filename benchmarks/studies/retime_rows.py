"""Rows of a sweep table to time again: a resumable sweep directory without them, and their problems.

A sweep resumes by skipping the (problem, kernel, GPU) rows its directory holds, so the way to
time some rows again is a directory that lacks them while its plan still names their kernels:
the rerun then finds those problems incomplete and times what is missing. This writes `--out`
with the table's other rows as `part-0.parquet` (the plan attached: the table's own, or, for a
table written before plans were kept, the kernels each problem has rows for) and the problems
concerned as `problems.json`, so that

    python benchmarks/studies/retime_rows.py TABLE --error "one call" --out DIR
    tiledispatch sweep --op OP --problems DIR/problems.json --dtype D [--direction X] --out DIR ...

times the rows whose `error` starts with "one call" (kernels that kept a single, possibly
held-up, call's time) with the sweep of today.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from tiledispatch.bench import completeness
from tiledispatch.bench.problemsets import save_problems
from tiledispatch.bench.table import problem_from_row, write_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table")
    parser.add_argument("--error", required=True, help="the rows whose error starts with this are timed again")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    table = pq.read_table(args.table)
    errors = pc.fill_null(table.column("error"), "")
    again = pc.starts_with(errors, args.error)
    plan = completeness.read(Path(args.table))
    if plan is None:  # every kernel a problem has a row for was planned for it
        plan = {}
        for pid, kernel in zip(table.column("problem_id").to_pylist(), table.column("kernel").to_pylist()):
            plan.setdefault(pid, []).append(kernel)
    redo = table.filter(again)
    pids = set(redo.column("problem_id").to_pylist())
    if not pids:
        raise SystemExit(f"no row of {args.table} has an error starting with {args.error!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    kept = table.filter(pc.invert(again))
    write_file(completeness.attached(kept, plan), args.out / "part-0.parquet")
    op = table.column("op")[0].as_py()
    seen, problems = set(), []
    for pid, text in zip(redo.column("problem_id").to_pylist(), redo.column("problem").to_pylist()):
        if pid not in seen:
            seen.add(pid)
            problems.append(problem_from_row(op, text))
    save_problems(problems, args.out / "problems.json")
    print(f"{redo.num_rows} rows of {len(problems)} problems to time again; {kept.num_rows} kept -> {args.out}")


if __name__ == "__main__":
    main()
