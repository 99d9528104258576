"""The `autotune` strategy's records, and the policy the dispatcher asks, below the dispatcher.

What a tuning found is kept on disk by `TuningStore` (the dispatcher reads and writes it). How
finalists are chosen, timed and judged is a policy (`TuningPolicy`) that lives above the core,
in `tiledispatch.heuristics.autotune`, and registers itself (`set_policy`): the core never
imports the heuristics.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from . import jsonio
from .cachedir import Access, ensure_private_dir
from .errors import UnsupportedError

FORMAT = 1
log = logging.getLogger("tiledispatch.autotune")


@dataclass(frozen=True)
class TuningRecord:
    """What one tuning found: the winner and every finalist's median time."""

    winner: str
    times_ms: Mapping[str, float]
    problem: Mapping[str, Any]  # the problem, described: a person reading the file sees what it is about

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "winner": self.winner, "times_ms": dict(self.times_ms), "problem": self.problem,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


class TuningPolicy(Protocol):
    """What the dispatcher's `autotune` strategy asks of the heuristics (`heuristics.autotune`)."""

    def finalists(self, ranked: Sequence[Any]) -> list[Any]:
        """The candidates worth timing, from the rules' ranking (best first)."""

    def operand_sets(self, problem_bytes: int, l2_bytes: int, on_gpu: bool) -> int:
        """How many fresh operand sets to rotate through while timing."""

    def measure(self, runs: Mapping[str, Callable[[], object]], on_gpu: bool) -> dict[str, float]:
        """The milliseconds per call of each run."""

    def winner(self, times: Mapping[str, float], vendors: Sequence[str]) -> str:
        """The finalist to keep, from the times and the vendor finalists' names."""


_POLICY: list[TuningPolicy] = []
_POLICY_LOCK = threading.Lock()


def set_policy(policy: TuningPolicy) -> None:
    """Makes `policy` the one the dispatcher's `autotune` strategy follows (the last set stands).
    Its attributes are read at each use, so a module set as the policy can be patched."""
    with _POLICY_LOCK:
        _POLICY[:] = [policy]


def policy() -> TuningPolicy:
    """The policy set; importing `tiledispatch` sets `heuristics.autotune`'s."""
    if not _POLICY:
        raise UnsupportedError("the autotune strategy has no tuning policy: importing tiledispatch sets the "
                               "autotune heuristics' one; another is set by core.tuning.set_policy")
    return _POLICY[0]


class TuningStore:
    """Tuning records on disk: one JSON file per (problem, finalists, toolchain, device).

    A record is written to a temporary file and renamed into place, so a reader never sees
    half of one; two processes tuning the same problem at once both write a valid winner
    and the last rename stands. A record that cannot be used is treated as missing, so the
    problem is tuned again and the record overwritten: an unreadable file (read with
    bounded size and nesting, never through a symlink), one of another format, or one
    whose winner is not among its own timed finalists or not among `finalists` when the
    caller names them. The finalists' names are part of the key: a registry that offers
    other kernels tunes anew.
    """

    MAX_BYTES = 1 << 20
    MAX_DEPTH = 8  # a record nests 3 levels

    def __init__(self, root: Path) -> None:
        self.access = Access.from_env()
        self.dir = Path(root) / f"tuning-v{FORMAT}"
        ensure_private_dir(self.dir, self.access)

    @staticmethod
    def key(op: str, arch: str, problem: Any, names: Sequence[str], device: str) -> str:
        import torch

        from .kernel import toolchain

        blob = json.dumps([op, arch, device, repr(problem.key()), sorted(names), torch.__version__,
                           sorted(toolchain().items())])
        return f"{op}-{hashlib.sha256(blob.encode()).hexdigest()[:32]}"

    def get(self, key: str, finalists: Sequence[str] | None = None) -> TuningRecord | None:
        """The record of `key`, or None if there is none or it cannot be used (see the class)."""
        try:
            data = jsonio.read_json(self.dir / f"{key}.json", max_bytes=self.MAX_BYTES, max_depth=self.MAX_DEPTH,
                                    follow_symlinks=False)
        except (OSError, jsonio.JsonFileError):
            return None
        return _record(data, finalists)

    def put(self, key: str, record: TuningRecord) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{key}.", suffix=".tmp")
        try:
            os.fchmod(fd, self.access.file_mode)  # members of a group cache read each other's records
            with os.fdopen(fd, "w") as f:
                json.dump(record.to_dict(), f, indent=1)
            os.replace(tmp, self.dir / f"{key}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _record(data: Any, finalists: Sequence[str] | None) -> TuningRecord | None:
    """A stored record, checked; None where it cannot be used."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    winner, times, problem = data.get("winner"), data.get("times_ms"), data.get("problem") or {}
    if not isinstance(winner, str) or not isinstance(times, dict) or not isinstance(problem, dict):
        return None
    if any(not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0
           for t in times.values()):
        return None
    if winner not in times or (finalists is not None and not set(times) <= set(finalists)):
        return None  # a winner that is not a finalist: tuned again, and the record overwritten
    return TuningRecord(winner, {str(k): float(v) for k, v in times.items()}, problem)


def finalist_reference(definition: Any, operands: Any, problem: Any) -> Any | None:
    """The op's float64 result of the first tuning operands, which every finalist must match
    before it is timed: a fast wrong kernel would otherwise win and be remembered. None where the
    op has no reference or the device cannot hold it; then the finalists are timed unchecked, and
    the log says so."""
    if definition.reference is None or definition.check is None:
        return None
    import torch

    try:
        return definition.reference(operands)
    except torch.OutOfMemoryError:
        log.warning("autotune: the float64 reference of %s does not fit on the device; its finalists are timed "
                    "unchecked", problem.describe())
        return None


def wrong_result(definition: Any, config: Any, operands: Any, expected: Any, launchers: Mapping[str, Any],
                 stream: int | None, device: Any) -> str | None:
    """How a finalist's result on `operands` misses `expected` (the op's comparison, as JSON), or None
    where it matches."""
    from .launch import run_checked

    _, comparison = run_checked(definition, config, operands, expected, launchers, stream, device)
    return None if comparison is None or comparison.passed else json.dumps(comparison.to_dict())
