"""Numeric feature rows of (problem, config, arch) for the learned ranking, the same for every op.

A problem and a config are frozen dataclasses: their fields, flattened (`flatten`), are the
features, so no op needs code here. Numbers and booleans are numeric columns, enum values and
strings categorical ones (their vocabulary fixed at training), tuples one column per index. A
problem's integer fields (its sizes) are taken as log2(1 + size). Beside them: the problem's
log2 FLOPs, bytes and arithmetic intensity; the op's rule score and every term of it (tile
waste, waves, occupancy, modelled times: the analytic model's own estimate, which the learned
model corrects); the kernel's family; and the arch's numeric facts (SM count, L2, bandwidth,
clocks, calibration), which tell the slices of two GPUs apart.

A `FeatureSpec` fixes the columns, their order and the vocabularies, and is saved as JSON
beside the model, so prediction builds the very matrix training saw: a path the spec does not
name is ignored, one it names but a value lacks is missing (NaN), and so is an unknown category
(`Featurizer.unknown_categories` names a problem's: a model's source leaves such a problem to
the rules, since the model never learned from one like it).
`Featurizer.matrix` builds one problem's rows for N configs straight into numpy, each config's
columns computed once per process (configs are few and hashable), so ranking a new problem
costs its rule scores, one row fill per candidate and one prediction.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import re
from collections.abc import Mapping
from typing import Any, Iterable, Sequence

import numpy as np

from ..core.errors import TiledispatchError
from ..core.op import Score, get_op

FORMAT = 1


class ModelFormatError(TiledispatchError, ValueError):
    """A learned model's file (model text, feature spec, manifest) that cannot be used as it is."""


class Source(enum.Enum):
    """What a column is read from."""

    PROBLEM = "problem"  # a field of the problem
    CONFIG = "config"  # a field of the kernel's config
    KERNEL = "kernel"  # what the op says of the config (its family)
    DERIVED = "derived"  # log2 FLOPs, bytes and intensity of the problem
    SCORE = "score"  # the rules' score of (config, problem, arch): its value and terms
    ARCH = "arch"  # a numeric fact of the arch


class Kind(enum.Enum):
    NUMBER = "number"
    CATEGORY = "category"  # the value's index in the column's vocabulary; missing when not in it


class Transform(enum.Enum):
    NONE = "none"
    LOG2 = "log2"  # log2(1 + v): sizes, whose ratios matter more than their differences


@dataclasses.dataclass(frozen=True)
class Column:
    source: Source
    path: str  # the flattened field: "m", "types.a", "tile_m", "padding.1"
    kind: Kind = Kind.NUMBER
    transform: Transform = Transform.NONE
    vocabulary: tuple[str, ...] = ()  # a categorical column's values, in code order

    def __post_init__(self) -> None:
        object.__setattr__(self, "_codes", {v: i for i, v in enumerate(self.vocabulary)})

    @property
    def name(self) -> str:
        return f"{self.source.value}.{self.path}"

    def encode(self, value: Any) -> float:
        """The column's number for a raw value: NaN where it is missing or unknown."""
        if self.kind is Kind.CATEGORY:
            if value is None:
                return math.nan
            code = self._codes.get(str(value))
            return math.nan if code is None else float(code)
        if value is None or isinstance(value, str):
            return math.nan
        number = float(value)
        if self.transform is Transform.LOG2:
            return math.log2(1.0 + number) if number >= 0 else math.nan
        return number


def flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, scalar) for every leaf of a dataclass of dataclasses, enums, tuples, mappings and
    scalars, as `core.serialize.to_jsonable` would spell it; sets are skipped (no order)."""
    leaves: list[tuple[str, Any]] = []
    _flatten_into(obj, prefix, leaves)
    return leaves


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass's field names: read for every new problem


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _flatten_into(obj: Any, prefix: str, leaves: list) -> None:
    if isinstance(obj, enum.Enum):  # before the scalars: a str or int enum spells its value
        leaves.append((prefix[:-1], obj.value))
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        leaves.append((prefix[:-1], obj))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for name in _field_names(type(obj)):
            _flatten_into(getattr(obj, name), f"{prefix}{name}.", leaves)
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            _flatten_into(value, f"{prefix}{key.value if isinstance(key, enum.Enum) else key}.", leaves)
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            _flatten_into(value, f"{prefix}{i}.", leaves)


def problem_values(problem: Any) -> dict[str, Any]:
    return dict(flatten(problem))


def config_values(config: Any) -> dict[str, Any]:
    return dict(flatten(config))


def kernel_values(op: str, config: Any) -> dict[str, Any]:
    return {"family": get_op(op).family_of(config)}


def derived_values(problem: Any) -> dict[str, Any]:
    flops, moved = float(problem.flops()), float(problem.bytes())
    return {"log2_flops": math.log2(1.0 + flops), "log2_bytes": math.log2(1.0 + moved),
            "log2_intensity": math.log2((1.0 + flops) / (1.0 + moved))}


def score_values(score: Score) -> dict[str, Any]:
    return {"value": score.value, **score.terms}


def arch_values(arch: Any) -> dict[str, Any]:
    """The arch's numbers (strings and text are no facts a model can read)."""
    return {path: value for path, value in flatten(arch)
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


# Config rows kept: a registry's configs are a few thousand objects, each kept for the process;
# a caller that rebuilds its configs each call clears the table when it fills.
CONFIGS_KEPT = 1 << 16
_LIGHTGBM_NAME = re.compile(r"[^0-9A-Za-z_]")


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """The columns of one model's matrix, in order; saved as JSON beside the model."""

    op: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        """The columns' names as LightGBM keeps them (letters, digits and '_')."""
        return [_LIGHTGBM_NAME.sub("_", c.name) for c in self.columns]

    @property
    def categorical(self) -> list[int]:
        return [i for i, c in enumerate(self.columns) if c.kind is Kind.CATEGORY]

    def to_dict(self) -> dict[str, Any]:
        def column(c: Column) -> dict[str, Any]:
            out = {"source": c.source.value, "path": c.path, "kind": c.kind.value, "transform": c.transform.value}
            return {**out, "vocabulary": list(c.vocabulary)} if c.kind is Kind.CATEGORY else out

        return {"format": FORMAT, "op": self.op, "columns": [column(c) for c in self.columns]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "feature spec") -> "FeatureSpec":
        """The spec a JSON document holds, checked field by field; ModelFormatError names what is wrong."""
        if not isinstance(data, dict) or set(data) != {"format", "op", "columns"}:
            raise ModelFormatError(f"{where}: expected an object with keys format, op and columns; "
                                   f"got {sorted(data) if isinstance(data, dict) else type(data).__name__}")
        if data["format"] != FORMAT:
            raise ModelFormatError(f"{where}: format {data['format']!r} is not {FORMAT}; train the model again "
                                   "with this tiledispatch (`tiledispatch train`)")
        if not isinstance(data["op"], str) or not isinstance(data["columns"], list) or not data["columns"]:
            raise ModelFormatError(f"{where}: op must be an op's name and columns a non-empty list")
        columns = tuple(_column(c, f"{where}: columns[{i}]") for i, c in enumerate(data["columns"]))
        spec = cls(data["op"], columns)
        if len(set(spec.names)) != len(columns):
            raise ModelFormatError(f"{where}: two columns share a name; each (source, path) appears once")
        return spec


def _column(data: Any, where: str) -> Column:
    keys = {"source", "path", "kind", "transform", "vocabulary"}
    if not isinstance(data, dict) or not {"source", "path", "kind", "transform"} <= set(data) <= keys:
        raise ModelFormatError(f"{where}: expected an object with source, path, kind, transform "
                               f"(and vocabulary for a category); got {data!r}")
    try:
        source, kind, transform = Source(data["source"]), Kind(data["kind"]), Transform(data["transform"])
    except ValueError as e:
        raise ModelFormatError(f"{where}: {e}; sources are {[s.value for s in Source]}, kinds "
                               f"{[k.value for k in Kind]}, transforms {[t.value for t in Transform]}") from None
    vocabulary = data.get("vocabulary", [])
    if not isinstance(data["path"], str) or not data["path"]:
        raise ModelFormatError(f"{where}: path must be a non-empty string; got {data['path']!r}")
    if (kind is Kind.CATEGORY) != ("vocabulary" in data) or not isinstance(vocabulary, list) \
            or not all(isinstance(v, str) for v in vocabulary) or len(set(vocabulary)) != len(vocabulary):
        raise ModelFormatError(f"{where}: a category column has a vocabulary of distinct strings and a number "
                               f"column none; got kind {kind.value} with vocabulary {vocabulary!r}")
    return Column(source, data["path"], kind, transform, tuple(vocabulary))


def fit_spec(op: str, problems: Iterable[Any], configs: Iterable[Any], scores: Iterable[Score],
             arch: Any) -> FeatureSpec:
    """The columns that the training rows' problems, configs and scores have, by source and path."""
    problems = list(problems)
    values: dict[Source, list[dict[str, Any]]] = {
        Source.PROBLEM: [problem_values(p) for p in problems],
        Source.DERIVED: [derived_values(p) for p in problems],
        Source.ARCH: [arch_values(arch)],
    }
    configs = list(configs)
    values[Source.CONFIG] = [config_values(c) for c in configs]
    values[Source.KERNEL] = [kernel_values(op, c) for c in configs]
    values[Source.SCORE] = [score_values(s) for s in scores]
    columns = []
    for source in Source:
        seen: dict[str, list[Any]] = {}
        for row in values[source]:
            for path, value in row.items():
                seen.setdefault(path, []).append(value)
        columns += [_fit_column(source, path, seen[path]) for path in sorted(seen)]
    return FeatureSpec(op, tuple(columns))


def _fit_column(source: Source, path: str, values: list[Any]) -> Column:
    present = [v for v in values if v is not None]
    if any(isinstance(v, str) for v in present):
        return Column(source, path, Kind.CATEGORY, vocabulary=tuple(sorted({str(v) for v in present})))
    sizes = source is Source.PROBLEM and present and all(isinstance(v, int) and not isinstance(v, bool)
                                                         for v in present)
    return Column(source, path, Kind.NUMBER, Transform.LOG2 if sizes else Transform.NONE)


class _FieldReader:
    """One source's columns (a problem's, a config's) read from a dataclass field by field.

    Flattening every field of each new problem or config was most of the model's cost over the
    rules (conv: 15 fields a problem, a dozen a config). A scalar field is its own leaf, read
    straight; a dataclass field (dtypes, epilogue, a config's signature) and a tuple of ints
    (strides, paddings) recur across objects, so their leaves' codes are kept by value. The row
    is the one `dict(flatten(obj))` read column by column gives, to the bit."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self._columns = tuple(columns)
        self._at = {c.path: j for j, c in enumerate(self._columns)}
        self._kept: dict[tuple[str, Any], tuple[tuple[int, float, str | None], ...]] = {}

    def row(self, obj: Any) -> tuple[np.ndarray, tuple[str, ...]]:
        """(the columns' codes, NaN where `obj` has no such leaf; the unknown categories, `path=value`)."""
        row = np.full(len(self._columns), math.nan)
        unknown = []
        for name in _field_names(type(obj)):
            for j, code, missing in self._codes(name, getattr(obj, name)):
                row[j] = code
                if missing is not None:
                    unknown.append((j, missing))
        return row, tuple(missing for _, missing in sorted(unknown))

    def _codes(self, name: str, value: Any) -> tuple[tuple[int, float, str | None], ...]:
        """(position, code, the unknown category or None) of each of a field's leaves that has a column."""
        if isinstance(value, enum.Enum):  # a leaf, as `flatten` spells it (its value), no path to build
            return self._leaf(name, value.value)
        if value is None or isinstance(value, (bool, int, float, str)):
            return self._leaf(name, value)
        if dataclasses.is_dataclass(value) or (type(value) is tuple and all(type(v) is int for v in value)):
            key = (name, value)  # equal values of these kinds flatten to the same leaves
            codes = self._kept.get(key)
            if codes is None:
                if len(self._kept) >= CONFIGS_KEPT:
                    self._kept.clear()
                codes = self._kept[key] = self._flattened(name, value)
            return codes
        return self._flattened(name, value)

    def _leaf(self, path: str, leaf: Any) -> tuple[tuple[int, float, str | None], ...]:
        j = self._at.get(path)
        if j is None:
            return ()
        column = self._columns[j]
        code = column.encode(leaf)
        unknown = column.kind is Kind.CATEGORY and leaf is not None and math.isnan(code)
        return ((j, code, f"{path}={leaf!r}" if unknown else None),)

    def _flattened(self, name: str, value: Any) -> tuple[tuple[int, float, str | None], ...]:
        return tuple(code for path, leaf in flatten(value, f"{name}.") for code in self._leaf(path, leaf))


class Featurizer:
    """Builds a spec's matrix for one problem and N configs (the dispatcher's hot path)."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec
        self._groups = {source: [(i, c) for i, c in enumerate(spec.columns) if c.source is source]
                        for source in Source}
        self._index = {source: np.array([i for i, _ in group], dtype=np.intp) for source, group in self._groups.items()}
        self._config_at = np.concatenate([self._index[Source.CONFIG], self._index[Source.KERNEL]])  # `_config_row`'s
        # The score columns: each score's terms read by name in one `map` (NaN where a term is
        # missing), then the column of the score's own value, where the spec has one, filled in.
        score_paths = [c.path for _, c in self._groups[Source.SCORE]]
        self._score_paths = score_paths
        self._value_at = score_paths.index("value") if "value" in score_paths else None
        # id(config) -> (config, its CONFIG and KERNEL columns' values). By identity: hashing a
        # config hashes its nested fields each time, which costs more than the lookup saves; the
        # entry holds the config, so its id is not reused while it is kept. So is an arch's row.
        self._configs: dict[int, tuple[Any, np.ndarray]] = {}
        self._arch: dict[int, tuple[Any, np.ndarray]] = {}  # see _arch_row
        # (problem, its PROBLEM columns, the categories it holds that the spec does not know),
        # for the last problem read: the model's source asks `unknown_categories` of the very
        # problem `matrix` then reads, so it is read once. Replaced whole: thread-safe.
        self._last: tuple[Any, np.ndarray, tuple[str, ...]] | None = None
        self._problem_fields = _FieldReader([c for _, c in self._groups[Source.PROBLEM]])
        self._config_fields = _FieldReader([c for _, c in self._groups[Source.CONFIG]])

    def _encode(self, sources: Sequence[Source], rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """The columns of `sources`, in turn, each read from its row of raw values."""
        return np.array([c.encode(row.get(c.path)) for source, row in zip(sources, rows)
                         for _, c in self._groups[source]], dtype=np.float64)

    def _config_row(self, config: Any) -> np.ndarray:
        entry = self._configs.get(id(config))
        if entry is None or entry[0] is not config:
            if len(self._configs) >= CONFIGS_KEPT:  # configs made afresh for each call (from JSON)
                self._configs.clear()
            entry = self._configs[id(config)] = (config, self._config_values(config))
        return entry[1]

    def _config_values(self, config: Any) -> np.ndarray:
        kernel = self._encode((Source.KERNEL,), (kernel_values(self.spec.op, config),))
        return np.concatenate([self._config_fields.row(config)[0], kernel])

    def _problem(self, problem: Any) -> tuple[Any, np.ndarray, tuple[str, ...]]:
        last = self._last
        if last is None or last[0] is not problem:
            self._last = last = (problem, *self._problem_fields.row(problem))
        return last

    def unknown_categories(self, problem: Any) -> tuple[str, ...]:
        """The problem's categorical fields (`path=value`) whose value no training problem had (a
        layout, dtype or epilogue the model never saw): empty where the model knows them all."""
        return self._problem(problem)[2]

    def matrix(self, problem: Any, configs: Sequence[Any], arch: Any,
               scores: Sequence[Score] | None = None) -> np.ndarray:
        """One row per config (float64, NaN where missing); `scores` are the configs' rule scores
        where the caller has them, computed here otherwise."""
        if scores is None:
            rule_score = get_op(self.spec.op).rule_score
            scores = [rule_score(c, problem, arch) for c in configs]
        elif len(scores) != len(configs):
            raise ValueError(f"scores: {len(scores)} rule scores for {len(configs)} configs; give one per config, "
                             "in order, or None to compute them")
        index = self._index
        row = self._arch_row(arch).copy()
        row[index[Source.PROBLEM]] = self._problem(problem)[1]
        row[index[Source.DERIVED]] = self._encode((Source.DERIVED,), (derived_values(problem),))
        out = np.empty((len(configs), len(row)), dtype=np.float64)
        out[:] = row
        if configs:
            out[:, self._config_at] = np.array([self._config_row(c) for c in configs])
        paths = self._score_paths
        table = getattr(scores, "table", None)
        if paths and configs and table is not None:  # the op's own table of them (GEMM's): no Score made
            out[:, index[Source.SCORE]] = table(paths)
        elif paths and configs:
            nans = itertools.repeat(math.nan)
            block = np.array([list(map(s.terms.get, paths, nans)) for s in scores], dtype=np.float64)
            if self._value_at is not None:
                block[:, self._value_at] = [s.value for s in scores]
            out[:, index[Source.SCORE]] = block
        return out

    def _arch_row(self, arch: Any) -> np.ndarray:
        """A row of the spec's width with the arch's columns filled (the others NaN): the part of every
        row of an arch's matrices that no problem or config changes, made once per arch."""
        entry = self._arch.get(id(arch))
        if entry is None or entry[0] is not arch:
            if len(self._arch) >= CONFIGS_KEPT:  # archs made afresh for each call
                self._arch.clear()
            row = np.full(len(self.spec.columns), math.nan)
            row[self._index[Source.ARCH]] = self._encode((Source.ARCH,), (arch_values(arch),))
            self._arch[id(arch)] = entry = (arch, row)
        return entry[1]
