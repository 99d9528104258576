"""Offline evaluation of selection (heuristics/evaluate.py, `tiledispatch evaluate`) on synthetic tables.

Every table here is made of real tiny-rule-set GEMM problems and configs, ranked by today's
rules on sm_90 (no GPU: nothing runs), with times the test chooses, so each number the
evaluator reports is checked against one computed here by hand.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pandas as pd
import pytest

from tiledispatch import arch as arch_facts
from tiledispatch.bench.table import COLUMNS, SelectionKey, canonical_json, problem_id, selection_key
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.heuristics import autotune
from tiledispatch.heuristics import evaluate as ev
from tiledispatch.ops.gemm import GemmLayout, GemmProblem, GemmTypes

SHAPES = ((100, 64, 48), (1, 256, 512), (4096, 4096, 64), (33, 17, 300), (512, 512, 512), (7, 1000, 1000),
          (2048, 128, 4096), (64, 64, 64), (3, 512, 512), (300, 4096, 64))  # the last two: layers seen above
KEY = SelectionKey("gemm", "forward", "fp16", "sm_90")


@pytest.fixture(autouse=True)
def no_shipped_models(monkeypatch):
    """The tables here are synthetic: a model shipped for their key (gemm fp16 on sm_90) would order
    autotune's finalists, and its training problems may be among these shapes. Tests that want a
    model give one."""
    from tiledispatch.heuristics import learned

    monkeypatch.setattr(learned, "shipped", lambda key: None)


@pytest.fixture(scope="module")
def ranked():
    """Each problem with its accepted candidates in the rules' order."""
    arch = arch_facts.load("sm_90")
    dispatcher = Dispatcher(Registry.from_rule_set("gemm", "tiny", arch), arch)
    out = []
    for m, n, k in SHAPES:
        problem = GemmProblem(m=m, n=n, k=k, types=GemmTypes.parse("fp16"), layout=GemmLayout.parse("rcr"))
        out.append((problem, dispatcher.ranked(problem)))
    assert all(selection_key(p, "sm_90") == KEY for p, _ in out)
    return out


def make_table(ranked, time_of, status_of=lambda i, r, c: "ok") -> pd.DataFrame:
    """The sweep's table: time_of(problem index, rules rank, candidate) gives each row's ms."""
    rows = []
    for i, (problem, candidates) in enumerate(ranked):
        for r, c in enumerate(candidates):
            status = status_of(i, r, c)
            ms = time_of(i, r, c) if status == "ok" else float("nan")
            rows.append({"op": "gemm", "direction": "forward", "dtype": "fp16", "arch": "sm_90", "problem_set": "t",
                         "problem_id": problem_id(problem), "problem": canonical_json(problem),
                         "kernel": c.spec.name, "family": c.spec.family, "vendor": c.spec.family == "vendor",
                         "config": canonical_json(c.spec.config), "status": status,
                         "error": None if status == "ok" else "boom", "time_ms": ms, "rule_score": c.score.value,
                         "rule_rank": r, "gpu": "NVIDIA H200", "torch": "2.x", "triton": "3.x"})
    return pd.DataFrame(rows).reindex(columns=[c for c in COLUMNS if c in rows[0]])


def stats(report, picker: str) -> dict:
    return ev.summarize(report[KEY].outcomes[ev.Picker.parse(picker)], "gemm")


class TableModel:
    """A stand-in for learned.TrainedModel: predicts the table's own times (or their inverse)."""

    def __init__(self, frame, reverse=False, manifest=None, key=KEY) -> None:
        self.times = {(r.problem, r.config): r.time_ms for r in frame.itertuples()}
        self.reverse, self.manifest, self.key = reverse, manifest or {}, key

    def predict_cost(self, problem, configs, arch):
        assert arch.name == "sm_90"
        times = np.array([self.times[(canonical_json(problem), canonical_json(c))] for c in configs])
        times = np.nan_to_num(times, nan=1e9)
        return 1.0 / times if self.reverse else times


