"""Selection quality, offline: how close each strategy's pick comes to the fastest kernel measured.

A sweep (`bench.table`) times every candidate of a rule set, the vendor included, on every
problem of a set. On one problem the oracle is the fastest OK row; a strategy picks one row,
and its efficiency there is oracle time / pick time (1.0 at best). A pick whose row is not OK
(wrong result, fault, timeout, failed build or launch) scores 0 and is listed. The strategies
(`Picker`) are judged on the table's own times, so no GPU is needed; docs/selection.md,
"Evaluation", says what each picks and what each number means.

A learned model is judged on problems it never saw: `holdout` picks them, `check_unseen`
refuses a model whose manifest shows it trained on them, and `cross_validate` judges every
problem once, by a model trained on the other folds: the honest number.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import arch as arch_facts
from ..bench.problemsets import fold_of
from ..bench.table import SelectionKey, Status, config_from_row, problem_from_row
from ..core.choice import Choice
from ..core.candidate_set import model_shortlist
from ..core.errors import InvalidArgumentError, TiledispatchError
from ..core.op import get_op
from . import autotune, nvmmh
from .learned import data_hash
from .outcomes import (SLOW, TOP1_TOLERANCE, VENDOR_FLOOR, WORST, KeyReport, Outcome, Report, efficiency_stats,
                       merge, p10, summarize)

__all__ = ["EvaluationError", "Fold", "KeyReport", "Outcome", "Picker", "Report", "SLOW", "STANDARD",
           "TOP1_TOLERANCE", "VENDOR_FLOOR", "WORST", "check_unseen", "cross_validate", "efficiency_stats", "evaluate",
           "fold_of", "holdout_ids", "merge", "p10", "summarize"]

KEY_COLUMNS = ("op", "direction", "dtype", "arch")
REQUIRED = (*KEY_COLUMNS, "problem_id", "problem", "kernel", "family", "vendor", "status", "time_ms")


class Picker(Choice):
    """A strategy whose picks are judged."""

    RULES = "rules"
    MODEL = "model"
    AUTOTUNE = "autotune"
    VENDOR = "vendor"
    NVMMH = "nvmmh"  # NVIDIA's nvMatmulHeuristics, where installed: GEMM, among the Triton tiles it can express


STANDARD = (Picker.RULES, Picker.MODEL, Picker.AUTOTUNE, Picker.VENDOR)  # those that need no optional package


class EvaluationError(TiledispatchError, ValueError):
    """A table or model that cannot be evaluated as asked; the message says what would work."""


@dataclass(frozen=True)
class Fold:
    """The problems of fold `index` of a `folds`-way split grouped by problem (`fold_of`)."""

    index: int
    folds: int

    def __post_init__(self) -> None:
        if not (_whole(self.folds) and self.folds >= 2 and _whole(self.index) and 0 <= self.index < self.folds):
            raise InvalidArgumentError(f"a fold is an integer in 0..folds-1, folds an integer >= 2; got fold "
                                       f"{self.index!r} of {self.folds!r}")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def holdout_ids(frame, holdout) -> frozenset[str] | None:
    """The problem ids `holdout` names among `frame`'s: None (all), a Fold, a table, or ids."""
    if holdout is None:
        return None
    ids = frame["problem_id"].astype(str).unique()
    if isinstance(holdout, Fold):
        return frozenset(i for i in ids if fold_of(i, holdout.folds) == holdout.index)
    if hasattr(holdout, "columns"):
        if "problem_id" not in holdout.columns:
            raise EvaluationError("holdout: a table needs a problem_id column (bench.table.COLUMNS)")
        holdout = holdout["problem_id"]
    if isinstance(holdout, (str, bytes)) or not isinstance(holdout, Iterable):
        raise InvalidArgumentError(f"holdout must be None, a Fold, a table or problem ids; got {holdout!r}")
    return frozenset(map(str, holdout)) & frozenset(ids)


@dataclass(frozen=True)
class Measured:
    """One candidate kernel of one problem, as the table measured it."""

    kernel: str
    family: str
    vendor: bool
    status: Status
    time_ms: float | None
    rule_score: float | None
    rule_rank: int | None
    config: str | None
    error: str | None
    order: int  # its place among the problem's rows: the last tie-break

    @property
    def spec(self) -> "Measured":  # autotune.finalists reads a candidate's spec.family
        return self

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def rules_key(self) -> tuple:
        return (-self.rule_score, math.inf if self.rule_rank is None else self.rule_rank, self.order)


