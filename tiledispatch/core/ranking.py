"""What a ranking holds (candidates, refusals, an explanation), and the learned models it may ask.

The `model` strategy orders the candidates the rules accept by a learned model's costs (a
ranker's negated scores, comparable within one problem only). The models live above the core
(`tiledispatch.heuristics.learned`: LightGBM, features, the files shipped per arch), which
registers a `ModelSource` here (`set_model_source`), as the autotune policy registers itself
in `core.tuning`: the core never imports the heuristics.
"""

from __future__ import annotations

import array
import functools
import operator
import threading
from collections import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence

from .op import Score
from .spec import KernelSpec

if TYPE_CHECKING:
    from .dispatcher import Strategy


@dataclass(frozen=True, slots=True)  # an explanation holds one per kernel of the registry
class Candidate:
    spec: KernelSpec
    refused: str | None = None  # why it cannot run the problem; None if it can
    score: Score | None = None
    model_cost: float | None = None  # the `model` strategy's cost (lower ranks first), where a model ranked it

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kernel": self.spec.name}
        if self.refused is not None:
            out["refused"] = self.refused
        if self.model_cost is not None:
            out["model_cost"] = float(f"{self.model_cost:.6g}")
        if self.score is not None:
            out["score"] = round(self.score.value, 6)
            out["terms"] = {k: round(v, 4) for k, v in self.score.terms.items()}
        return out


class Accepted(abc.Sequence):
    """A ranking's accepted candidates, best first, each made a `Candidate` when first read.

    A problem's first sight reads one or a few of them (the pick, the vendor's beside it); making
    all of them, each score's terms spelt out, took as long as scoring them. Position `i` holds
    the spec at `rows[order[i]]` of `specs`, the score `scores.score(order[i])` (None without
    scores) and `costs[i]` (None without a model). Threads reading one position get one object.
    """

    __slots__ = ("_specs", "_rows", "_scores", "_order", "_costs", "_made")

    def __init__(self, specs: Sequence[KernelSpec], rows: Sequence[int], scores: Any = None,
                 order: Sequence[int] | None = None, costs: Sequence[float | None] | None = None) -> None:
        self._specs, self._rows, self._scores, self._costs = specs, rows, scores, costs
        self._order = order if order is not None else range(len(rows))
        self._made: dict[int, Candidate] = {}

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        index = operator.index(index)
        if index < 0:
            index += len(self)
        made = self._made.get(index)
        if made is None:
            j = self._order[index]  # an IndexError past the end, as a tuple's
            score = None if self._scores is None else self._scores.score(j)
            cost = None if self._costs is None else self._costs[index]
            made = self._made.setdefault(index, Candidate(self._specs[self._rows[j]], None, score, cost))
        return made

    def __iter__(self) -> Iterator[Candidate]:
        return (self[i] for i in range(len(self)))

    def within(self, refusals: Sequence[str | None]) -> "Accepted":
        """These candidates that another problem accepts too (`refusals`: its reason, or None, for
        each spec), in this order, with their scores and costs: the other's ranking where this
        one's problem stands in for it (`OpDefinition.ranking_problem`)."""
        rows, order = self._rows, self._order
        keep = [i for i, j in enumerate(order) if refusals[rows[j]] is None]
        costs = None if self._costs is None else [self._costs[i] for i in keep]
        return Accepted(self._specs, rows, self._scores, [order[i] for i in keep], costs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Accepted, tuple)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # equal to a tuple of its candidates, but not a tuple: not a key

    def __repr__(self) -> str:
        return repr(tuple(self))


