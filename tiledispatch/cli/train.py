"""`tiledispatch train TABLE --out DIR`: a learned selection model per (op, direction, dtype, arch)
of a sweep's results table, written as `DIR/<arch>/<op>_<direction>_<dtype>.{txt,features.json,
manifest.json}` (copy `DIR/<arch>/` into `tiledispatch/arch/models/` to ship them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ..core.errors import InvalidArgumentError, UnsupportedError
from ..heuristics.training import SEED_MAX
from .common import emit


def read_table(*tables: Path) -> Any:
    """A results table: parquet files, or every parquet file under a directory (a sweep's parts),
    read as one table, each row once."""
    import pandas as pd

    from ..bench.table import distinct_rows

    frames = []
    for table in tables:
        if not table.exists():
            raise FileNotFoundError(f"no results table at {table}; give a parquet file or a sweep's directory")
        parts = sorted(table.glob("**/*.parquet")) if table.is_dir() else [table]
        if not parts:
            raise UnsupportedError(f"{table} holds no parquet file; give the directory `tiledispatch sweep --out` "
                                   "wrote")
        try:
            frames += [pd.read_parquet(p) for p in parts]
        except (ValueError, OSError) as e:  # pyarrow's errors are ValueErrors (ArrowInvalid) or OSErrors
            raise UnsupportedError(f"cannot read {table} as a parquet results table: {e}; give a parquet file or "
                                   "the directory `tiledispatch sweep --out` wrote") from None
    return distinct_rows(pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0])


def read_complete(*tables: Path) -> tuple[Any, set[str]]:
    """`read_table` of `tables` without the problems a stopped sweep left incomplete (their fastest row
    is not their oracle: `bench/completeness.py`), and those problems' ids."""
    from ..bench import completeness

    frame = read_table(*tables)
    incomplete = set().union(*(completeness.incomplete(t, frame) for t in tables))
    return frame[~frame["problem_id"].astype(str).isin(incomplete)], incomplete


def _summary(model: Any, paths: dict[str, Path]) -> dict[str, Any]:
    m = model.manifest
    return {**m["key"], "rows": m["rows"], "problems": m["problems"], "kernels": m["kernels"], "trees": m["trees"],
            "skipped": m["skipped"], "gpus": m["gpus"], "cv": m["cv"], "pooled_dtypes": m.get("pooled_dtypes", []),
            "files": [str(p) for p in paths.values()]}


def train_command(
        tables: list[Path] = typer.Argument(..., help="sweeps' results: parquet files, or the directories of "
                                                      "their parts (read as one table)"),
        out: Path = typer.Option(..., "--out", help="directory the models are written to, one folder per arch"),
        op: Optional[str] = typer.Option(None, "--op", help="train this op's models only"),
        direction: Optional[str] = typer.Option(None, "--direction", help="forward, backward_data, ... only"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="this dtype's models only (bf16, fp16, ...)"),
        arch: Optional[str] = typer.Option(None, "--arch", help="this arch's models only (sm_90, ...)"),
        folds: int = typer.Option(5, "--folds", min=1, max=100,
                                  help="cross-validation folds, grouped by problem (1: none)"),
        seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help="LightGBM's seed"),
        pool: str = typer.Option("", "--pool", help="comma-separated dtypes whose rows (same op, direction and "
                                 "arch) each model learns from too, e.g. bf16 for an fp16 model")) -> None:
    """Train a LightGBM selection model for every (op, direction, dtype, arch) of a results table."""
    from ..heuristics import learned
    from ..heuristics.training import selection_keys

    frame, incomplete = read_complete(*tables)
    table = ",".join(map(str, tables))
    pooled = tuple(d.strip() for d in pool.split(",") if d.strip())
    chosen = {"op": op, "direction": direction, "dtype": dtype, "arch": arch}
    present = selection_keys(frame)
    keys = [k for k in present if all(v is None or getattr(k, f) == v for f, v in chosen.items())]
    if not keys:
        asked = {f: v for f, v in chosen.items() if v is not None}
        raise InvalidArgumentError(f"no ok rows in {table} match {asked or 'any key'}; its keys: "
                                   f"{[k.__dict__ for k in present] or 'none (no ok rows)'}")
    models = []
    for key in keys:
        model = learned.train(frame, key, folds=folds, seed=seed, pool=pooled)
        models.append(_summary(model, model.save(out / key.arch)))
    emit({"status": "ok", "table": str(table), "out": str(out), "incomplete_problems_left_out": len(incomplete),
          "models": models})
