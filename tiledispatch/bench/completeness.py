"""Which problems of a sweep's table have a row for every kernel the sweep planned for them.

A sweep stopped by its budget or a signal leaves some problems with part of their kernels timed.
A rerun into the same directory completes them; until then such a problem's fastest measured
kernel is not its oracle, and judging a pick against it flatters the pick. So each sweep records
the kernels it planned for each problem (`planned.json` beside the parts, merged over reruns),
and `tiledispatch evaluate` and `train` leave out the problems that are not complete. A table
gathered into one file (`sweep --gather`) carries its directory's plan in its parquet metadata.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.errors import InvalidArgumentError

PLAN_FILE = "planned.json"
PLAN_KEY = b"tiledispatch.planned"  # the plan in a gathered file's parquet metadata


def record(out: Path, planned: Mapping[str, Sequence[str]]) -> None:
    """Adds `planned` (problem id -> the kernel names planned for it) to `out`'s plan file; the caller
    holds the sweep's lock on `out`."""
    known = read(out) or {}
    for pid, kernels in planned.items():
        known[pid] = sorted(set(known.get(pid, ())) | set(kernels))
    staging = out / f".{PLAN_FILE}.{uuid.uuid4().hex[:12]}.tmp"
    staging.write_text(json.dumps(known, sort_keys=True))
    os.replace(staging, out / PLAN_FILE)


def read(out: Path) -> dict[str, list[str]] | None:
    """The plan of a sweep's directory (its plan file, merged with those its gathered parts carry) or
    of a gathered file; None where there is none (a table written before plans were kept)."""
    out = Path(out)
    if out.is_file():
        return _embedded(out)
    plans = [_parsed(out / PLAN_FILE)] if (out / PLAN_FILE).is_file() else []
    plans += [plan for part in sorted(out.glob("**/*.parquet")) if (plan := _embedded(part)) is not None]
    if not plans:
        return None
    merged: dict[str, list[str]] = {}
    for plan in plans:
        for pid, kernels in plan.items():
            merged[pid] = sorted(set(merged.get(pid, ())) | set(kernels))
    return merged


def attached(table: Any, planned: Mapping[str, Sequence[str]]) -> Any:
    """The pyarrow `table` with `planned` in its metadata: a gathered file keeps its sweep's plan."""
    metadata = {**(table.schema.metadata or {}), PLAN_KEY: json.dumps(planned, sort_keys=True).encode()}
    return table.replace_schema_metadata(metadata)


def _embedded(path: Path) -> dict[str, list[str]] | None:
    import pyarrow.parquet as pq

    try:
        text = (pq.read_schema(path).metadata or {}).get(PLAN_KEY)
    except (OSError, ValueError) as e:  # pyarrow's errors: the table's reader names the damaged file
        raise InvalidArgumentError(f"{path}: not a parquet results table ({e})") from None
    return None if text is None else _parsed(path, text)


def _parsed(path: Path, text: str | bytes | None = None) -> dict[str, list[str]]:
    try:
        data = json.loads(path.read_text() if text is None else text)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{path}: not a sweep's plan ({e}); move it away to judge every problem") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise InvalidArgumentError(f"{path}: not a sweep's plan (an object of problem ids to kernel lists); move "
                                   "it away to judge every problem")
    return data


def incomplete(out: Path, frame: Any) -> set[str]:
    """The problem ids of `frame` (the table of `out`, a directory or a gathered file) with a planned
    kernel that has no row; none where `out` has no plan."""
    planned = read(out)
    return set() if planned is None else unfinished(planned, frame)


def unfinished(planned: Mapping[str, Sequence[str]], frame: Any) -> set[str]:
    """The problem ids of `frame` with a kernel of `planned` that has no row."""
    have: dict[str, set[str]] = {}
    for pid, kernel in zip(frame["problem_id"].astype(str), frame["kernel"].astype(str)):
        have.setdefault(pid, set()).add(kernel)
    return {pid for pid in have if not set(planned.get(pid, ())) <= have[pid]}
