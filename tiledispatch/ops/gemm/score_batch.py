"""GEMM's `score_batch`: a candidate set's rule scores (`ranking.rule_score`), a problem's at once.

The tile families' configs (all but gemv's, the vendor's and stream-K's: a few a class) are
scored together by `tile_batch`; realign's copies and the host's launches, which `rule_score`
adds to a device score, follow as columns too. The others keep `rule_score`, one call each. A
score's terms are spelt out when read (`GemmScores.score`): a ranking reads those of its pick
and of a model's shortlist, not the 80 others'.
"""

from __future__ import annotations

import functools
from collections import abc
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...core.candidate_set import ScoreList
from ...core.memo import LruTable
from ...core.op import Score
from . import ranking
from .config import AnyGemmConfig, GemmConfig
from .families import realign
from .family import FAMILIES
from .problem import GemmProblem
from .tile_batch import Occupancies, TileColumns, power_of, tile_terms

# Below this many FLOPs every integer the tile model forms (tiles, bytes a program, split-K's partial
# sums) stays under 2**53, where int64 columns hold and convert it as Python's ints do; a larger
# problem (a 200k-cubed GEMM) is scored config by config.
EXACT_FLOPS = 2**53
# Kept a set: the subsets of its tile configs that take its problems (`_Taking`; a class's take a
# few), and for each what its rows read of a problem beyond its sizes (`_Variant`), by (layout,
# unaligned operands): a class's problems have a handful.
TAKINGS_KEPT = 16
VARIANTS_KEPT = 16


def _names(persistent: bool, realigned: bool) -> tuple[str, ...]:
    """A tile config's terms as `rule_score` spells them, in its order."""
    return (("tile_m", "tile_n", "tile_k") + (("depth", "overlap") if persistent else ())
            + ("waves", "feed", "latency", "resident", "concurrent", "row", "in_flight", "compute_us", "memory_us",
               "chain_us", "reduce_us", "spills", "modelled_us") + (("realign_us",) if realigned else ())
            + ("device_score", "host_us", "call_us"))


# The columns of `GemmScores`' table: every term, the score's value (`features.score_values`), and a
# last one of NaN, which a name no tile config's score has reads.
_COLUMNS = _names(True, True) + ("value",)
_POSITION = {name: i for i, name in enumerate(_COLUMNS)}
_NOWHERE = len(_COLUMNS)


@functools.cache
def _kind(persistent: bool, realigned: bool) -> tuple[tuple[str, ...], np.ndarray]:
    """(its terms' names, which of the table's columns its score has) of a tile config: one of four,
    shared by every config of a set."""
    names = _names(persistent, realigned)
    return names, np.array([name in names or name == "value" for name in _COLUMNS] + [False], dtype=bool)


@dataclass(frozen=True)
class _Variant:
    """What the tile rows' scores read of a problem beyond its sizes: each config's occupancy (its
    operands loaded as vectors or not), its layout penalty and its call's host seconds."""

    occupancy: Occupancies
    penalty: np.ndarray
    host_s: np.ndarray

    def take(self, index: np.ndarray) -> "_Variant":
        return _Variant(self.occupancy.take(index), self.penalty.take(index), self.host_s.take(index))


