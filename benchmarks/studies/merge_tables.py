"""One results table from several: a slice's committed sweep and the tables of later sweeps.

The rows of every input, exact copies kept once (`bench.table.distinct_rows`), written to `--out`
with the union of the inputs' plans in its metadata (`bench.completeness`), so `evaluate` and
`train` still leave out a problem that a budget stopped before its last kernel.

    python benchmarks/studies/merge_tables.py COMMITTED.parquet NEW.parquet [...] --out COMMITTED.parquet
"""

from __future__ import annotations

import argparse

import pyarrow as pa
import pyarrow.parquet as pq

from tiledispatch.bench import completeness
from tiledispatch.bench.table import distinct_rows, write_file


def merged(paths: list[str]) -> tuple[pa.Table, dict[str, list[str]]]:
    """The inputs' rows as one table (copies dropped) and their plans' union."""
    tables = [pq.read_table(path) for path in paths]
    plan: dict[str, list[str]] = {}
    for path in paths:
        for pid, kernels in (completeness.read(path) or {}).items():
            plan[pid] = sorted(set(plan.get(pid, ())) | set(kernels))
    rows = pa.concat_tables([t.replace_schema_metadata(None) for t in tables], promote_options="default")
    frame = distinct_rows(rows.to_pandas())
    return pa.Table.from_pandas(frame, schema=rows.schema, preserve_index=False), plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    table, plan = merged(args.tables)
    if plan:
        table = completeness.attached(table, plan)
    frame = table.select(["problem_id", "kernel"]).to_pandas()
    left = completeness.unfinished(plan, frame)
    write_file(table, args.out)
    print(f"{table.num_rows} rows, {frame.problem_id.nunique()} problems ({len(left)} incomplete) -> {args.out}")


if __name__ == "__main__":
    main()
