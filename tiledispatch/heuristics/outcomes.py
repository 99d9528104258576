"""What an evaluation reports: each strategy's pick on each problem, and the numbers over them.

An `Outcome` is one strategy's pick on one problem beside the oracle (the fastest OK row of the
problem); `summarize` turns a strategy's outcomes into the numbers docs/selection.md,
"Evaluation", lists; `efficiency_stats` is the part of them that training's cross-validation
reports too, so a manifest's CV scores and `tiledispatch evaluate` read alike.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..bench.table import SelectionKey, Status, problem_from_row
from ..core.errors import TiledispatchError

TOP1_TOLERANCE = 0.01  # a pick within 1 % of the oracle counts as a hit: sweeps repeat to about this
SLOW = 2.0  # the bound: no pick slower than twice the oracle
VENDOR_FLOOR = 0.98  # the bound against the vendor library: none below 0.98x
WORST = 10  # problems listed per strategy, worst first


@dataclass(frozen=True)
class Outcome:
    """One strategy's pick on one problem."""

    problem_id: str
    problem: str  # canonical JSON
    kernel: str
    status: Status
    pick_ms: float | None
    oracle_ms: float
    oracle_kernel: str
    vendor_ms: float | None  # the vendor baseline's time, where it ran
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.status is not Status.OK

    @property
    def efficiency(self) -> float:
        return 0.0 if self.failed else self.oracle_ms / self.pick_ms

    @property
    def vs_vendor(self) -> float | None:
        """vendor time / pick time (above 1: faster than the library); 0 for a failed pick."""
        return None if self.vendor_ms is None else 0.0 if self.failed else self.vendor_ms / self.pick_ms

    def to_dict(self, op: str) -> dict[str, Any]:
        return {"problem_id": self.problem_id, "problem": _described(op, self.problem),
                "pick": self.kernel, "status": self.status.value, "pick_ms": self.pick_ms,
                "oracle": self.oracle_kernel, "oracle_ms": self.oracle_ms, "efficiency": round(self.efficiency, 6),
                **({"error": self.error[:300]} if self.error else {})}


def _described(op: str, problem_json: str) -> Any:
    """The problem's `describe()`; its JSON as the table holds it where this version cannot read it."""
    try:
        return problem_from_row(op, problem_json).describe()
    except (ValueError, TypeError, KeyError, TiledispatchError):
        return problem_json


def p10(values: Sequence[float]) -> float:
    """The 10th percentile by nearest rank: the least value that at least a tenth of `values` do
    not exceed (sorted, index ceil(n / 10) - 1), so no more than a tenth lie below it."""
    return sorted(values)[max(math.ceil(len(values) / 10) - 1, 0)]


def is_hit(pick_ms: float, oracle_ms: float) -> bool:
    """A pick within TOP1_TOLERANCE of the oracle."""
    return pick_ms <= oracle_ms * (1 + TOP1_TOLERANCE)


def efficiency_stats(efficiency: Sequence[float]) -> dict[str, float]:
    """Mean, median, P10 and minimum of per-problem efficiencies (oracle time / pick time)."""
    return {"mean": statistics.fmean(efficiency), "median": statistics.median(efficiency), "p10": p10(efficiency),
            "min": min(efficiency)}


def summarize(outcomes: Sequence[Outcome], op: str, worst: int = WORST) -> dict[str, Any]:
    """A strategy's numbers over its outcomes (see docs/selection.md, "Evaluation")."""
    if not outcomes:
        return {"problems": 0}
    ran = [o for o in outcomes if not o.failed]
    lost, oracle_sum = sum(o.pick_ms - o.oracle_ms for o in ran), sum(o.oracle_ms for o in ran)
    ratios = [r for r in (o.vs_vendor for o in outcomes) if r is not None]
    wins = [math.log(r) for r in ratios if r > 0]
    vendor = {"problems": len(ratios), "geomean": math.exp(statistics.fmean(wins)) if wins else None,
              "min": min(ratios) if ratios else None, "below_floor": sum(r < VENDOR_FLOOR for r in ratios)}
    slow = sum(o.pick_ms > SLOW * o.oracle_ms for o in ran)
    stats = {
        "problems": len(outcomes), "failures": len(outcomes) - len(ran),
        "efficiency": efficiency_stats([o.efficiency for o in outcomes]),
        "top1": sum(is_hit(o.pick_ms, o.oracle_ms) for o in ran) / len(outcomes),
        "slower_than_2x": slow, "time_lost_ms": lost,
        "time_lost_fraction": lost / oracle_sum if oracle_sum > 0 else 0.0, "vs_vendor": vendor}
    stats["targets"] = {
        "mean_ge_0.97": stats["efficiency"]["mean"] >= 0.97,
        "p10_ge_0.90": stats["efficiency"]["p10"] >= 0.90,
        "none_slower_than_2x": slow == 0 and not stats["failures"],
        "vendor_geomean_ge_1": vendor["geomean"] is not None and vendor["geomean"] >= 1.0,
        "none_below_0.98x_vendor": vendor["problems"] > 0 and vendor["below_floor"] == 0}
    ranked = sorted(outcomes, key=lambda o: (o.efficiency, o.problem_id))
    stats["worst"] = [o.to_dict(op) for o in ranked[:worst]]
    stats["failed"] = [o.to_dict(op) for o in outcomes if o.failed]
    return stats


