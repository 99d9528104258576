"""A problem class's candidate kernels, prepared once to rank each problem of the class.

A problem's first sight asks every candidate kernel whether it takes the problem and scores those
that do. Asked one at a time in Python, that was most of the first sight: 2-4 ms for a GEMM class's
94 kernels on the CPU machine, where a GPU host's budget is 1 ms. An op tells the core two things
that let a ranking do less (`OpDefinition`):

- `support_key`: what of a config its support check reads. Configs of one key take or refuse any
  problem alike, so a ranking asks `supports` once per key (a GEMM class's 94 kernels have 25);
- `score_batch`: the configs' rule scores prepared once (GEMM's tile model as numpy columns), each
  problem's made in one pass; a score's terms are spelt out when read.

`CandidateSet` holds both for one tuple of candidates, the registry's for a class of problems
(`Registry.candidates` gives the same tuple for each problem of the class).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Protocol, Sequence

from .errors import UnsupportedError
from .op import OpDefinition, Score, get_op
from .ranking import Predictor
from .spec import KernelSpec


class Scores(Protocol):
    """The rule scores of a problem's accepted candidates, in the order they were asked for."""

    values: Sequence[float]  # each score's value: what the rules order by

    def score(self, j: int) -> Score:
        """The j-th score, with its terms (made when first asked for, then the same object)."""

    def rows(self, js: Sequence[int]) -> Sequence[Score]:
        """The scores at `js`, for a model's features. An op's may also give them as a table
        (`table(names)`: a float64 row a score, NaN where it has no such term) without making
        the Score objects, which the featurizer then reads (`heuristics.features`)."""


class ScoreBatch(Protocol):
    """An op's scoring of a candidate set's configs (`OpDefinition.score_batch`)."""

    def scores(self, rows: Sequence[int], problem: Any) -> Scores:
        """The scores of the configs at `rows` (indices into the set, each taking `problem`)."""


class ScoreList:
    """Scores made one by one: an op without a batch (`OpDefinition.rule_score` per config)."""

    __slots__ = ("made", "values")

    def __init__(self, made: Sequence[Score]) -> None:
        self.made = tuple(made)
        self.values = [s.value for s in self.made]

    def score(self, j: int) -> Score:
        return self.made[j]

    def rows(self, js: Sequence[int]) -> list[Score]:
        return [self.made[j] for j in js]


class _OneByOne:
    """The `ScoreBatch` of an op that gives none: `rule_score` on each config asked for."""

    def __init__(self, definition: OpDefinition, configs: Sequence[Any], arch: Any) -> None:
        self._rule_score, self._configs, self._arch = definition.rule_score, configs, arch

    def scores(self, rows: Sequence[int], problem: Any) -> Scores:
        configs, arch, rule_score = self._configs, self._arch, self._rule_score
        return ScoreList([rule_score(configs[i], problem, arch) for i in rows])


class CandidateSet:
    """One tuple of candidate specs (a registry's class), with what its rankings reuse: the
    groups of configs `supports` sees alike, which are the vendor's, and the op's score batch."""

    def __init__(self, definition: OpDefinition, specs: tuple[KernelSpec, ...], arch: Any) -> None:
        self.specs = specs
        configs = [spec.config for spec in specs]
        self.vendor = [definition.is_vendor(config) for config in configs]
        self._supports = definition.supports
        if definition.support_key is None:
            self._asked, self._group_of = configs, None
        else:
            groups: dict[Any, int] = {}
            self._group_of = [groups.setdefault(definition.support_key(c), len(groups)) for c in configs]
            firsts = {}
            for config, group in zip(configs, self._group_of):
                firsts.setdefault(group, config)
            self._asked = [firsts[g] for g in range(len(groups))]
        make = definition.score_batch
        self._batch: ScoreBatch = make(configs, arch) if make is not None else _OneByOne(definition, configs, arch)

    def refusals(self, problem: Any) -> list[str | None]:
        """Why each spec cannot run `problem` (None where it can), in the set's order."""
        supports = self._supports
        answers = [supports(config, problem) for config in self._asked]
        return answers if self._group_of is None else [answers[g] for g in self._group_of]

    def scores(self, rows: Sequence[int], problem: Any) -> Scores:
        """The rule scores of the specs at `rows`, each of which takes `problem`."""
        return self._batch.scores(rows, problem)


# The model never ranks a vendor the rules model more than this many times slower than their best
# candidate. The rules know cliffs no sweep has measured (cuDNN's 3-D depthwise backward-weight:
# 50.8 ms where a direct kernel runs in 85 us, `ops/conv/families/vendor.py`), and a model that never
# saw the class ranks the vendor as it would elsewhere. On every swept slice (conv's three
# directions, attention's two) any factor from 8 to 64 left every pick as it was
# (`benchmarks/results/h200/vendor_cliff_cut.txt`).
VENDOR_CLIFF = 16.0


def model_shortlist(ranked: list, is_vendor: Callable[[Any], bool], size: int | None,
                    score: Callable[[Any], float]) -> tuple[list, list]:
    """(the candidates a model ranks: the rules' best `size` (None: all) and the vendor's, the others)
    of `ranked`, in the rules' order; `evaluate` splits a sweep's rows by it too. The size is the
    op's (`OpDefinition.model_shortlist`). The rules prune, the model ranks what is left: a
    candidate the rules score 0 (as conv's gemm family gets where the GEMM op would run the product
    on its vendor library), and a vendor they model past VENDOR_CLIFF times their best's time
    (score = ideal time / modelled time), are among the others."""
    floor = max(map(score, ranked), default=0.0) / VENDOR_CLIFF

    def kept(i: int, c: Any) -> bool:
        if is_vendor(c):
            return score(c) >= floor
        return (size is None or i < size) and score(c) != 0.0

    listed = [kept(i, c) for i, c in enumerate(ranked)]
    return [c for c, k in zip(ranked, listed) if k], [c for c, k in zip(ranked, listed) if not k]


def model_order(model: Predictor, problem: Any, arch: Any, candidates: CandidateSet, rows: Sequence[int],
                scores: Scores, order: list[int]) -> tuple[list[int], list[float | None]]:
    """The rules' shortlist (their best few, as the op says, and the vendor's) by `model`'s cost, one
    batched prediction, then the other candidates in the rules' `order`: (that order of `scores`'
    rows, each one's cost, None past the shortlist). Equal costs keep the rules' order."""
    vendor, specs = candidates.vendor, candidates.specs
    shortlist, rest = model_shortlist(order, lambda j: vendor[rows[j]], get_op(problem.op).model_shortlist,
                                      lambda j: scores.values[j])
    if not shortlist:
        return list(rest), [None] * len(rest)
    costs = [float(c) for c in model.predict_cost(problem, [specs[rows[j]].config for j in shortlist], arch,
                                                  scores.rows(shortlist))]
    if len(costs) != len(shortlist) or not all(map(math.isfinite, costs)):
        raise UnsupportedError(f"the model {model.label} gave {len(costs)} costs (finite: "
                               f"{all(map(math.isfinite, costs))}) for {len(shortlist)} candidates of "
                               f"{problem.describe()}; a model gives one finite cost per candidate")
    by_cost = sorted(range(len(shortlist)), key=costs.__getitem__)
    return [shortlist[i] for i in by_cost] + rest, [costs[i] for i in by_cost] + [None] * len(rest)