def test_rules_numbers_are_exact(ranked):
    # Even problems: the rules' top runs 2.0 ms where rank 1 runs 1.1 (efficiency 0.55); odd: the top is fastest.
    frame = make_table(ranked, lambda i, r, c: (2.0 if i % 2 == 0 else 0.9) if r == 0 else 1.0 + 0.1 * r)
    s = stats(ev.evaluate(frame, strategies=["rules"]), "rules")
    half = len(SHAPES) // 2
    assert s["problems"] == len(SHAPES) and s["failures"] == 0
    assert s["efficiency"]["mean"] == pytest.approx((0.55 + 1.0) / 2)
    assert s["efficiency"]["median"] == pytest.approx((0.55 + 1.0) / 2)
    assert s["efficiency"]["p10"] == pytest.approx(0.55) and s["efficiency"]["min"] == pytest.approx(0.55)
    assert s["top1"] == pytest.approx(0.5) and s["slower_than_2x"] == 0
    assert s["time_lost_ms"] == pytest.approx(half * 0.9)
    assert s["time_lost_fraction"] == pytest.approx(half * 0.9 / (half * 1.1 + half * 0.9))
    assert s["targets"]["mean_ge_0.97"] is False and s["targets"]["none_slower_than_2x"] is True
    assert [w["efficiency"] for w in s["worst"][:half]] == [pytest.approx(0.55)] * half
    # Against the vendor: its row's time over the pick's, problem by problem.
    expected = []
    for i, (_, candidates) in enumerate(ranked):
        r = next(r for r, c in enumerate(candidates) if c.spec.family == "vendor")
        vendor = (2.0 if i % 2 == 0 else 0.9) if r == 0 else 1.0 + 0.1 * r
        expected.append(vendor / (2.0 if i % 2 == 0 else 0.9))
    assert s["vs_vendor"]["problems"] == len(SHAPES)
    assert s["vs_vendor"]["geomean"] == pytest.approx(math.exp(statistics.fmean(map(math.log, expected))))
    assert s["vs_vendor"]["min"] == pytest.approx(min(expected))
    assert s["vs_vendor"]["below_floor"] == sum(e < 0.98 for e in expected)


def test_a_model_of_the_true_times_scores_1_and_a_reversed_one_the_worst(ranked):
    rng = np.random.default_rng(0)
    times = {(i, r): float(rng.uniform(0.5, 5.0)) for i, (_, cs) in enumerate(ranked) for r in range(len(cs))}
    frame = make_table(ranked, lambda i, r, c: times[(i, r)])
    best = ev.evaluate(frame, strategies=["model"], model=TableModel(frame), allow_seen=True)
    s = stats(best, "model")
    assert s["efficiency"]["mean"] == 1.0 and s["efficiency"]["min"] == 1.0 and s["top1"] == 1.0
    assert s["time_lost_ms"] == 0.0 and best[KEY].unseen == "unverified"
    worst = stats(ev.evaluate(frame, strategies=["model"], model=TableModel(frame, reverse=True)), "model")
    ratios = [min(times[(i, r)] for r in range(len(cs))) / max(times[(i, r)] for r in range(len(cs)))
              for i, (_, cs) in enumerate(ranked)]
    assert worst["efficiency"]["mean"] == pytest.approx(statistics.fmean(ratios))
    assert worst["efficiency"]["min"] == pytest.approx(min(ratios))
    assert worst["slower_than_2x"] == sum(r < 0.5 for r in ratios)