class _Problem:
    """One problem's objects, rebuilt from the table when a strategy needs them (a model, a rescore)."""

    def __init__(self, key: SelectionKey, problem_json: str, arch, model, configs: dict, estimator=None) -> None:
        self.op, self.problem_json, self.arch, self.model = key.op, problem_json, arch, model
        self.estimator = estimator  # nvMMH's, where it ranks this key
        # The model reads its key's arch facts, as training computed its features, whatever `arch`
        # the rules are asked to score with.
        self.model_arch = arch if arch.name == key.arch else arch_facts.load(key.arch)
        self._configs = configs  # config JSON -> object, shared by the key's problems

    @functools.cached_property
    def problem(self) -> Any:
        return _parsed(problem_from_row, self.op, self.problem_json, "problem")

    def configs(self, candidates: Sequence[Measured]) -> list[Any]:
        out = []
        for c in candidates:
            if c.config is None:
                raise EvaluationError(f"row of kernel {c.kernel}: no config; the model and the rules' scores "
                                      "read the config column (bench.table.COLUMNS)")
            if c.config not in self._configs:
                self._configs[c.config] = _parsed(config_from_row, self.op, c.config, f"config of {c.kernel}")
            out.append(self._configs[c.config])
        return out


    def scored(self, candidates: Sequence[Measured]) -> list[Measured]:
        """The candidates today's rules accept on the key's arch, with the op's `rule_score` of today
        on this arch: a kernel a rule now refuses (one found wrong, say) is no candidate of the
        dispatcher's, so it is none of the evaluation's either."""
        definition = get_op(self.op)
        return [replace(c, rule_score=float(definition.rule_score(config, self.problem, self.arch).value))
                for c, config in zip(candidates, self.configs(candidates))
                if definition.validate(config, self.model_arch).ok]

    def model_costs(self, candidates: Sequence[Measured]) -> np.ndarray:
        costs = np.asarray(self.model.predict_cost(self.problem, self.configs(candidates), self.model_arch),
                           dtype=float)
        if costs.shape != (len(candidates),) or not np.isfinite(costs).all():
            raise EvaluationError(f"the model gave costs of shape {costs.shape} (finite: {np.isfinite(costs).all()}) "
                                  f"for {len(candidates)} candidates; predict_cost gives one finite cost per config")
        return costs


def _parsed(parse: Callable[[str, str], Any], op: str, text: str, what: str) -> Any:
    """`parse(op, text)`, or an EvaluationError naming the JSON this tiledispatch cannot read."""
    try:
        return parse(op, text)
    except (ValueError, TypeError, KeyError, TiledispatchError) as e:
        raise EvaluationError(f"the {what} {text[:200]!r} is not a {op} {what.split()[0]} this tiledispatch reads "
                              f"({e}); evaluate without --rescore and the model, or sweep again with this "
                              "version") from None


def _model_order(ordered: Sequence[Measured], problem: _Problem) -> list[Measured]:
    """The candidates as the dispatcher's model ranks them: the shortlist (the rules' best few, as
    the op says, and the vendor's) by the model's cost, ties in the rules' order, then the
    others in the rules' order; the rules' order where the model does not cover the problem."""
    covers = getattr(problem.model, "covers", None)
    if problem.model is None or covers is not None and not covers(problem.problem):
        return list(ordered)
    shortlist, rest = model_shortlist(list(ordered), lambda c: c.vendor, get_op(problem.op).model_shortlist,
                                      lambda c: c.rule_score)
    if not shortlist:
        return rest
    return [shortlist[i] for i in np.argsort(problem.model_costs(shortlist), kind="stable")] + rest


def _pick_model(ordered: Sequence[Measured], problem: _Problem) -> Measured:
    return _model_order(ordered, problem)[0]