@dataclass(frozen=True)
class KeyReport:
    """One SelectionKey's evaluation: each strategy's outcomes, and what was left out and why.
    Strategies are keyed by `evaluate.Picker`."""

    key: SelectionKey
    outcomes: Mapping[Any, tuple[Outcome, ...]]
    without_oracle: tuple[str, ...] = ()  # problems none of whose rows is OK: no oracle to compare with
    skipped: Mapping[Any, str] = field(default_factory=dict)  # strategies not judged, and why
    model: Mapping[str, Any] | list | None = None  # the model's manifest, summarised (one per fold)
    unseen: str | None = None  # how we know the model never saw these problems

    def to_dict(self, worst: int = WORST) -> dict[str, Any]:
        return {"key": asdict(self.key), "name": self.key.name,
                "problems": len({o.problem_id for outs in self.outcomes.values() for o in outs}),
                "without_oracle": len(self.without_oracle), "model": self.model, "unseen": self.unseen,
                "strategies": {p.value: summarize(outs, self.key.op, worst) for p, outs in self.outcomes.items()},
                "skipped": {p.value: why for p, why in self.skipped.items()}}


@dataclass(frozen=True)
class Report:
    """Every SelectionKey's evaluation, in key order."""

    keys: tuple[KeyReport, ...]
    holdout: Mapping[str, Any]

    def __getitem__(self, key: SelectionKey) -> KeyReport:
        found = next((report for report in self.keys if report.key == key), None)
        if found is None:
            raise KeyError(f"no evaluation of {key!r}; this report's keys: {[r.key for r in self.keys]}")
        return found

    def to_dict(self, worst: int = WORST) -> dict[str, Any]:
        return {"holdout": dict(self.holdout), "keys": [k.to_dict(worst) for k in self.keys]}


def merge(reports: Sequence[Report], holdout: Mapping[str, Any]) -> Report:
    """Reports of disjoint problems (one per fold) as one: the outcomes of each key and strategy
    joined. A strategy left out of some folds only is judged on the others' problems, and
    `skipped` says which folds lacked it and why."""
    by_key: dict[SelectionKey, list[KeyReport]] = {}
    for report in reports:
        for part in report.keys:
            by_key.setdefault(part.key, []).append(part)
    merged = []
    for key in sorted(by_key):
        parts = by_key[key]
        pickers = dict.fromkeys(p for part in parts for p in part.outcomes)
        outcomes = {p: sum((part.outcomes.get(p, ()) for part in parts), ()) for p in pickers}
        skipped: dict[Any, list[str]] = {}
        for part in parts:
            for p, why in part.skipped.items():
                skipped.setdefault(p, []).append(why)
        reasons = {p: "; ".join(dict.fromkeys(whys)) for p, whys in skipped.items()}
        reasons = {p: (f"in {len(skipped[p])} of {len(parts)} parts: {why}" if p in outcomes else why)
                   for p, why in reasons.items()}
        unseen = sorted({part.unseen for part in parts if part.unseen})
        merged.append(KeyReport(key, outcomes, sum((p.without_oracle for p in parts), ()), reasons,
                                parts[0].model if len(parts) == 1 else [p.model for p in parts],
                                ", ".join(unseen) or None))
    return Report(tuple(merged), holdout)