def test_failed_picks_count_as_zero_and_are_listed(ranked):
    # Problem 0: the rules' top faults. Problem 1: its top refuses the problem (not a candidate at all).
    # Problem 2: every row failed to build, so there is no oracle.
    def status(i, r, c):
        return {(0, 0): "fault", (1, 0): "unsupported"}.get((i, r), "build_failed" if i == 2 else "ok")

    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * r, status)
    report = ev.evaluate(frame, strategies=["rules", "vendor"])
    s = stats(report, "rules")
    assert report[KEY].without_oracle == (problem_id(ranked[2][0]),)
    assert s["problems"] == len(SHAPES) - 1 and s["failures"] == 1
    assert s["failed"] == [s["worst"][0]]
    assert s["failed"][0]["problem_id"] == problem_id(ranked[0][0]) and s["failed"][0]["status"] == "fault"
    assert s["failed"][0]["error"] == "boom" and s["failed"][0]["efficiency"] == 0.0
    assert s["efficiency"]["min"] == 0.0
    assert s["efficiency"]["mean"] == pytest.approx((len(SHAPES) - 2) / (len(SHAPES) - 1))  # the others hit
    assert s["vs_vendor"]["min"] == 0.0 and s["targets"]["none_slower_than_2x"] is False
    assert next(o for o in report[KEY].outcomes[ev.Picker.RULES]
                if o.problem_id == problem_id(ranked[1][0])).kernel == ranked[1][1][1].spec.name


@pytest.mark.parametrize("vendor_ms, keeps_vendor", [(1.015, True), (1.05, False)])
def test_autotune_times_its_finalists_and_keeps_the_vendor_within_its_margin(ranked, vendor_ms, keeps_vendor):
    # The rules' top runs 1.0 ms, the vendor vendor_ms, and the first candidate that is not a
    # finalist 0.5: the oracle, which autotune never times.
    finalists = [{c.spec.name for c in autotune.finalists(cs)} for _, cs in ranked]
    outside = [next((r for r, c in enumerate(cs) if c.spec.name not in names), None)
               for (_, cs), names in zip(ranked, finalists)]

    def time(i, r, c):
        return 1.0 if r == 0 else vendor_ms if c.spec.family == "vendor" else 0.5 if r == outside[i] else 3.0

    frame = make_table(ranked, time)
    outcomes = ev.evaluate(frame, strategies=["autotune"])[KEY].outcomes[ev.Picker.AUTOTUNE]
    assert any(o is not None for o in outside) and not all(cs[0].spec.family == "vendor" for _, cs in ranked)
    for i, ((_, candidates), outcome) in enumerate(zip(ranked, outcomes)):
        vendor_row = next(c for c in candidates if c.spec.family == "vendor")
        expected = vendor_row if keeps_vendor else candidates[0]
        assert outcome.kernel == expected.spec.name
        oracle = min(time(i, r, c) for r, c in enumerate(candidates))
        assert outcome.efficiency == pytest.approx(oracle / time(i, candidates.index(expected), expected))


def test_autotune_drops_a_finalist_that_failed_to_build_or_was_wrong_and_fails_on_one_that_faults(ranked):
    """As the dispatcher does: a finalist that fails to build, or whose result the reference refutes,
    is not timed; one that faults or hangs ends the tuning."""
    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * r,
                       lambda i, r, c: {(0, 0): "build_failed", (1, 0): "timeout", (2, 0): "wrong"}.get((i, r), "ok"))
    outcomes = ev.evaluate(frame, strategies=["autotune"])[KEY].outcomes[ev.Picker.AUTOTUNE]
    assert outcomes[0].status.value == "ok" and outcomes[0].kernel == ranked[0][1][1].spec.name
    assert outcomes[1].status.value == "timeout" and outcomes[1].efficiency == 0.0
    assert outcomes[2].status.value == "ok" and outcomes[2].kernel == ranked[2][1][1].spec.name


def test_missing_rule_scores_are_recomputed_as_the_rules_rank(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.01 * ((7 * r + i) % 5))
    with_scores = ev.evaluate(frame, strategies=["rules", "autotune"])
    without = ev.evaluate(frame.drop(columns=["rule_score", "rule_rank"]), strategies=["rules", "autotune"])
    rescored = ev.evaluate(frame, strategies=["rules", "autotune"], rescore=True)
    for picker in (ev.Picker.RULES, ev.Picker.AUTOTUNE):
        picks = [o.kernel for o in with_scores[KEY].outcomes[picker]]
        assert picks == [o.kernel for o in without[KEY].outcomes[picker]]
        assert picks == [o.kernel for o in rescored[KEY].outcomes[picker]]
    assert [o.kernel for o in with_scores[KEY].outcomes[ev.Picker.RULES]] == [cs[0].spec.name for _, cs in ranked]