class _Taking:
    """Tile configs of a set, as columns: the set's whole, or those that take a problem, which a
    class's problems share a few of (realign's configs taken or not, split-K's), each taken once
    from the whole (`take`)."""

    def __init__(self, columns: TileColumns, configs: Sequence[GemmConfig], kinds: Sequence[tuple], arch: Any,
                 whole: tuple["_Taking", np.ndarray] | None = None) -> None:
        self.columns, self.configs, self.kinds, self._arch = columns, configs, kinds, arch  # kinds: `_kind`s
        self.realign = np.array([c.realign for c in configs], dtype=bool)
        self.present = np.array([kind[1] for kind in kinds], dtype=bool).reshape(len(kinds), len(_COLUMNS) + 1)
        self._whole = whole  # (the set's whole, the rows of it these are)
        self._variants = LruTable(VARIANTS_KEPT)
        self._present: dict[tuple[str, ...], tuple[list[int], np.ndarray]] = {}  # see present_of

    @classmethod
    def of(cls, configs: Sequence[GemmConfig], kernels: Sequence[Any], arch: Any) -> "_Taking":
        """A set's tile configs, each of its `_kind`."""
        return cls(TileColumns.of(configs, kernels, arch), configs,
                   [_kind(k.persistent, c.realign) for c, k in zip(configs, kernels)], arch)

    def take(self, index: np.ndarray) -> "_Taking":
        rows = index.tolist()
        return _Taking(self.columns.take(index), [self.configs[i] for i in rows], [self.kinds[i] for i in rows],
                       self._arch, (self, index))

    def present_of(self, names: tuple[str, ...]) -> tuple[list[int], np.ndarray]:
        """(each name's column in the table, which configs' scores have it, a row a config): a model
        reads the same names for every problem of a set. Replaced whole where two threads make it."""
        made = self._present.get(names)
        if made is None:
            positions = [_POSITION.get(name, _NOWHERE) for name in names]
            made = self._present[names] = (positions, self.present[:, positions])
        return made

    def variant(self, p: GemmProblem) -> _Variant:
        return self._variants.get_or_make((p.layout, p.alignment.unaligned_operands), lambda: self._made_variant(p))

    def _made_variant(self, p: GemmProblem) -> _Variant:
        """Realign configs load vectors (from their copies) whatever the problem's operands."""
        if self._whole is not None:
            whole, index = self._whole
            return whole.variant(p).take(index)
        c, arch = self.columns, self._arch
        occupancy = c.vectors if p.alignment.a and p.alignment.b else c.vectors.where(self.realign, c.elements)
        return _Variant(occupancy, np.array([ranking.layout_penalty(config, p) for config in self.configs]),
                        np.array([ranking.host_seconds(config, p, arch) for config in self.configs]))


class GemmScores:
    """One problem's scores of the configs asked for (`core.candidate_set.Scores`): the tile
    configs' as their terms' columns, a `Score` made of a config's row when read; the others' made
    already."""

    __slots__ = ("values", "_made", "_at", "_terms", "_taking")

    def __init__(self, values: list[float], made: dict[int, Score], at: list[int], terms: dict[str, np.ndarray],
                 taking: _Taking) -> None:
        self.values, self._made, self._at, self._terms, self._taking = values, made, at, terms, taking

    def score(self, j: int) -> Score:
        made = self._made.get(j)
        if made is None:
            at, terms = self._at[j], self._terms
            names = self._taking.kinds[at][0]
            made = self._made.setdefault(j, Score(self.values[j], {name: float(terms[name][at]) for name in names}))
        return made

    def rows(self, js: Sequence[int]) -> "ScoreRows":
        return ScoreRows(self, js)

    def table(self, js: Sequence[int], names: Sequence[str]) -> np.ndarray:
        """The scores at `js` by `names` (their values and terms, NaN where one has none), read from
        the terms' columns at those rows alone: a model reads a shortlist of a problem's 80 scores,
        and no Score is made."""
        at = np.array([self._at[j] for j in js], dtype=np.intp)
        taking = self._taking
        if not len(taking.configs):  # no tile config takes the problem
            out = np.full((len(js), len(names)), np.nan)
        else:  # the rows of configs scored alone (at -1) are written below
            positions, present = taking.present_of(tuple(names))
            terms = self._terms
            columns = [np.full(len(at), np.nan) if position == _NOWHERE else terms[name][at]
                       for name, position in zip(names, positions)]
            out = np.where(present[at], np.column_stack(columns), np.nan)
        for r in np.flatnonzero(at < 0).tolist():
            score = self._made[js[r]]
            out[r] = [score.value if name == "value" else score.terms.get(name, np.nan) for name in names]
        return out


class ScoreRows(abc.Sequence):
    """Some of a problem's scores, as the `Score`s a model reads (`Predictor.predict_cost`), which
    `table` gives without making them (the model's featurizer asks it)."""

    __slots__ = ("_scores", "_js")

    def __init__(self, scores: GemmScores, js: Sequence[int]) -> None:
        self._scores, self._js = scores, js

    def __len__(self) -> int:
        return len(self._js)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._scores.score(j) for j in self._js[i]]
        return self._scores.score(self._js[i])

    def table(self, names: Sequence[str]) -> np.ndarray:
        return self._scores.table(self._js, names)