def _pick_autotune(ordered: Sequence[Measured], problem: _Problem) -> Measured:
    """The dispatcher's autotune: its finalists timed, taken from the model's order where a model
    is given, as the dispatcher takes them where one ships."""
    finalists = autotune.finalists(_model_order(ordered, problem))
    # the dispatcher drops these: a build that fails, a result its check against the reference refutes
    timed = [c for c in finalists if c.status not in (Status.BUILD_FAILED, Status.WRONG)]
    broken = next((c for c in timed if not c.ok), None)  # it runs these: a fault or hang ends the tuning
    if broken is not None or not timed:
        return broken or finalists[0]
    name = autotune.winner({c.kernel: c.time_ms for c in timed}, [c.kernel for c in timed if c.vendor])
    return next(c for c in timed if c.kernel == name)


def _pick_vendor(ordered: Sequence[Measured], _: _Problem) -> Measured | None:
    return next((c for c in ordered if c.vendor), None)


PICKS: Mapping[Picker, Callable[[Sequence[Measured], _Problem], Measured | None]] = {
    Picker.RULES: lambda ordered, _: ordered[0], Picker.MODEL: _pick_model, Picker.AUTOTUNE: _pick_autotune,
    Picker.VENDOR: _pick_vendor,
    Picker.NVMMH: lambda ordered, p: nvmmh.pick(ordered, p.problem, p.configs(ordered), p.estimator)}


_OPTIONAL = ("rule_score", "rule_rank", "config", "error")


def _check_columns(frame) -> None:
    if not hasattr(frame, "columns") or not hasattr(frame, "groupby"):
        raise InvalidArgumentError(f"frame must be a pandas DataFrame of a sweep's rows (bench.table.COLUMNS; "
                                   f"cli.train.read_table reads one); got {type(frame).__name__}")
    if missing := [c for c in REQUIRED if c not in frame.columns]:
        raise EvaluationError(f"the table lacks column(s) {missing}; a sweep's table has bench.table.COLUMNS")


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):  # None, pandas' NA
        return None
    return None if math.isnan(number) else number


def _flag(value: Any) -> bool:
    """A boolean column's value: a missing one (None, or NaN where pandas made the column float)
    is false, and so is the text "false" (bool() holds both true)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    number = _number(value)
    return number is not None and number != 0


def _measured(values: dict[str, Any], order: int) -> Measured:
    try:
        status = Status(values["status"])
    except ValueError:
        raise EvaluationError(f"row of problem {values['problem_id']}, kernel {values['kernel']}: status "
                              f"{values['status']!r} is not one of {[s.value for s in Status]}") from None
    time_ms = _number(values["time_ms"]) if status is Status.OK else None
    if status is Status.OK and not (time_ms is not None and math.isfinite(time_ms) and time_ms > 0):
        raise EvaluationError(f"row of problem {values['problem_id']}, kernel {values['kernel']}: status ok "
                              f"needs a time_ms > 0; got {values['time_ms']!r}")
    rank, config, error = _number(values.get("rule_rank")), values.get("config"), values.get("error")
    return Measured(str(values["kernel"]), str(values["family"]), _flag(values["vendor"]), status, time_ms,
                    _number(values.get("rule_score")), None if rank is None else int(rank),
                    config if isinstance(config, str) else None, error if isinstance(error, str) and error else None,
                    order)


def _one_row(rows: list[Measured]) -> Measured:
    """A kernel measured more than once on a problem (a sweep rerun): the median of its OK times."""
    ok = [r for r in rows if r.ok]
    return replace(ok[0], time_ms=statistics.median(r.time_ms for r in ok)) if ok else rows[0]


def _problems(rows) -> dict[str, tuple[str, list[Measured]]]:
    """Each problem's JSON and candidates (every row but those the kernel refused), in table order."""
    names = [c for c in (*REQUIRED, *_OPTIONAL) if c in rows.columns]
    found: dict[str, tuple[str, dict[str, list[Measured]]]] = {}
    for order, values in enumerate(zip(*(rows[c].tolist() for c in names))):
        row = dict(zip(names, values))
        pid = str(row["problem_id"])
        problem_json, kernels = found.setdefault(pid, (row["problem"], {}))
        measured = _measured(row, order)
        if measured.status is not Status.UNSUPPORTED:
            kernels.setdefault(measured.kernel, []).append(measured)
    return {pid: (problem_json, [_one_row(r) for r in kernels.values()]) for pid, (problem_json, kernels) in
            found.items()}