def test_a_kernel_todays_rules_refuse_is_no_candidate_when_rescored(ranked, monkeypatch):
    """A rule added since the sweep (a kernel found wrong, say): --rescore judges what the
    dispatcher offers today, so the refused kernel is neither a pick nor the oracle."""
    import dataclasses
    import types

    frame = make_table(ranked, lambda i, r, c: 0.5 if r == 0 else 1.0 + 0.01 * r)
    refused = {canonical_json(cs[0].spec.config) for _, cs in ranked}  # each problem's fastest, the rules' first
    gemm = ev.get_op("gemm")
    now = dataclasses.replace(gemm, validate=lambda config, arch: types.SimpleNamespace(
        ok=canonical_json(config) not in refused and gemm.validate(config, arch).ok))
    before = ev.evaluate(frame, strategies=["rules", "autotune"])[KEY]
    monkeypatch.setattr(ev, "get_op", lambda op: now)
    after = ev.evaluate(frame, strategies=["rules", "autotune"], rescore=True)[KEY]
    names = {cs[0].spec.name for _, cs in ranked}
    assert all(o.kernel in names and o.oracle_ms == 0.5 for o in before.outcomes[ev.Picker.RULES])
    for picker in (ev.Picker.RULES, ev.Picker.AUTOTUNE):
        assert all(o.kernel not in names and o.oracle_kernel not in names and o.oracle_ms > 0.5
                   for o in after.outcomes[picker])


def test_holdout_folds_are_disjoint_by_problem_and_cover_the_table(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + r)
    folds = [ev.holdout_ids(frame, ev.Fold(f, 3)) for f in range(3)]
    assert set().union(*folds) == set(frame["problem_id"])
    assert sum(map(len, folds)) == frame["problem_id"].nunique()
    for f, ids in enumerate(folds):
        report = ev.evaluate(frame, strategies=["rules"], holdout=ev.Fold(f, 3))
        judged = {o.problem_id for o in report[KEY].outcomes[ev.Picker.RULES]} if report.keys else set()
        assert judged == ids and report.holdout == {"kind": "fold", "fold": f, "folds": 3}
    some = [problem_id(p) for p, _ in ranked[:3]]
    assert ev.holdout_ids(frame, some) == set(some) == ev.holdout_ids(frame, frame[frame.problem_id.isin(some)])
    with pytest.raises(ev.InvalidArgumentError, match="fold"):
        ev.Fold(3, 3)


def test_a_model_that_saw_the_problems_is_refused_unless_allowed(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + r)
    ids = sorted(frame["problem_id"].unique())
    seen = TableModel(frame, manifest={"problem_ids": ids[:2], "rows": 10})
    with pytest.raises(ev.EvaluationError, match="training problems.*--allow-seen"):
        ev.evaluate(frame, strategies=["model"], model=seen)
    report = ev.evaluate(frame, strategies=["model"], model=seen, allow_seen=True)
    assert report[KEY].unseen.startswith("seen (allowed)") and report[KEY].model == {"problem_ids": ids[:2],
                                                                                      "rows": 10}
    unseen = ev.evaluate(frame, strategies=["model"], model=seen, holdout=ids[2:])
    assert unseen[KEY].unseen == "verified"
    training = pytest.importorskip("tiledispatch.heuristics.training")
    hashed = TableModel(frame, manifest={"data_hash": training.data_hash(training.rows_of(frame, KEY))})
    with pytest.raises(ev.EvaluationError, match="data hash"):
        ev.evaluate(frame, strategies=["model"], model=hashed, holdout=ids[2:])
    other = TableModel(frame, key=SelectionKey("gemm", "forward", "bf16", "sm_90"))
    skipped = ev.evaluate(frame, strategies=["rules", "model"], model=other)[KEY]
    assert ev.Picker.MODEL not in skipped.outcomes and "gemm_forward_bf16" in skipped.skipped[ev.Picker.MODEL]


