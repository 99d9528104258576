"""Training a learned selection model from a sweep's results table (`bench.table`).

The rows of one `SelectionKey` that ran correctly (status ok) are the data: one row per
(problem, kernel), its time the median over the GPUs and repeats that measured it. The label
is a relevance grade of the kernel within its problem, from its efficiency e (the problem's
fastest time over its own): floor(GRADES * e**SHARPNESS), so that the grades part the kernels
near the best (e 0.95 grades 16, 0.9 grades 13, 0.8 grades 8, 0.5 grades 1) and LambdaRank
learns the order at the top of each problem's list. Features come from `heuristics.features`,
the rule scores recomputed for the key's arch, so training reads what the dispatcher will
compute. Cross-validation is grouped by problem (a problem's rows are all in one fold): each
fold's model, fitted on the others, ranks the problems it does not see, which gives the CV
scores (the oracle's time over the time of the kernel the model ranks first); the model kept
is then fitted on every row.

A model may also learn from a sibling dtype's rows (`pool`): fp16 and bf16 run the same kernels at
the same tensor-core rate, so a bf16 sweep teaches an fp16 model too (the dtype is a feature).
Its folds then hold a layer's problems of every dtype together (`shape_of`), and the CV scores
judge the key's own problems alone.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ..bench.table import SelectionKey, Status, config_from_row, problem_from_row
from ..core.errors import TiledispatchError, UnsupportedError
from ..core.op import get_op
from .features import Featurizer, FeatureSpec, fit_spec
from .learned import FORMAT, RANKING_OBJECTIVES, TrainedModel, data_hash
from .outcomes import TOP1_TOLERANCE, efficiency_stats

REQUIRED = ("op", "direction", "dtype", "arch", "problem_id", "problem", "kernel", "config", "status", "time_ms")
GRADES = 20  # relevance grades 0..20 (see the module docstring)
SHARPNESS = 4
TARGET = f"LambdaRank over each problem's kernels, grades floor({GRADES} * efficiency**{SHARPNESS})"
# LightGBM's settings: small trees (15 leaves) at a slow rate: a sweep holds a few hundred
# problems, and a ranker learns from the pairs within each. The model stays about half a MB of
# text, small enough to ship (docs/selection.md measures its prediction).
DEFAULT_PARAMS: Mapping[str, Any] = {
    "objective": "lambdarank", "metric": "ndcg", "eval_at": [1, 3], "lambdarank_truncation_level": 10,
    "label_gain": list(range(GRADES + 1)), "learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 10,
    "feature_fraction": 0.9, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0, "max_bin": 255,
    "deterministic": True, "force_row_wise": True, "verbose": -1,
}
ROUNDS = 300  # trees: 300 cost 5-7 us a candidate to predict on one CPU thread
SEED_MAX = 2**31 - 1  # LightGBM's seed is a C int


def selection_keys(frame: Any) -> list[SelectionKey]:
    """The keys that have ok rows in a results table, sorted."""
    _require(frame)
    ok = frame[frame["status"] == Status.OK.value]
    combos = ok[["op", "direction", "dtype", "arch"]].drop_duplicates().itertuples(index=False)
    return sorted(SelectionKey(*(str(v) for v in row)) for row in combos)


def _require(frame: Any) -> None:
    if not hasattr(frame, "columns") or not hasattr(frame, "groupby"):
        raise TypeError(f"frame must be a pandas DataFrame of a sweep's rows (bench.table.COLUMNS; "
                        f"cli.train.read_table reads one); got {type(frame).__name__}")
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise UnsupportedError(f"the results table lacks the column(s) {missing}; a sweep's table "
                               f"(tiledispatch sweep, bench.table.COLUMNS) has {list(REQUIRED)}")


def rows_of(frame: Any, key: SelectionKey) -> Any:
    """The ok rows of `key`, one per (problem, kernel) with the median time, sorted by both."""
    _require(frame)
    times = frame["time_ms"].astype(float)
    mask = ((frame["op"] == key.op) & (frame["direction"] == key.direction) & (frame["dtype"] == key.dtype)
            & (frame["arch"] == key.arch) & (frame["status"] == Status.OK.value) & np.isfinite(times) & (times > 0))
    ok = frame[mask]
    if ok.empty:
        raise UnsupportedError(f"no ok rows of {key.op} {key.direction} {key.dtype} on {key.arch} in the results "
                               f"table; its keys with ok rows: {[k.__dict__ for k in selection_keys(frame)]}")
    return (ok.groupby(["problem_id", "kernel"], sort=True)
              .agg(problem=("problem", "first"), config=("config", "first"), time_ms=("time_ms", "median"))
              .reset_index())


def pooled_rows(frame: Any, key: SelectionKey, pool: tuple[str, ...] = ()) -> Any:
    """`rows_of` the key, and of the same op, direction and arch in each dtype of `pool` (other
    dtypes than the key's, each once: `train` makes it so)."""
    import pandas as pd

    keys = [key] + [replace(key, dtype=d) for d in pool]
    rows = [rows_of(frame, k) for k in keys]
    if len(rows) == 1:
        return rows[0]
    return pd.concat(rows).sort_values(["problem_id", "kernel"], kind="stable").reset_index(drop=True)


def shape_of(problem_json: str, without: tuple[str, ...] = ("types",)) -> str:
    """A problem's layer: a hash of its JSON without the fields `without` (its types: the same for
    its fp16 and bf16 forms)."""
    fields = json.loads(problem_json)
    for name in without:
        fields.pop(name, None)
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Data:
    """One key's training matrix: rows grouped by problem (contiguous), their log(ms)."""

    spec: FeatureSpec
    matrix: np.ndarray
    log_ms: np.ndarray
    problem_ids: np.ndarray
    skipped: Mapping[str, int]  # rows left out, by reason


def featurize(rows: Any, key: SelectionKey) -> Data:
    """The feature matrix of `rows_of(frame, key)`: objects rebuilt from their JSON, rule scores
    computed on the key's arch. A row whose problem or config this tiledispatch cannot read
    (a table of another version) is left out and counted."""
    from .. import arch as arch_facts

    arch = arch_facts.load(key.arch)
    definition = get_op(key.op)
    problems, configs, skipped = {}, {}, {}
    for text in rows["problem"].unique():
        problems[text] = _parsed(problem_from_row, key.op, text, skipped, "problem unreadable")
    for text in rows["config"].unique():
        configs[text] = _parsed(config_from_row, key.op, text, skipped, "config unreadable")
    kept = [i for i, (p, c) in enumerate(zip(rows["problem"], rows["config"]))
            if problems[p] is not None and configs[c] is not None]
    rows = rows.iloc[kept]
    if rows.empty:
        raise UnsupportedError(f"no row of {key.name} on {key.arch} holds a problem and config this tiledispatch "
                               f"reads ({dict(skipped)}); sweep again with this version")
    pairs = [(problems[p], configs[c]) for p, c in zip(rows["problem"], rows["config"])]
    scores = [definition.rule_score(c, p, arch) for p, c in pairs]
    spec = fit_spec(key.op, [p for p in problems.values() if p is not None],
                    [c for c in configs.values() if c is not None], scores, arch)
    featurizer, ids = Featurizer(spec), rows["problem_id"].to_numpy()
    blocks = [featurizer.matrix(pairs[start][0], [c for _, c in pairs[start:end]], arch, scores[start:end])
              for start, end in _groups(ids)]
    return Data(spec, np.concatenate(blocks), np.log(rows["time_ms"].to_numpy(dtype=float)), ids, skipped)


def _parsed(parse, op: str, text: str, skipped: dict[str, int], reason: str) -> Any:
    try:
        return parse(op, text)
    except (ValueError, TypeError, KeyError, TiledispatchError):  # a field or value this version lacks
        skipped[reason] = skipped.get(reason, 0) + 1
        return None


def grades(log_ms: np.ndarray, problem_ids: np.ndarray) -> np.ndarray:
    """Each row's relevance within its problem: floor(GRADES * efficiency**SHARPNESS)."""
    out = np.empty(len(log_ms), dtype=int)
    for start, end in _groups(problem_ids):
        efficiency = np.exp(log_ms[start:end].min() - log_ms[start:end])
        out[start:end] = np.floor(GRADES * efficiency ** SHARPNESS)
    return out


def _groups(problem_ids: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each problem's contiguous rows."""
    starts = np.flatnonzero(np.r_[True, problem_ids[1:] != problem_ids[:-1]])
    return list(zip(starts.tolist(), np.r_[starts[1:], len(problem_ids)].tolist()))


def _dataset(data: Data, mask: np.ndarray) -> Any:
    import lightgbm

    ids = data.problem_ids[mask]
    return lightgbm.Dataset(data.matrix[mask], grades(data.log_ms[mask], ids), feature_name=data.spec.names,
                            categorical_feature=data.spec.categorical, free_raw_data=False,
                            group=[end - start for start, end in _groups(ids)])


def selection(log_ms: np.ndarray, costs: np.ndarray, problem_ids: np.ndarray) -> dict[str, float]:
    """How the costs pick on each problem: efficiency = oracle time / time of the lowest cost."""
    efficiency = []
    for start, end in _groups(problem_ids):
        times = np.exp(log_ms[start:end])
        efficiency.append(times.min() / times[np.argmin(costs[start:end])])
    # a hit as `tiledispatch evaluate` counts one: pick time <= oracle time * (1 + TOP1_TOLERANCE)
    hits = sum(e >= 1 / (1 + TOP1_TOLERANCE) for e in efficiency)
    return {"problems": len(efficiency), **efficiency_stats([float(e) for e in efficiency]),
            "top1": hits / len(efficiency)}


def cross_validate(data: Data, folds: int, params: Mapping[str, Any], groups: np.ndarray | None = None,
                   judged: np.ndarray | None = None) -> dict[str, Any] | None:
    """Grouped k-fold selection scores on the problems each fold's model did not see; None with
    fewer than 2 groups. A row's group is its problem unless `groups` gives one per row (a
    pooled model's layers); `judged` rows alone are scored (default: all)."""
    import lightgbm

    groups = data.problem_ids if groups is None else groups
    judged = np.ones(len(groups), dtype=bool) if judged is None else judged
    unique = np.unique(groups)
    folds = min(folds, len(unique))
    if folds < 2:
        return None
    from ..bench.problemsets import fold_of  # the split every tool shares: a problem is in one fold everywhere

    fold_by_id = {g: fold_of(str(g), folds) for g in unique}
    fold = np.array([fold_by_id[g] for g in groups])
    costs, used = np.full(len(fold), np.nan), []
    for f in range(folds):
        valid = (fold == f) & judged
        if not valid.any() or (fold == f).all():
            continue  # a hash may leave a fold empty when there are few problems
        booster = lightgbm.train(dict(params), _dataset(data, fold != f), ROUNDS)
        costs[valid] = -booster.predict(data.matrix[valid])
        used.append(f)
    seen = ~np.isnan(costs)
    if not seen.any():
        return None
    return {"folds": folds, "folds_used": used,
            "selection": selection(data.log_ms[seen], costs[seen], data.problem_ids[seen])}


def train(frame: Any, key: SelectionKey, *, folds: int = 5, seed: int = 0,
          params: Mapping[str, Any] | None = None, pool: tuple[str, ...] = ()) -> TrainedModel:
    """The model of `key` trained on a results table (a pandas DataFrame of `bench.table.COLUMNS`):
    grouped k-fold CV by problem for the scores, then one fit on every row; with `pool`, on the
    rows of those dtypes too (the module docstring)."""
    import lightgbm

    from .. import __version__

    if not isinstance(key, SelectionKey):
        raise TypeError(f"key must be a bench.table.SelectionKey; got {key!r}")
    if not isinstance(folds, int) or isinstance(folds, bool) or folds < 1:
        raise ValueError(f"folds must be a positive integer (5 is usual; 1 skips cross-validation); got {folds!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an integer in 0..{SEED_MAX} (LightGBM's seed); got {seed!r}")
    params = {**DEFAULT_PARAMS, "seed": seed, **_checked_params(params)}
    pool = tuple(d for d in dict.fromkeys(pool) if d != key.dtype)
    rows = pooled_rows(frame, key, pool)
    data = featurize(rows, key)
    groups = own = None
    if pool:  # folds by layer: a held-out problem's twin in another dtype trains no model that judges it
        layer_of = dict(zip(rows["problem_id"], map(shape_of, rows["problem"])))
        groups = np.array([layer_of[p] for p in data.problem_ids])
        own = np.isin(data.problem_ids, frame.loc[frame["dtype"] == key.dtype, "problem_id"].unique())
    cv = cross_validate(data, folds, params, groups, own)
    booster = lightgbm.train(dict(params), _dataset(data, np.ones(len(data.log_ms), dtype=bool)), ROUNDS)
    mask = (frame["status"] == Status.OK.value) & frame["problem_id"].isin(rows["problem_id"])
    for column, value in zip(("op", "direction", "arch"), (key.op, key.direction, key.arch)):
        mask &= frame[column] == value  # the key's rows alone: another arch's sweep shares problem ids
    used = frame[mask & frame["dtype"].isin((key.dtype, *pool))]
    manifest = {
        "format": FORMAT, "key": {"op": key.op, "direction": key.direction, "dtype": key.dtype, "arch": key.arch},
        "target": TARGET, "data_hash": data_hash(rows), "rows": int(len(data.log_ms)),
        "problems": int(len(np.unique(data.problem_ids))), "kernels": int(rows["kernel"].nunique()),
        "pooled_dtypes": list(pool),
        "own_problems": int(len(np.unique(data.problem_ids if own is None else data.problem_ids[own]))),
        "skipped": dict(data.skipped), "gpus": _values(used, "gpu"), "problem_sets": _values(used, "problem_set"),
        "cv": cv, "trees": booster.num_trees(), "params": params, "lightgbm": lightgbm.__version__,
        "tiledispatch": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "problem_ids": sorted(str(p) for p in np.unique(data.problem_ids)),
    }
    return TrainedModel(key, data.spec, booster, manifest)


def _checked_params(params: Any) -> Mapping[str, Any]:
    """LightGBM parameters over DEFAULT_PARAMS, whose objective (where given) is a ranker's."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of LightGBM parameters (or None); got {type(params).__name__}")
    objective = params.get("objective", DEFAULT_PARAMS["objective"])
    if objective not in RANKING_OBJECTIVES:
        raise ValueError(f"params: objective {objective!r} is not a ranker's; use one of {RANKING_OBJECTIVES}: "
                         "predict_cost negates the score, higher for the faster kernel")
    return params


def _values(frame: Any, column: str) -> list[str]:
    if column not in frame.columns:
        return []
    return sorted({str(v) for v in frame[column].dropna().unique()})
