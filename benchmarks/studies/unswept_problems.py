"""The next problems to sweep: problems of named sets that no given table holds yet, shuffled.

A slice's model gains from more problems, not from more rows of the ones it has
(docs/selection.md). This draws the next batch: every problem of each `--set` (its
`--seed` for random sets, at most `--max-flops`), less those whose `problem_id` some
`--exclude` table or problem file already holds, shuffled by `--seed` and cut to `--count`,
written as a problem file that `tiledispatch sweep --problems` takes.

    python benchmarks/studies/unswept_problems.py --op conv --dtype bf16 --direction forward \
        --set conv-torchvision:100 --set conv-random:40 --seed 12 --max-flops 4e11 \
        --exclude benchmarks/results/h200/selection/conv_forward_bf16_sweep.parquet --out FILE
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow.parquet as pq

from tiledispatch.bench.problemsets import load_problems, problem_set, save_problems
from tiledispatch.bench.table import problem_id


def held(paths: list[str]) -> set[str]:
    """The problem ids of tables (parquet files or directories of parts) and problem files."""
    ids: set[str] = set()
    for path in map(Path, paths):
        if path.suffix == ".json":
            ids.update(problem_id(p) for p in load_problems(path))
            continue
        parts = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
        for part in parts:
            ids.update(pq.read_table(part, columns=["problem_id"]).column("problem_id").to_pylist())
    return ids


def draw(sets: list[tuple[str, int]], dtype: str, direction: str | None, seed: int, max_flops: float | None,
         exclude: set[str]) -> list:
    """`count` problems of each set not in `exclude` (nor drawn already), shuffled as one list."""
    rng = random.Random(f"unswept:{seed}")
    chosen, taken = [], set(exclude)
    for name, count in sets:
        fresh = [p for p in problem_set(name, dtype=dtype, direction=direction, seed=seed, max_flops=max_flops)
                 if problem_id(p) not in taken]
        rng.shuffle(fresh)
        for p in fresh[:count]:
            taken.add(problem_id(p))
            chosen.append(p)
    rng.shuffle(chosen)  # a sweep stopped by its budget keeps a random sample of every set
    return chosen


def _set(text: str) -> tuple[str, int]:
    name, _, count = text.partition(":")
    return name, int(count) if count else 10**9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", required=True, choices=("gemm", "conv", "attention"))
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--direction")
    parser.add_argument("--set", dest="sets", action="append", type=_set, required=True,
                        help="NAME[:COUNT], a problem set and how many of its unswept problems to take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-flops", type=float)
    parser.add_argument("--exclude", action="append", default=[], help="a table or problem file already swept")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    problems = draw(args.sets, args.dtype, args.direction, args.seed, args.max_flops, held(args.exclude))
    if any(p.op.value != args.op for p in problems):
        raise SystemExit(f"a set of another op than {args.op} was given")
    save_problems(problems, args.out)
    print(f"{len(problems)} problems -> {args.out}")


if __name__ == "__main__":
    main()