@pytest.mark.parametrize("by", ["problem_id", "group_id"])
def test_cross_validation_judges_every_problem_once_by_a_model_that_never_saw_it(ranked, by):
    from tiledispatch.bench.problemsets import with_groups

    frame = with_groups(make_table(ranked, lambda i, r, c: 1.0 + 0.1 * ((3 * r + i) % 7)))
    assert frame.groupby("group_id")["problem_id"].nunique().max() == 2  # two layers at two token counts
    trained = []

    def train(rows, key, folds, seed):
        assert key == KEY and folds == 2 and seed == 4
        trained.append(set(rows[by]))
        return TableModel(frame)

    report = ev.cross_validate(frame, folds=3, seed=4, train=train, by=by)
    outcomes = report[KEY].outcomes[ev.Picker.MODEL]
    judged = [o.problem_id for o in outcomes]
    assert sorted(judged) == sorted(frame["problem_id"].unique())  # each once
    for f, seen in enumerate(trained):
        held = {g for g in frame[by] if ev.fold_of(g, 3) == f}
        assert not seen & held and seen | held == set(frame[by])
    assert report[KEY].unseen == "held out" and stats(report, "model")["efficiency"]["mean"] == 1.0
    assert set(report[KEY].outcomes) == set(ev.STANDARD)