def _by_key(frame) -> Iterable[tuple[SelectionKey, Any]]:
    for values, rows in frame.groupby(list(KEY_COLUMNS), sort=True):
        yield SelectionKey(*map(str, values)), rows


def _model_for(key: SelectionKey, model) -> tuple[Any, str | None]:
    """The model that ranks `key`'s problems, or None and why there is none. A model of another
    key (one the mapping or the caller gives for this key) is none: its features and costs are
    another slice's."""
    if isinstance(model, Mapping):
        found = model.get(key)
        if found is None:
            return None, f"no model for {key.name} on {key.arch} among those given"
    elif model is None or isinstance(model, (str, Path)):
        from . import learned

        try:
            found = learned.shipped(key) if model is None else learned.load(Path(model), key)
        except (ImportError, FileNotFoundError) as e:
            return None, f"no model for {key.name} on {key.arch}: {e}"
        if found is None:
            return None, f"no model ships for {key.name} on {key.arch}; give one (--model DIR) or cross-validate (--cv)"
    else:
        found = model
    if not callable(getattr(found, "predict_cost", None)):
        raise InvalidArgumentError(f"model must be a TrainedModel (predict_cost), a directory of models, a mapping "
                                   f"of SelectionKey to models, or None for the shipped one; got {found!r}")
    own = getattr(found, "key", None)
    if own is not None and own != key:
        return None, f"the model given ranks {own.name} on {own.arch}, not {key.name} on {key.arch}"
    return found, None


def check_unseen(model, evaluated: Iterable[str], rows, *, allow_seen: bool = False) -> str:
    """How we know `model` never saw the `evaluated` problem ids of `rows` (the key's whole table):
    "verified" (its manifest lists its training problems, none of these), "unverified" (it cannot
    tell), or raises EvaluationError when it did see them, unless `allow_seen`."""
    manifest, evaluated = getattr(model, "manifest", None) or {}, set(evaluated)
    trained = manifest.get("problem_ids")
    if trained is not None:
        seen = evaluated & set(map(str, trained))
        if not seen:
            return "verified"
        why = f"{len(seen)} of the {len(evaluated)} problems evaluated are among the model's training problems"
    elif manifest.get("data_hash") is not None and manifest["data_hash"] == data_hash(rows):
        why = "the model's manifest has this table's data hash: it trained on these problems"
    else:
        return "unverified"
    if allow_seen:
        return f"seen (allowed): {why}"
    raise EvaluationError(f"{why}; evaluate it on problems it never saw (a model trained without a fold, "
                          "--holdout-fold; or --cv), or allow it (--allow-seen) to judge it on its training data")


def _pickers(strategies) -> tuple[Picker, ...]:
    single = isinstance(strategies, (str, Picker))
    chosen = tuple(dict.fromkeys(Picker.parse(s) for s in ([strategies] if single else strategies)))
    if not chosen:
        raise InvalidArgumentError("strategies names none; use some of: " + ", ".join(p.value for p in Picker))
    return chosen


def evaluate(frame, *, strategies=(Picker.RULES, Picker.MODEL, Picker.AUTOTUNE), model=None, arch=None,
             holdout=None, rescore: bool = False, allow_seen: bool = False, held_out: bool = False) -> Report:
    """Each strategy's picks on each problem of `frame` (a sweep's table) against the oracle, per key.

    `model`: a TrainedModel, a directory of models, a mapping of SelectionKey to models, or None for
    the shipped ones. `arch`: the facts the rules read (default: each key's; the model reads its
    key's, as its training did). `holdout`:
    the problems judged (None: all; a Fold; a table or problem ids). `rescore`: the rules' scores of
    today, not the table's. `held_out`: the caller trained the model without these problems."""
    pickers = _pickers(strategies)
    _check_columns(frame)
    ids = holdout_ids(frame, holdout)
    if ids is not None and not ids:
        raise EvaluationError(f"holdout {holdout!r} names none of the table's {frame['problem_id'].nunique()} "
                              "problems; give fewer folds, or ids of its problem_id column")
    judged = frame if ids is None else frame[frame["problem_id"].astype(str).isin(ids)]
    reports, wholes = [], dict(_by_key(frame))
    for key, rows in _by_key(judged):
        reports.append(_evaluate_key(key, rows, wholes[key], pickers, model, arch_facts.load(arch or key.arch),
                                     rescore, "held out" if held_out else None, allow_seen))
    kind = {"kind": "all"} if holdout is None else {"kind": "problems", "problems": len(ids)}
    if isinstance(holdout, Fold):
        kind = {"kind": "fold", "fold": holdout.index, "folds": holdout.folds}
    return Report(tuple(reports), kind)