class GemmScoreBatch:
    """The scores of one candidate set's configs on `arch` (`core.candidate_set.ScoreBatch`)."""

    def __init__(self, configs: Sequence[AnyGemmConfig], arch: Any) -> None:
        self._configs, self._arch = tuple(configs), arch
        kernels = [FAMILIES.of(c).tile_kernel for c in self._configs]
        self._kernels = [k if k is not None and not k.deals else None for k in kernels]
        tiles = [i for i, k in enumerate(self._kernels) if k is not None]
        self._tile = np.full(len(self._configs), -1, dtype=np.intp)  # each config's row among the tile configs
        self._tile[tiles] = np.arange(len(tiles))  # (-1: scored alone)
        self._whole = _Taking.of([self._configs[i] for i in tiles], [self._kernels[i] for i in tiles], arch)
        self._takings = LruTable(TAKINGS_KEPT)

    def _taking(self, tile_rows: np.ndarray) -> _Taking:
        if len(tile_rows) == len(self._whole.configs):
            return self._whole
        return self._takings.get_or_make(tile_rows.tobytes(), lambda: self._whole.take(tile_rows))

    def scores(self, rows: Sequence[int], p: GemmProblem) -> GemmScores | ScoreList:
        """`rule_score` of each config at `rows`, which take `p`. The asked configs are sorted into
        tile rows and those scored alone as arrays: a loop over a class's 80 costs as much as a few
        of the tile model's columns."""
        arch = self._arch
        if p.flops() >= EXACT_FLOPS:
            return ScoreList([ranking.rule_score(self._configs[i], p, arch) for i in rows])
        asked = self._tile[np.asarray(rows, dtype=np.intp)]
        tiled = asked >= 0
        tile_rows = asked[tiled]
        taking = self._taking(tile_rows)
        variant = taking.variant(p)
        terms = tile_terms(taking.columns, variant.occupancy, variant.penalty, p, arch)
        modelled_us, device = terms["modelled"] * 1e6, terms["device_score"]
        ideal, copies_s = ranking.problem_ideal_seconds(p, arch), realign.copy_seconds(p, arch)
        terms["realign_us"] = np.full(len(tile_rows), copies_s * 1e6)  # read by realign configs alone
        if taking.realign.any():
            realigned, realigned_us = _realigned(terms["modelled"], copies_s, ideal)
            device = np.where(taking.realign, realigned, device)
            modelled_us = np.where(taking.realign, realigned_us, modelled_us)
        tile_values, call_s = _call_value(device, modelled_us, variant.host_s)
        terms.update(modelled_us=modelled_us, device_score=device, host_us=variant.host_s * 1e6, call_us=call_s * 1e6,
                     value=tile_values)
        values = np.empty(len(tiled))
        values[tiled] = tile_values
        made = {}
        for j in np.flatnonzero(~tiled).tolist():
            made[j] = score = ranking.rule_score(self._configs[rows[j]], p, arch)
            values[j] = score.value
        at = np.where(tiled, np.cumsum(tiled) - 1, -1).tolist()  # each asked config's row in `taking` (-1: alone)
        return GemmScores(values.tolist(), made, at, terms, taking)


def _realigned(modelled: np.ndarray, copies_s: float, ideal: float) -> tuple[np.ndarray, np.ndarray]:
    """(device score, modelled us) of `realign.variant`'s configs: the twin's time on the copies,
    then the copies."""
    modelled_s = modelled * 1e6 * 1e-6 + copies_s
    return ideal / modelled_s, modelled_s * 1e6


def _call_value(device: np.ndarray, modelled_us: np.ndarray, host_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`rule_score`'s value, the call's seconds) from the device score, its modelled time and the
    host's: the longer of the two, smoothed."""
    device_s, exponent = modelled_us * 1e-6, ranking.HOST_EXPONENT
    call_s = power_of(power_of(device_s, exponent) + power_of(host_s, exponent), 1 / exponent)
    return device * device_s / call_s, call_s