@dataclass(frozen=True)
class Ranking:
    """One problem's ranking: the accepted candidates, best first, and the refusals, compactly.

    A problem refuses nearly every kernel of the registry (other dtypes, layouts,
    epilogues), with a few dozen distinct reasons: those are kept once each, and each
    kernel's by its index in `reasons` (0, whose reason is None, where it was accepted).
    """

    accepted: Sequence[Candidate]  # a tuple, or `Accepted`, which makes each when read
    specs: tuple[KernelSpec, ...]  # the op's kernels, in registry order (shared, not copied)
    reasons: tuple[str | None, ...]
    reason_ids: array.array
    model: str | None = None  # the learned model that ordered `accepted`; None: the rules did
    ranked_as: Any = None  # the problem whose ranking this one's follows (`OpDefinition.ranking_problem`)

    def refused(self) -> tuple[Candidate, ...]:
        """The refused candidates with their reasons, in registry order."""
        specs, reasons = self.specs, self.reasons
        return tuple(Candidate(specs[i], reasons[r]) for i, r in enumerate(self.reason_ids) if r)

    def rules_first(self, keep: Callable[[Candidate], bool]) -> Candidate | None:
        """The accepted candidate the rules alone rank first among those `keep` takes (the highest
        rule score, ties in registry order, as a rules ranking sorts them), whoever ordered
        `accepted`; None where `keep` takes none. A dispatcher whose registry holds only the kept
        kernels would rank it first: one ranking answers for both."""
        if self.model is None:  # the rules' order: the first kept (the rest need not be made)
            return next((c for c in self.accepted if keep(c)), None)
        kept = [c for c in self.accepted if keep(c)]
        if not kept:
            return None
        position = {spec.name: i for i, spec in enumerate(self.specs)}
        return max(kept, key=lambda c: (c.score.value, -position[c.spec.name]))


@dataclass(frozen=True)
class Explanation:
    problem: Any
    arch: str
    strategy: Strategy
    selected: KernelSpec | None
    ranked: Sequence[Candidate]  # the accepted candidates, in the ranking's order (rules' or model's)
    refusals: Ranking = field(repr=False)  # `refused`, compactly
    tuned_ms: Mapping[str, float] | None = None  # autotune: the finalists' measured times, if tuned

    @functools.cached_property
    def refused(self) -> tuple[Candidate, ...]:
        """The refused candidates with their reasons, in registry order: spelled out when read,
        since a caller after the ranking alone (gemm's graph replays' pick) need not pay an
        object per kernel of the registry."""
        return self.refusals.refused()

    @property
    def model(self) -> str | None:
        """The learned model that ordered the candidates, or None where the rules did."""
        return self.refusals.model

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        refused = self.refused if limit is None else self.refused[:limit]
        return {
            "problem": self.problem.describe(),
            "arch": self.arch,
            "strategy": self.strategy.value,
            **({"model": self.model} if self.model is not None else {}),
            **({"ranked_as": self.refusals.ranked_as.describe()} if self.refusals.ranked_as is not None else {}),
            "selected": self.selected.name if self.selected else None,
            "accepted": len(self.ranked),
            "refused_count": len(self.refused),
            "ranking": [c.to_dict() for c in (self.ranked if limit is None else self.ranked[:limit])],
            "refused": [c.to_dict() for c in refused],
            **({"tuned_ms": dict(self.tuned_ms)} if self.tuned_ms is not None else {}),
        }


class Predictor(Protocol):
    """One learned model: a cost of each config on a problem, lower ranking first."""

    @property
    def label(self) -> str:
        """What `explain` names the model by (its slice, arch and training data)."""

    def predict_cost(self, problem: Any, configs: Sequence[Any], arch: Any,
                     scores: Sequence[Score] | None = None) -> Sequence[float]:
        """One cost per config, in order (a ranker's negated score: comparable within the problem
        only); `scores` are the configs' rule scores where the caller has them (the model reads
        them as features), computed otherwise."""


class ModelSource(Protocol):
    """Where the `model` strategy finds a model for a problem (`heuristics.learned`)."""

    def model_for(self, problem: Any, arch: Any) -> Predictor | None:
        """The model of the problem's slice on `arch`, or None where none covers the problem (no
        model of its slice, or one that never saw a layout, dtype or epilogue of it): the rules
        rank it then."""

    def ships(self, arch: Any) -> bool:
        """Whether any model exists for `arch`: the default strategy there is `model`."""


_SOURCE: list[ModelSource] = []
_SOURCE_LOCK = threading.Lock()


def set_model_source(source: ModelSource) -> None:
    """Makes `source` the one the `model` strategy asks by default (the last set stands)."""
    with _SOURCE_LOCK:
        _SOURCE[:] = [source]


def model_source() -> ModelSource | None:
    """The source set (importing `tiledispatch.heuristics.learned` sets the shipped models'), or None."""
    return _SOURCE[0] if _SOURCE else None