def test_cli_writes_one_json_document(ranked, tmp_path):
    from typer.testing import CliRunner

    from tiledispatch.cli.main import app

    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * ((5 * r + i) % 4))
    path = tmp_path / "sweep.parquet"
    frame.to_parquet(path)
    out = tmp_path / "evaluation.json"
    result = CliRunner().invoke(app, ["evaluate", str(path), "--strategies", "rules,autotune,vendor", "--op", "gemm",
                                      "--worst", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document == json.loads(result.output)
    assert document["command"].startswith("tiledispatch evaluate ") and "--worst 3" in document["command"]
    assert document["provenance"]["gpu"] == {"NVIDIA H200": len(frame)}
    (entry,) = document["keys"]
    assert entry["name"] == "gemm_forward_fp16" and entry["problems"] == len(SHAPES)
    expected = ev.evaluate(frame, strategies=["rules", "autotune", "vendor"]).to_dict(worst=3)["keys"][0]
    assert entry["strategies"] == json.loads(json.dumps(expected["strategies"]))
    assert len(entry["strategies"]["rules"]["worst"]) == 3
    layers = CliRunner().invoke(app, ["evaluate", str(path), "--strategies", "rules", "--by-layer", "--folds", "3",
                                      "--holdout-fold", "1"])
    from tiledispatch.bench.problemsets import with_groups

    grouped = with_groups(frame)
    held = grouped.loc[[ev.fold_of(g, 3) == 1 for g in grouped["group_id"]], "problem_id"].nunique()
    assert layers.exit_code == 0 and json.loads(layers.output)["keys"][0]["problems"] == held > 0
    bad = CliRunner().invoke(app, ["evaluate", str(path), "--dtype", "bf16"])
    assert bad.exit_code == 3 and "--dtype bf16" in json.loads(bad.output)["error"]["message"]
    frame.drop(columns=["status"]).to_parquet(path)
    bad = CliRunner().invoke(app, ["evaluate", str(path)])
    assert bad.exit_code == 3 and "status" in json.loads(bad.output)["error"]["message"]


def test_cli_cross_validates_with_the_learned_model(ranked, tmp_path):
    pytest.importorskip("tiledispatch.heuristics.learned")
    from typer.testing import CliRunner

    from tiledispatch.cli.main import app

    # Times that the features explain: the rules' rank, a little noise.
    rng = np.random.default_rng(1)
    frame = make_table(ranked, lambda i, r, c: (1.0 + 0.2 * r) * float(rng.uniform(0.98, 1.02)))
    frame.to_parquet(tmp_path / "sweep.parquet")
    result = CliRunner().invoke(app, ["evaluate", str(tmp_path / "sweep.parquet"), "--cv", "--folds", "3"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["keys"]
    assert entry["unseen"] == "held out" and len(entry["model"]) == 3  # a manifest per fold
    model = entry["strategies"]["model"]
    assert model["problems"] == len(SHAPES) and model["failures"] == 0 and 0 < model["efficiency"]["min"] <= 1


# --- defects guarded ------------------------------------------------------------------------


def test_p10_is_the_nearest_rank_and_training_reports_the_same():
    training = pytest.importorskip("tiledispatch.heuristics.training")
    values = [0.5, 0.9] + [1.0] * 8  # ten problems: one in ten (the 0.5) is at or below the P10
    assert ev.p10(values) == 0.5 and ev.p10(values[1:]) == 0.9 and ev.p10([0.7]) == 0.7
    assert ev.p10([i / 153 for i in range(153)]) == 15 / 153  # 16 of 153 at or below it
    rng = np.random.default_rng(3)
    ids = np.repeat(np.array([f"p{i:02d}" for i in range(20)]), 6)
    log_ms, costs = rng.normal(0, 0.3, len(ids)), rng.normal(0, 1, len(ids))
    picked = [float(np.exp(log_ms[i:i + 6].min() - log_ms[i:i + 6][np.argmin(costs[i:i + 6])]))
              for i in range(0, len(ids), 6)]
    cv = training.selection(log_ms, costs, ids)
    assert cv["p10"] == pytest.approx(ev.p10(picked)) and cv["mean"] == pytest.approx(statistics.fmean(picked))
    assert cv["top1"] == pytest.approx(sum(e >= 1 / 1.01 for e in picked) / 20)


def test_a_report_without_the_key_raises_key_error(ranked):
    report = ev.evaluate(make_table(ranked, lambda i, r, c: 1.0 + r), strategies=["rules"])
    with pytest.raises(KeyError, match="gemm.*bf16"):
        report[SelectionKey("gemm", "forward", "bf16", "sm_90")]


def test_holdout_counts_the_tables_problems_and_refuses_none(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + r)
    some = [problem_id(p) for p, _ in ranked[:2]]
    report = ev.evaluate(frame, strategies=["rules"], holdout=some + ["not-a-problem-of-the-table"])
    assert report.holdout == {"kind": "problems", "problems": 2}
    assert len(report[KEY].outcomes[ev.Picker.RULES]) == 2
    with pytest.raises(ev.EvaluationError, match="names none of the table's 10 problems"):
        ev.evaluate(frame, strategies=["rules"], holdout=["not-a-problem-of-the-table"])


def test_a_model_of_another_key_is_never_applied(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * ((3 * r + i) % 7))
    other = TableModel(frame, key=SelectionKey("gemm", "forward", "bf16", "sm_90"))
    report = ev.evaluate(frame, strategies=["rules", "model"], model={KEY: other})[KEY]
    assert ev.Picker.MODEL not in report.outcomes and "ranks gemm_forward_bf16" in report.skipped[ev.Picker.MODEL]


def test_bad_frames_and_groupings_are_refused_naming_the_argument(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + r)
    with pytest.raises(ev.InvalidArgumentError, match="frame must be a pandas DataFrame"):
        ev.evaluate("sweep.parquet")
    with pytest.raises(ev.InvalidArgumentError, match="by='group_id'.*with_groups"):
        ev.cross_validate(frame, folds=3, by="group_id", train=lambda *a, **k: None)


def test_merged_folds_say_where_a_strategy_was_left_out(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * ((3 * r + i) % 7))
    folds = {f: {problem_id(p) for p, _ in ranked if ev.fold_of(problem_id(p), 3) == f} for f in range(3)}
    assert all(folds.values())
    # fold 0 has no model (its training rows had none ok, say); folds 1 and 2 have one
    parts = [ev.evaluate(frame, strategies=["rules", "model"], holdout=sorted(folds[f]),
                         model=TableModel(frame) if f else {}, held_out=True) for f in range(3)]
    merged = ev.merge(parts, {"kind": "test"})[KEY]
    assert len(merged.outcomes[ev.Picker.MODEL]) == len(folds[1]) + len(folds[2])
    assert merged.skipped[ev.Picker.MODEL].startswith("in 1 of 3 parts: no model for gemm_forward_fp16")


def test_cli_reads_a_sweeps_directory_and_checks_its_options(ranked, tmp_path):
    from typer.testing import CliRunner

    from tiledispatch.cli.main import app

    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * ((5 * r + i) % 4))
    parts = tmp_path / "sweep"
    parts.mkdir()
    half = len(frame) // 2
    frame.iloc[:half].to_parquet(parts / "part-0.parquet")
    frame.iloc[half:].to_parquet(parts / "part-1.parquet")
    (parts / "sweep.json").write_text("{}")  # a sweep's report beside its parts is not a part
    result = CliRunner().invoke(app, ["evaluate", str(parts), "--strategies", "rules"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["keys"][0]["problems"] == len(SHAPES)
    for options in (["--model", str(tmp_path / "no-such-models")], ["--cv", "--seed", str(2**31)]):
        bad = CliRunner().invoke(app, ["evaluate", str(parts), *options])
        assert bad.exit_code == 2, bad.output


def test_a_problem_this_version_cannot_read_is_an_evaluation_error_or_shown_raw(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + r)
    first = frame["problem_id"] == frame["problem_id"].iloc[0]
    future = frame.loc[first, "problem"].str.replace('{"alignment"', '{"future_field":1,"alignment"', regex=False)
    frame.loc[first, "problem"] = future
    s = stats(ev.evaluate(frame, strategies=["rules"]), "rules")  # the table's scores: nothing to rebuild
    assert s["problems"] == len(SHAPES) and any(isinstance(w["problem"], str) and "future_field" in w["problem"]
                                                for w in s["worst"])
    with pytest.raises(ev.EvaluationError, match="problem .*future_field.* is not a gemm problem this tiledispatch"):
        ev.evaluate(frame, strategies=["rules"], rescore=True)
    training = pytest.importorskip("tiledispatch.heuristics.training")
    data = training.featurize(training.rows_of(frame, KEY), KEY)
    assert dict(data.skipped) == {"problem unreadable": 1} and len(set(data.problem_ids)) == len(SHAPES) - 1


def test_the_model_reads_its_keys_arch_whatever_arch_the_rules_score_with(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * ((3 * r + i) % 7))
    report = ev.evaluate(frame, strategies=["rules", "model"], model=TableModel(frame), arch="sm_80",
                         rescore=True, allow_seen=True)  # TableModel asserts it is given sm_90's facts
    assert stats(report, "model")["efficiency"]["mean"] == 1.0


def test_a_missing_or_textual_vendor_flag_is_read_as_it_means(ranked):
    frame = make_table(ranked, lambda i, r, c: 1.0 + 0.1 * r)
    expected = [o.kernel for o in ev.evaluate(frame, strategies=["vendor"])[KEY].outcomes[ev.Picker.VENDOR]]
    as_float = frame.assign(vendor=[1.0 if v else math.nan for v in frame["vendor"]])  # pandas' NaN for missing
    as_text = frame.assign(vendor=[str(v) for v in frame["vendor"]])  # "True" / "False"
    for table in (as_float, as_text):
        outcomes = ev.evaluate(table, strategies=["vendor"])[KEY].outcomes[ev.Picker.VENDOR]
        assert [o.kernel for o in outcomes] == expected and all("vendor" in k for k in expected)
