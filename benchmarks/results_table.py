"""Rebuilds a results folder's long-format table from the suite CSVs committed in it (issue 41).

    python benchmarks/results_table.py h200 h100      (benchmarks/results/<gpu>/results.parquet)
    python benchmarks/results_table.py h200 --root DIR [--arch sm_90]

The suite runners (gemm.py, conv.py, attention.py, models.py) update `<out>/results.parquet`
themselves after each run; this rebuilds it from scratch, from the CSVs that
`tiledispatch.bench.results.SUITE_CSVS` lists for the folder, when a CSV was renamed, merged or
replaced by hand, or when the conversion changes. The GPU, torch and Triton versions the older
CSVs lack come from the folder's README (its text before the file table); the arch from the
kernel names, which end in the arch they were built for. A value neither states stays null (the
GEMM and conv CSVs record no commit or date), and the script says which. A CSV of the folder in a
suite format that the list does not name is reported, not read.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from dataclasses import fields, replace
from pathlib import Path

from tiledispatch.bench.results import (
    FORMATS,
    SUITE_CSVS,
    TABLE_NAME,
    Environment,
    read_csv,
    write_table,
)

ROOT = Path(__file__).resolve().parent / "results"


def readme_environment(path: Path) -> Environment:
    """The card and versions a results folder's README states before its file table ("one NVIDIA
    H200 (torch 2.11.0+cu130, Triton 3.6.0, ...)"); None for any it does not state."""
    head = path.read_text().split("\n|", 1)[0]

    def find(pattern: str) -> str | None:
        match = re.search(pattern, head)
        return match.group(1) if match else None

    return Environment(gpu=find(r"(NVIDIA [^(,;\n]*[^\s(,;])"), torch=find(r"\btorch (\d[\w.+]*\w)"),
                       triton=find(r"\bTriton (\d[\w.+]*\w)"))


def kernel_arch(rows: list[dict]) -> str | None:
    """The one arch every kernel name among `rows` ends in (`..._sm90`: sm_90); None if not one."""
    archs = {m.group(1) for r in rows if r["kernel"] and (m := re.search(r"_sm(\d+)$", r["kernel"]))}
    return f"sm_{archs.pop()}" if len(archs) == 1 else None


def unlisted(folder: Path, listed: tuple[str, ...]) -> list[str]:
    """The CSVs of `folder` in a suite runner's format that `listed` leaves out."""
    headers = {fmt.header for fmt in FORMATS.values()}
    out = []
    for path in sorted(folder.glob("*.csv")):
        with path.open(newline="") as f:
            if path.name not in listed and tuple(next(csv.reader(f), ())) in headers:
                out.append(path.name)
    return out


def rebuild(folder: Path, arch: str | None = None) -> dict:
    """Writes `folder/results.parquet` from its listed CSVs; what it did, for the report."""
    listed = SUITE_CSVS.get(folder.name)
    if listed is None:
        raise SystemExit(f"{folder}: no list of suite CSVs for {folder.name!r} in tiledispatch/bench/results.py "
                         f"(known: {', '.join(SUITE_CSVS)})")
    env = readme_environment(folder / "README.md")
    rows = [row for name in listed for row in read_csv(folder / name, env)]
    env = replace(env, arch=arch or kernel_arch(rows))
    for row in rows:
        row["arch"] = env.arch
    count = write_table(folder / TABLE_NAME, rows)
    return {"path": folder / TABLE_NAME, "rows": count, "env": env, "unlisted": unlisted(folder, listed),
            "by_benchmark": collections.Counter(r["benchmark"] for r in rows),
            "null": [f.name for f in fields(env) if getattr(env, f.name) is None]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpus", nargs="+", help="results folders by name: h200, h100")
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder that holds them")
    parser.add_argument("--arch", default=None,
                        help="the arch of every row (default: the one the kernel names end in)")
    args = parser.parse_args(argv)
    for gpu in args.gpus:
        report = rebuild(args.root / gpu, args.arch)
        env = report["env"]
        print(f"{report['path']}: {report['rows']} rows, {report['path'].stat().st_size / 1e6:.2f} MB "
              f"(gpu {env.gpu!r}, torch {env.torch!r}, triton {env.triton!r}, arch {env.arch!r}; "
              f"left null where a CSV does not say: {', '.join(report['null'])})")
        for benchmark, n in sorted(report["by_benchmark"].items()):
            print(f"  {benchmark:<10} {n}")
        if report["unlisted"]:
            print(f"  not read (a suite format, not in SUITE_CSVS): {', '.join(report['unlisted'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
