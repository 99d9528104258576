"""Which problems of a sweep's table have a row for every kernel the sweep planned for them.

A sweep stopped by its budget or a signal leaves some problems with part of their kernels timed.
A rerun into the same directory completes them; until then such a problem's fastest measured
kernel is not its oracle, and judging a pick against it flatters the pick. So each sweep records
the kernels it planned for each problem (`planned.json` beside the parts, merged over reruns),
and `tiledispatch evaluate` leaves out the problems that are not complete.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.errors import InvalidArgumentError

PLAN_FILE = "planned.json"


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
    """The plan file of a sweep's directory, or None where there is none (a table in one file)."""
    path = Path(out) / PLAN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{path}: not a sweep's plan file ({e}); move it away to judge every problem") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise InvalidArgumentError(f"{path}: not a sweep's plan file (an object of problem ids to kernel lists); move "
                                   "it away to judge every problem")
    return data


def incomplete(out: Path, frame: Any) -> set[str]:
    """The problem ids of `frame` (the table under `out`) with a planned kernel that has no row; none
    where `out` has no plan file."""
    planned = read(out)
    if planned is None:
        return set()
    have: dict[str, set[str]] = {}
    for pid, kernel in zip(frame["problem_id"].astype(str), frame["kernel"].astype(str)):
        have.setdefault(pid, set()).add(kernel)
    return {pid for pid in have if not set(planned.get(pid, ())) <= have[pid]}