def _evaluate_key(key, rows, whole, pickers, model, arch, rescore, unseen, allow_seen) -> KeyReport:
    problems = _problems(rows)
    skipped, predictor, summary = {}, None, None
    if Picker.MODEL in pickers or Picker.AUTOTUNE in pickers:  # autotune's finalists follow the model too
        predictor, why = _model_for(key, model)
        if predictor is None:
            if Picker.MODEL in pickers:
                skipped[Picker.MODEL] = why
        else:
            summary = {k: v for k, v in (getattr(predictor, "manifest", None) or {}).items()
                       if not (isinstance(v, (list, tuple)) and len(v) > 20)}  # no lists of training problems
            unseen = unseen or check_unseen(predictor, problems, whole, allow_seen=allow_seen)
    estimator = None
    if Picker.NVMMH in pickers:
        estimator, why = nvmmh.estimator_for(key.op, key.arch, whole.get("gpu", ()))
        if estimator is None:
            skipped[Picker.NVMMH] = why
    outcomes: dict[Picker, list[Outcome]] = {p: [] for p in pickers if p not in skipped}
    without, configs = [], {}
    for pid, (problem_json, candidates) in problems.items():
        problem = _Problem(key, problem_json, arch, predictor, configs, estimator)
        if rescore or any(c.rule_score is None for c in candidates):
            candidates = problem.scored(candidates)
        oracle = min((c for c in candidates if c.ok), key=lambda c: c.time_ms, default=None)
        if oracle is None:
            without.append(pid)
            continue
        ordered = sorted(candidates, key=Measured.rules_key)
        vendor = _pick_vendor(ordered, problem)
        vendor_ms = vendor.time_ms if vendor is not None and vendor.ok else None
        for picker, outs in outcomes.items():
            pick = PICKS[picker](ordered, problem)
            if pick is not None:
                outs.append(Outcome(pid, problem_json, pick.kernel, pick.status, pick.time_ms, oracle.time_ms,
                                    oracle.kernel, vendor_ms, pick.error))
    return KeyReport(key, {p: tuple(o) for p, o in outcomes.items()}, tuple(without), skipped, summary,
                     unseen if predictor is not None else None)


def cross_validate(frame, *, folds: int = 5, only: int | None = None, seed: int = 0, strategies=STANDARD,
                   arch=None, rescore: bool = False, train: Callable[..., Any] | None = None,
                   inner_folds: int = 2, by: str = "problem_id") -> Report:
    """The honest numbers: for each fold (or the `only` one), a model trained on the other folds
    (`learned.train`, or `train`) judged on that fold's problems, so each is judged once, unseen.
    `by`: the column folds group rows by (``group_id``, problemsets' layers: unseen layers)."""
    _check_columns(frame)
    if by not in frame.columns:
        raise InvalidArgumentError(f"by={by!r}: the table has no such column; group folds by problem_id, or by "
                                   "group_id after bench.problemsets.with_groups(frame)")
    if train is None:
        from .learned import train
    ids = frame[by].astype(str)
    fold = ids.map({i: fold_of(i, folds) for i in ids.unique()})
    reports = []
    for index in range(Fold(0, folds).folds) if only is None else [Fold(only, folds).index]:
        rest = frame[fold != index]
        models = {key: train(rows, key, folds=inner_folds, seed=seed) for key, rows in _by_key(rest)
                  if Picker.MODEL in _pickers(strategies) and (rows["status"] == Status.OK.value).any()}
        held = frame[fold == index]
        if len(held):
            reports.append(evaluate(held, strategies=strategies, model=models, arch=arch, rescore=rescore,
                                    held_out=True))
    return merge(reports, {"kind": "cross_validation", "folds": folds, "fold": only, "by": by})
