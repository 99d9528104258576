"""Which kernels a sweep times on a problem: the candidate policy (all, or the rules' best few and a
seeded sample; by family and name), and the rows it plans for each problem."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..core.errors import InvalidArgumentError
from ..core.spec import KernelSpec
from .table import problem_id


@dataclass(frozen=True)
class CandidatePolicy:
    """Which accepted candidates of a problem a sweep times: all (`top` None), or the rules' best
    `top` plus `sample` others drawn at random (seeded per problem, so a rerun draws the same),
    among the kernels of `families` (default: every family) whose names `match` a regular
    expression (default: any). The vendor kernel is always timed; refusals become UNSUPPORTED rows
    with `record_refused` only (they are most of a registry, and say nothing of speed)."""

    top: int | None = None
    sample: int = 0
    seed: int = 0
    record_refused: bool = False
    families: tuple[str, ...] = ()
    match: str | None = None

    def keeps(self, spec: KernelSpec) -> bool:
        """Whether the family and name filters let this kernel through."""
        if self.families and spec.definition.family_of(spec.config) not in self.families:
            return False
        return self.match is None or re.search(self.match, spec.name) is not None

    def __post_init__(self) -> None:
        if self.match is not None:
            try:
                re.compile(self.match)
            except re.error as e:
                raise InvalidArgumentError(f"match={self.match!r} is not a regular expression ({e})") from None
        if self.top is not None and (isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 1):
            raise InvalidArgumentError(f"CandidatePolicy.top={self.top!r} must be a positive integer, or None for all")
        if isinstance(self.sample, bool) or not isinstance(self.sample, int) or self.sample < 0:
            raise InvalidArgumentError(f"CandidatePolicy.sample={self.sample!r} must be an integer >= 0")

    def choose(self, ranked: Sequence[Any], pid: str) -> list[int]:
        """Indices into `ranked` (best first) to time."""
        if self.top is None:
            return list(range(len(ranked)))
        chosen = list(range(min(self.top, len(ranked))))
        rest = list(range(len(chosen), len(ranked)))
        draw = random.Random(f"{self.seed}:{pid}")
        return chosen + sorted(draw.sample(rest, min(self.sample, len(rest))))


@dataclass(frozen=True)
class Planned:
    """One (problem, kernel) row to come: what the rules said of it before it runs."""

    spec: KernelSpec
    rule_score: float | None
    rule_rank: int | None
    vendor: bool
    refused: str | None = None


def planned(dispatcher, problem, policy: CandidatePolicy) -> list[Planned]:
    """The rows a problem gets: the policy's choice of the accepted candidates (the vendor always
    among them), then the refusals where the policy records them."""
    explanation = dispatcher.explain(problem)
    ranked, refused = explanation.ranked, explanation.refused if policy.record_refused else ()
    vendors = [i for i, c in enumerate(ranked) if c.spec.is_vendor]
    kept = [i for i, c in enumerate(ranked) if policy.keeps(c.spec)]  # rule_rank stays the whole ranking's
    chosen = sorted({kept[j] for j in policy.choose([ranked[i] for i in kept], problem_id(problem))} | set(vendors))
    rows = [Planned(ranked[i].spec, ranked[i].score.value, i, i in vendors) for i in chosen]
    return rows + [Planned(c.spec, None, None, c.spec.is_vendor, c.refused) for c in refused]


def check_families(op: str, families: Sequence[str]) -> None:
    """Refuses a family name the op does not have (a typo would sweep the vendor alone), naming its own."""
    import importlib

    known = [f.value for f in importlib.import_module(f"..ops.{op}", __package__).Family]
    unknown = [f for f in families if f not in known]
    if unknown:
        raise InvalidArgumentError(f"families={unknown}: {op} has no such kernel family; its families are "
                                   f"{', '.join(known)}")
