"""The long-format results table that sweeps write and training and evaluation read.

One row is one kernel timed on one problem on one GPU. A problem and a config travel as
canonical JSON (`core.serialize`), so any reader rebuilds the exact objects; a problem's
`problem_id` is a hash of that JSON, the unit of resuming, of the train/validation split
(grouped by problem, never by row) and of evaluation. `SelectionKey` names the slice one
learned model covers: (op, direction, dtype, arch).
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.op import get_op
from ..core.serialize import from_jsonable, to_jsonable


class Status(enum.Enum):
    """How one (problem, kernel) measurement ended. Only OK rows carry a time."""

    OK = "ok"
    WRONG = "wrong"  # ran, but its output differs from the reference beyond the dtype's tolerance
    BUILD_FAILED = "build_failed"  # the compiler refused or crashed on it
    LAUNCH_FAILED = "launch_failed"  # a Python error while planning or launching
    FAULT = "fault"  # the worker process died (an illegal address, a device assert)
    TIMEOUT = "timeout"  # the worker outlived the task's time limit and was killed
    UNSUPPORTED = "unsupported"  # the kernel refuses the problem (`supports`), so it was not run


# The table's columns, in order. Problem and config fields beyond these stay in their JSON.
COLUMNS = (
    "op", "direction", "dtype", "arch", "problem_set", "problem_id", "problem",
    "kernel", "family", "vendor", "config",
    "status", "error", "time_ms", "tflops", "gbps", "flops", "bytes",
    "rule_score", "rule_rank",
    "gpu", "sm_clock_mhz", "mem_clock_mhz", "torch", "triton", "commit", "host", "timestamp",
)


@dataclass(frozen=True, order=True)
class SelectionKey:
    """The slice of problems one learned model ranks: an op, a direction, a dtype, an arch."""

    op: str
    direction: str
    dtype: str
    arch: str

    @property
    def name(self) -> str:
        """The file stem of this slice's model: ``gemm_forward_bf16`` (the arch is the folder)."""
        return f"{self.op}_{self.direction}_{self.dtype}"


def selection_key(problem: Any, arch: str) -> SelectionKey:
    """The slice `problem` belongs to on `arch` (an arch name such as ``sm_90``): the problem's own
    `selection_slice()` where it has one (each op's does; `describe` builds every field), else read
    from its description."""
    if hasattr(problem, "selection_slice"):
        direction, dtype = problem.selection_slice()
        return SelectionKey(problem.op.value, direction, dtype, str(arch))
    described = problem.describe()
    return SelectionKey(problem.op.value, described.get("direction", "forward"), str(described["dtype"]),
                        str(arch))


def canonical_json(obj: Any) -> str:
    """A dataclass (problem or config) as compact JSON with sorted keys: one text per value."""
    return json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))


def problem_id(problem: Any) -> str:
    """A stable id of a problem: its op and canonical JSON, hashed (16 hex digits)."""
    text = f"{problem.op.value}:{canonical_json(problem)}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def problem_from_row(op: str, problem_json: str) -> Any:
    """The problem object a row's ``problem`` column holds."""
    return from_jsonable(get_op(op).problem_type, json.loads(problem_json), "problem")


def config_from_row(op: str, config_json: str) -> Any:
    """The config object a row's ``config`` column holds."""
    return from_jsonable(get_op(op).config_type, json.loads(config_json), "config")


def distinct_rows(frame: Any) -> Any:
    """A results frame with a row that copies an earlier one in every column kept once: a gathered
    table copied back into the directory its parts are still in (to resume it) holds each of their
    rows twice, and a row's timestamp and host make real reruns differ. A kernel's time is the
    median of its rows, which a copy would weigh."""
    return frame.drop_duplicates(ignore_index=True)


def write_file(table: Any, path: str | Path, **options: Any) -> int:
    """A pyarrow table as one parquet file at `path`, written under a temporary name and renamed, so
    that a reader never sees half a file (`options` go to `pyarrow.parquet.write_table`); its row
    count."""
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, staging, **options)
    staging.rename(path)
    return table.num_rows
