"""Learned selection: features, training, the model files, and the `model` strategy, on a synthetic table.

The table's times come from a known formula (the rules' modelled time, with corrections the
rules do not know: a family and a tile depth faster, the vendor slower) plus 3 % noise, over
real tiny-rule-set GEMM configs and problems on sm_90; nothing here runs a kernel.
"""

import ast
import json
import math
from pathlib import Path

import numpy as np
import torch
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("lightgbm")
pytest.importorskip("pyarrow")

import tiledispatch  # noqa: E402
from tiledispatch import arch  # noqa: E402
from tiledispatch.bench.table import COLUMNS, SelectionKey, Status, canonical_json, problem_id  # noqa: E402
from tiledispatch.core.dispatcher import Dispatcher, Strategy, default_strategy  # noqa: E402
from tiledispatch.core.dtypes import DType  # noqa: E402
from tiledispatch.core.errors import UnsupportedError  # noqa: E402
from tiledispatch.core.op import RuleSet, get_op  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.heuristics import features, learned, training  # noqa: E402
from tiledispatch.heuristics.features import Column, FeatureSpec, Kind, ModelFormatError, Source  # noqa: E402
from tiledispatch.ops.gemm.problem import Align, Alignment, Epilogue, GemmLayout, GemmProblem, GemmTypes  # noqa: E402

SM90, INTERP = arch.load("sm_90"), arch.load("interpreter")
GEMM = get_op("gemm")
KEY = SelectionKey("gemm", "forward", "fp16", "sm_90")


def true_ms(spec, problem) -> float:
    """The synthetic GPU: the rules' modelled time, corrected where the rules are wrong."""
    ms = GEMM.rule_score(spec.config, problem, SM90).terms["modelled_us"] * 1e-3
    if spec.family == "tma-persistent":
        ms *= 0.6
    if spec.family == "vendor":
        ms *= 1.3
    if getattr(spec.config, "block_m", 0) == 16:
        ms *= 0.85
    return ms


def problems(count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [GEMM.problem_type(m=int(2 ** rng.uniform(0, 13)), n=int(2 ** rng.uniform(3, 13)),
                              k=int(2 ** rng.uniform(4, 13))) for _ in range(count)]


@pytest.fixture(scope="module")
def rules() -> Dispatcher:
    return Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90), SM90, strategy=Strategy.RULES)


def synthetic_table(rules: Dispatcher, count: int = 36, seed: int = 0) -> "pd.DataFrame":
    rng = np.random.default_rng(seed + 1)
    rows = []
    for problem in problems(count, seed):
        for rank, candidate in enumerate(rules.ranked(problem)):
            spec = candidate.spec
            row = dict.fromkeys(COLUMNS)
            row.update(op="gemm", direction="forward", dtype="fp16", arch="sm_90", problem_set="synthetic",
                       problem_id=problem_id(problem), problem=canonical_json(problem), kernel=spec.name,
                       family=spec.family, vendor=spec.family == "vendor", config=canonical_json(spec.config),
                       status=Status.OK.value, time_ms=true_ms(spec, problem) * math.exp(rng.normal(0, 0.03)),
                       gpu="synthetic-h200", rule_score=candidate.score.value, rule_rank=rank)
            rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    failed = frame.iloc[:3].assign(status=Status.FAULT.value, time_ms=None)  # never learned from
    return pd.concat([frame, failed], ignore_index=True)


@pytest.fixture(scope="module")
def table(rules):
    return synthetic_table(rules)


@pytest.fixture(scope="module")
def model(table):
    return learned.train(table, KEY, folds=3, seed=0)


class OneModel:
    """A model source that gives every problem `predictor` on every arch: a stand-in model whose
    costs a test chooses, in place of the shipped ones."""

    def __init__(self, predictor):
        self.predictor = predictor

    def model_for(self, problem, arch):
        return self.predictor

    def ships(self, arch):
        return True


def efficiency(order_times: np.ndarray, picked: int) -> float:
    return float(order_times.min() / order_times[picked])


# --- training ------------------------------------------------------------------------------


def test_the_model_picks_the_formulas_best_on_problems_it_never_saw(model, rules):
    by_model, by_rules = [], []
    for problem in problems(20, seed=99):
        ranked = rules.ranked(problem)
        times = np.array([true_ms(c.spec, problem) for c in ranked])
        predicted = model.predict_cost(problem, [c.spec.config for c in ranked], SM90)
        assert predicted.shape == (len(ranked),) and np.all(np.isfinite(predicted))
        by_model.append(efficiency(times, int(np.argmin(predicted))))
        by_rules.append(efficiency(times, 0))
    assert np.mean(by_model) >= 0.97 and min(by_model) >= 0.85, by_model
    assert np.mean(by_model) > np.mean(by_rules) + 0.05  # it learned what the rules do not know


def test_the_manifest_says_what_the_model_learned_from(model, table):
    m = model.manifest
    ok = table[table["status"] == "ok"]
    assert m["key"] == {"op": "gemm", "direction": "forward", "dtype": "fp16", "arch": "sm_90"}
    assert (m["rows"], m["problems"]) == (len(ok), ok["problem_id"].nunique())
    assert m["problem_ids"] == sorted(ok["problem_id"].unique()) and m["gpus"] == ["synthetic-h200"]
    assert m["data_hash"] == learned.data_hash(table) == learned.data_hash(training.rows_of(table, KEY))
    cv = m["cv"]
    assert cv["folds"] == 3 and 0.8 < cv["selection"]["mean"] <= 1.0 and cv["selection"]["problems"] == m["problems"]
    assert m["trees"] == training.ROUNDS and m["lightgbm"] and m["params"]["seed"] == 0
    assert model.booster.num_trees() == m["trees"]


def test_cross_validation_holds_each_problem_out_once(table):
    from tiledispatch.bench.problemsets import fold_of

    data = training.featurize(training.rows_of(table, KEY), KEY)
    cv = training.cross_validate(data, 3, {**training.DEFAULT_PARAMS, "seed": 0})
    ids = sorted(set(data.problem_ids))
    assert cv["selection"]["problems"] == len(ids)  # every problem predicted once, by a model without it
    assert sorted(cv["folds_used"]) == sorted({fold_of(i, 3) for i in ids})


def test_training_refuses_a_key_without_rows_and_a_table_without_columns(table):
    with pytest.raises(UnsupportedError, match="no ok rows of gemm forward bf16 on sm_90.*fp16"):
        learned.train(table, SelectionKey("gemm", "forward", "bf16", "sm_90"))
    with pytest.raises(UnsupportedError, match=r"lacks the column\(s\) \['time_ms'\]"):
        learned.train(table.drop(columns=["time_ms"]), KEY)
    with pytest.raises(ValueError, match="folds must be a positive integer"):
        learned.train(table, KEY, folds=0)


# --- features ------------------------------------------------------------------------------


def test_features_are_read_generically_and_the_spec_fixes_them(model):
    names = {c.name: c for c in model.spec.columns}
    assert names["problem.m"].transform is features.Transform.LOG2  # a size
    assert names["config.family"].kind is Kind.CATEGORY and "tma-persistent" in names["config.family"].vocabulary
    for name in ("derived.log2_flops", "derived.log2_intensity", "score.value", "score.waves", "score.tile_m",
                 "arch.sm_count", "arch.l2_bytes", "arch.memory_bandwidth_gbs", "kernel.family"):
        assert name in names, name
    problem = problems(1, seed=5)[0]
    config = next(c for c in GEMM.rule_sets[RuleSet.TINY]() if GEMM.family_of(c) == "tiled")
    row = model.featurizer.matrix(problem, [config], SM90)[0]
    column = list(names).index
    assert row[column("problem.m")] == pytest.approx(math.log2(1 + problem.m))
    assert row[column("config.block_m")] == config.block_m
    assert row[column("arch.sm_count")] == SM90.sm_count
    assert row[column("score.value")] == pytest.approx(GEMM.rule_score(config, problem, SM90).value)


def test_an_unknown_category_and_a_missing_field_are_missing_values():
    column = Column(Source.CONFIG, "family", Kind.CATEGORY, vocabulary=("tiled", "vendor"))
    assert column.encode("vendor") == 1.0 and math.isnan(column.encode("warp-special")) and math.isnan(column.encode(None))
    spec = FeatureSpec("gemm", (Column(Source.CONFIG, "block_m"), Column(Source.CONFIG, "no_such_field"), column))
    vendor = next(c for c in GEMM.rule_sets[RuleSet.TINY]() if GEMM.family_of(c) == "vendor")
    row = features.Featurizer(spec).matrix(problems(1, 0)[0], [vendor], SM90)[0]
    assert math.isnan(row[0]) and math.isnan(row[1]) and row[2] == 1.0  # a vendor config has no block_m


def test_a_problems_columns_are_its_flattened_fields_read_field_by_field():
    """The featurizer keeps each dtype, layout, epilogue and alignment's codes for the next problem
    holding them: a row is still every leaf of the problem, encoded, the unknown categories named."""
    model = learned.shipped(SelectionKey("gemm", "forward", "bf16", "sm_90"))
    featurizer, group = model.featurizer, [c for c in model.spec.columns if c.source is Source.PROBLEM]
    bf16, unaligned = GemmTypes.parse("bf16"), Alignment(a=Align.NONE, m=Align.BYTES16)
    posed = [GemmProblem(m, n, k, batch, types, GemmLayout.parse(layout), Epilogue(bias), alignment)
             for m, n, k, batch in ((1, 4096, 4096, 1), (333, 1000, 64, 8), (8192, 8192, 8192, 1))
             for types in (bf16, GemmTypes.parse("fp16")) for layout in ("rcr", "crr", "rss")
             for bias in (False, True) for alignment in (Alignment(), unaligned)]
    for problem in posed + posed:  # the second time round, from the kept codes
        values = features.problem_values(problem)
        expected = [c.encode(values.get(c.path)) for c in group]
        np.testing.assert_array_equal(featurizer._problem(problem)[1], expected)
        assert featurizer.unknown_categories(problem) == tuple(
            f"{c.path}={values[c.path]!r}" for c, code in zip(group, expected)
            if c.kind is Kind.CATEGORY and math.isnan(code) and values.get(c.path) is not None)
    assert any(featurizer.unknown_categories(p) for p in posed) and not featurizer.unknown_categories(posed[0])


def test_the_spec_round_trips_through_json(model):
    data = json.loads(json.dumps(model.spec.to_dict()))
    assert FeatureSpec.from_dict(data) == model.spec


@pytest.mark.parametrize("tamper, message", [
    (lambda d: d.update(format=99), "format 99 is not 1"),
    (lambda d: d["columns"][0].update(kind="colour"), r"columns\[0\].*'colour' is not a valid Kind"),
    (lambda d: d["columns"][0].update(vocabulary=["a", "a"]), r"columns\[0\].*vocabulary of distinct strings"),
    (lambda d: d["columns"].append(dict(d["columns"][0])), "two columns share a name"),
    (lambda d: d.pop("op"), "expected an object with keys format, op and columns"),
])
def test_a_bad_spec_is_refused_saying_what_is_wrong(model, tamper, message):
    data = json.loads(json.dumps(model.spec.to_dict()))
    tamper(data)
    with pytest.raises(ModelFormatError, match=message):
        FeatureSpec.from_dict(data)


# --- files ---------------------------------------------------------------------------------


def test_save_and_load_give_identical_predictions(model, rules, tmp_path):
    paths = model.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["gemm_forward_fp16.txt", "gemm_forward_fp16.features.json", "gemm_forward_fp16.manifest.json"])
    for path in paths.values():
        path.read_text(encoding="utf-8")  # text, not a pickle
    assert json.loads(paths["manifest"].read_text())["files"]["gemm_forward_fp16.txt"]
    loaded = learned.load(tmp_path, KEY)
    assert loaded.spec == model.spec and loaded.manifest["data_hash"] == model.manifest["data_hash"]
    for problem in problems(5, seed=7):
        configs = [c.spec.config for c in rules.ranked(problem)]
        np.testing.assert_array_equal(loaded.predict_cost(problem, configs, SM90), model.predict_cost(problem, configs, SM90))
    nested = tmp_path / "out"
    model.save(nested / "sm_90")  # as `tiledispatch train --out` lays them out
    assert learned.load(nested, KEY).manifest["rows"] == model.manifest["rows"]
    assert [m.key for m in learned.load_directory(nested)] == [KEY]


def test_a_tampered_file_is_refused_clearly(model, tmp_path):
    paths = model.save(tmp_path)
    spec = json.loads(paths["features"].read_text())
    spec["columns"][0]["transform"] = "none"
    paths["features"].write_text(json.dumps(spec))
    with pytest.raises(ModelFormatError, match="gemm_forward_fp16.features.json is not the file its manifest"):
        learned.load(tmp_path, KEY)
    model.save(tmp_path)
    paths["model"].write_text(paths["model"].read_text().replace("num_leaves=", "num_leaves=1", 1))
    with pytest.raises(ModelFormatError, match="gemm_forward_fp16.txt is not the file its manifest"):
        learned.load(tmp_path, KEY)
    model.save(tmp_path)
    other = SelectionKey("gemm", "forward", "fp16", "sm_80")
    with pytest.raises(FileNotFoundError):
        learned.load(tmp_path, SelectionKey("gemm", "forward", "bf16", "sm_90"))
    manifest = json.loads(paths["manifest"].read_text())
    manifest["key"] = other.__dict__
    paths["manifest"].write_text(json.dumps(manifest))
    with pytest.raises(ModelFormatError, match="its key .* is not"):
        learned.load(tmp_path, KEY)


def test_no_pickle_in_the_learned_modules():
    folder = Path(tiledispatch.__file__).parent / "heuristics"
    for name in ("features.py", "learned.py", "training.py", "evaluate.py", "outcomes.py"):
        tree = ast.parse((folder / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"pickle", "joblib", "cloudpickle", "dill"}, name


# --- the model strategy -------------------------------------------------------------------------


def test_the_model_strategy_orders_candidates_by_their_costs(model, rules):
    registry = Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90)
    dispatcher = Dispatcher(registry, SM90, strategy="model", models=learned.Models([model]))
    problem = problems(1, seed=42)[0]
    ranked = dispatcher.ranked(problem)
    predicted = [c.model_cost for c in ranked]
    assert predicted == sorted(predicted) and len(ranked) == len(rules.ranked(problem))
    stand_in = get_op("gemm").ranking_problem(problem)  # its bucket's problem ranks it (core.arith.rank_bucket)
    expected = model.predict_cost(stand_in, [c.spec.config for c in ranked], SM90)
    np.testing.assert_allclose(predicted, expected, rtol=1e-12)
    assert {c.spec.name for c in ranked} == {c.spec.name for c in rules.ranked(problem)}
    assert dispatcher.select(problem) == ranked[0].spec
    explained = dispatcher.explain(problem).to_dict(limit=3)
    assert explained["strategy"] == "model" and explained["model"] == model.label
    assert explained["selected"] == ranked[0].spec.name
    assert [e["model_cost"] for e in explained["ranking"]] == pytest.approx(predicted[:3], rel=1e-5)
    assert all("score" in e for e in explained["ranking"])  # the rules' scores stay visible


def test_autotune_takes_its_finalists_from_the_models_order_where_a_model_covers_the_problem(model, rules):
    """On the H200's conv sweep the model's finalists lifted autotune's mean from 0.924 to 0.970 of the
    oracle (docs/selection.md): autotune ranks as the model strategy does, then times the first few."""
    from tiledispatch.heuristics import autotune

    registry = Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90)
    models = learned.Models([model])
    tuned = Dispatcher(registry, SM90, strategy="autotune", models=models)
    ranked = Dispatcher(registry, SM90, strategy="model", models=models)
    problem = problems(1, seed=42)[0]
    order = [c.spec.name for c in tuned.ranked(problem)]
    assert order == [c.spec.name for c in ranked.ranked(problem)]
    assert order != [c.spec.name for c in rules.ranked(problem)]  # the model reorders this problem's candidates
    assert [c.spec.name for c in autotune.finalists(tuned.ranked(problem))][0] == order[0]


def test_without_a_model_for_the_slice_the_model_strategy_ranks_by_rules(model, rules):
    fp16 = problems(1, seed=43)[0]
    bf16 = GEMM.problem_type(m=300, n=200, k=100, types=GemmTypes(DType.BF16, DType.BF16, DType.BF16, DType.FP32, False))
    sm80 = arch.load("sm_80")
    cases = [(learned.Models([]), SM90, fp16, rules), (learned.Models([model]), SM90, bf16, rules),
             (learned.Models([model]), sm80, fp16, Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, sm80), sm80))]
    for models, on, problem, by_rules in cases:
        dispatcher = Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, on), on, strategy="model", models=models)
        ranked = dispatcher.ranked(problem)
        assert ranked and [c.spec for c in ranked] == [c.spec for c in by_rules.ranked(problem)]
        assert all(c.model_cost is None for c in ranked)
        explained = dispatcher.explain(problem)
        assert explained.model is None and explained.selected == ranked[0].spec
        assert "model" not in explained.to_dict() and "model_cost" not in json.dumps(explained.to_dict())


def test_a_model_given_in_place_of_a_source_is_refused(model):
    from tiledispatch.core.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="models must be a model source.*got TrainedModel"):
        Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90), SM90, strategy="model", models=model)


def test_the_default_strategy_is_model_only_where_models_ship(model, monkeypatch):
    monkeypatch.delenv("TILEDISPATCH_STRATEGY", raising=False)
    assert default_strategy(SM90, learned.Models([model])) is Strategy.MODEL
    assert default_strategy(INTERP, learned.Models([model])) is Strategy.RULES
    assert default_strategy(INTERP) is Strategy.RULES  # the interpreter never ships one
    assert learned.shipped(SelectionKey("gemm", "forward", "fp16", "interpreter")) is None
    assert not learned.ShippedModels().ships(INTERP)
    monkeypatch.setenv("TILEDISPATCH_STRATEGY", "autotune")
    assert default_strategy(SM90, learned.Models([model])) is Strategy.AUTOTUNE


@pytest.fixture
def shipped_in(tmp_path, monkeypatch):
    """A temporary folder in place of `tiledispatch/arch/models/`, the shipped models' memos cleared."""
    monkeypatch.setattr(learned, "_shipped_folder", lambda arch_name: tmp_path / arch_name)
    learned.clear_shipped()
    yield tmp_path
    learned.clear_shipped()


def test_a_shipped_model_ranks_by_default_on_its_arch(model, shipped_in, monkeypatch, caplog):
    monkeypatch.delenv("TILEDISPATCH_STRATEGY", raising=False)
    model.save(shipped_in / "sm_90")
    assert learned.shipped_keys("sm_90") == {KEY} and learned.shipped(KEY).label == model.label
    assert default_strategy(SM90) is Strategy.MODEL and default_strategy(arch.load("sm_80")) is Strategy.RULES
    dispatcher = Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90), SM90, strategy="model")
    problem = problems(1, seed=44)[0]
    assert dispatcher.explain(problem).model == model.label  # the registered source: the shipped models
    (shipped_in / "sm_90" / "gemm_forward_fp16.txt").write_text("tree\n")
    learned.clear_shipped()
    fresh = Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90), SM90, strategy="model")
    assert fresh.explain(problem).model is None  # a broken shipped model: the rules rank, and it is logged
    assert "cannot be used" in caplog.text and "ranking by rules" in caplog.text


# --- the command ------------------------------------------------------------------------------


def test_tiledispatch_train_writes_a_model_per_key(table, tmp_path):
    from typer.testing import CliRunner

    from tiledispatch.cli.main import app

    parts = tmp_path / "sweep"
    parts.mkdir()
    half = len(table) // 2
    table.iloc[:half].to_parquet(parts / "part-0.parquet")
    table.iloc[half:].to_parquet(parts / "part-1.parquet")
    out = tmp_path / "models"
    result = CliRunner().invoke(app, ["train", str(parts), "--out", str(out), "--folds", "2", "--dtype", "fp16"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    (entry,) = summary["models"]
    assert (entry["op"], entry["dtype"], entry["arch"]) == ("gemm", "fp16", "sm_90")
    assert entry["problems"] == table["problem_id"].nunique() and entry["cv"]["folds"] == 2
    assert learned.load(out, KEY).manifest["data_hash"] == learned.data_hash(table)
    result = CliRunner().invoke(app, ["train", str(parts), "--out", str(out), "--dtype", "bf16"])
    assert result.exit_code == 3 and "no ok rows" in json.loads(result.output)["error"]["message"]


# --- defects guarded ------------------------------------------------------------------------


def test_a_model_whose_objective_is_not_a_rankers_is_refused(model, tmp_path):
    """A regression of log time scores the slower kernel higher: predict_cost (the negated score)
    would rank the slowest first, so such a model file is refused, as training refuses the objective."""
    import lightgbm

    text = model.booster.model_to_string()
    assert "\nobjective=lambdarank" in text
    regression = lightgbm.Booster(model_str=text.replace("\nobjective=lambdarank", "\nobjective=regression", 1))
    learned.TrainedModel(KEY, model.spec, regression, model.manifest).save(tmp_path)  # hashes that match
    with pytest.raises(ModelFormatError, match="objective 'regression' is not a ranker's"):
        learned.load(tmp_path, KEY)
    with pytest.raises(ValueError, match="objective 'regression' is not a ranker's"):
        learned.train(pd.DataFrame(columns=list(COLUMNS)), KEY, params={"objective": "regression"})


def test_threads_meeting_a_slice_first_load_its_shipped_model_once(model, shipped_in, monkeypatch):
    import threading

    model.save(shipped_in / "sm_90")
    loads, real_load = [], learned.load

    def slow_load(directory, key):
        loads.append(key)
        threading.Event().wait(0.2)  # long enough for every thread to ask meanwhile
        return real_load(directory, key)

    monkeypatch.setattr(learned, "load", slow_load)
    problem, barrier, found = problems(1, seed=45)[0], threading.Barrier(8), []

    def ask():
        barrier.wait()
        found.append(learned.ShippedModels().model_for(problem, SM90))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert loads == [KEY] and len(found) == 8 and all(m is found[0] for m in found) and found[0].key == KEY


def test_the_manifest_names_the_keys_own_rows_and_the_trees_fitted(table):
    other_arch = table.assign(arch="sm_80", gpu="NVIDIA A100", problem_set="a100-only")  # same problem ids
    model = learned.train(pd.concat([table, other_arch], ignore_index=True), KEY, folds=1,
                          params={"num_iterations": 7})
    m = model.manifest
    assert m["gpus"] == ["synthetic-h200"] and m["problem_sets"] == ["synthetic"]
    assert m["trees"] == model.booster.num_trees() == 7 and m["cv"] is None
    assert m["target"] == training.TARGET


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(frame="sweep.parquet"), TypeError, "frame must be a pandas DataFrame"),
    (dict(seed=-1), ValueError, "seed must be an integer in 0..2147483647"),
    (dict(seed=2**40), ValueError, "seed must be an integer"),
    (dict(params=[("num_leaves", 7)]), TypeError, "params must be a mapping"),
    (dict(folds=True), ValueError, "folds must be a positive integer"),
])
def test_training_refuses_bad_arguments_naming_them(table, kwargs, error, message):
    frame = kwargs.pop("frame", table)
    with pytest.raises(error, match=message):
        learned.train(frame, KEY, **kwargs)


def test_models_take_one_trained_model_per_key(model):
    with pytest.raises(ValueError, match="two models rank gemm_forward_fp16 on sm_90"):
        learned.Models([model, model])
    with pytest.raises(TypeError, match="models must be TrainedModels"):
        learned.Models(["models/sm_90"])


def test_a_problem_whose_layout_the_model_never_saw_is_ranked_by_rules(model, rules):
    from tiledispatch.ops.gemm import GemmLayout

    assert model.spec.columns[[c.name for c in model.spec.columns].index("problem.layout.a")].vocabulary == ("r",)
    seen = problems(1, seed=46)[0]
    unseen = GEMM.problem_type(m=seen.m, n=seen.n, k=seen.k, layout=GemmLayout.parse("crr"))
    assert model.covers(seen) and not model.covers(unseen)
    assert model.featurizer.unknown_categories(unseen) == ("layout.a='c'",)
    dispatcher = Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90), SM90, strategy="model",
                            models=learned.Models([model]))
    ranked = dispatcher.ranked(unseen)
    assert ranked and [c.spec for c in ranked] == [c.spec for c in rules.ranked(unseen)]
    assert dispatcher.explain(unseen).model is None and dispatcher.explain(seen).model == model.label
    frame = synthetic_table(rules, count=4, seed=9)
    frame = frame[frame["status"] == "ok"]
    from tiledispatch.heuristics import evaluate as ev

    unseen_rows = []
    for candidate in rules.ranked(unseen):
        row = frame.iloc[0].to_dict()
        row.update(problem_id=problem_id(unseen), problem=canonical_json(unseen), kernel=candidate.spec.name,
                   family=candidate.spec.family, vendor=candidate.spec.family == "vendor",
                   config=canonical_json(candidate.spec.config), rule_score=None, rule_rank=None,
                   time_ms=1.0 if candidate is not rules.ranked(unseen)[0] else 2.0)
        unseen_rows.append(row)
    table = pd.DataFrame(unseen_rows)
    (outcome,) = ev.evaluate(table, strategies=["model"], model=model)[KEY].outcomes[ev.Picker.MODEL]
    assert outcome.kernel == rules.ranked(unseen)[0].spec.name  # the rules' pick, as the dispatcher makes


def test_a_model_giving_too_few_or_nan_costs_fails_clearly(model):
    class Broken:
        label = "broken"

        def __init__(self, costs):
            self.costs = costs

        def predict_cost(self, problem, configs, arch, scores=None):
            return self.costs(len(configs))

    problem = problems(1, seed=47)[0]
    for costs in (lambda n: [0.0] * (n - 1), lambda n: [math.nan] * n):
        dispatcher = Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90), SM90, strategy="model",
                                models=OneModel(Broken(costs)))
        with pytest.raises(UnsupportedError, match="the model broken gave .* costs .* one finite cost per candidate"):
            dispatcher.ranked(problem)


def test_an_unreadable_shipped_manifest_leaves_its_slice_to_the_rules(model, shipped_in, monkeypatch, caplog):
    monkeypatch.delenv("TILEDISPATCH_STRATEGY", raising=False)
    (shipped_in / "sm_90").mkdir()
    (shipped_in / "sm_90" / "gemm_forward_fp16.manifest.json").write_text("{not json")
    assert learned.shipped_keys("sm_90") == frozenset() and "cannot be read" in caplog.text
    assert default_strategy(SM90) is Strategy.RULES  # every dispatcher still starts
    assert learned.ShippedModels().model_for(problems(1, seed=48)[0], SM90) is None


def test_models_from_a_missing_directory_are_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no directory of models at .*typo"):
        learned.Models.from_directory(tmp_path / "typo")


def test_rule_scores_not_one_per_config_are_refused(model):
    problem = problems(1, seed=49)[0]
    configs = [c for c in GEMM.rule_sets[RuleSet.TINY]() if GEMM.supports(c, problem) is None][:3]
    scores = [GEMM.rule_score(c, problem, SM90) for c in configs]
    with pytest.raises(ValueError, match="scores: 2 rule scores for 3 configs"):
        model.predict_cost(problem, configs, SM90, scores[:2])
    np.testing.assert_array_equal(model.predict_cost(problem, configs, SM90, scores),
                                  model.predict_cost(problem, configs, SM90))


def test_threads_ranking_at_once_get_each_problems_own_costs(model, rules):
    from concurrent.futures import ThreadPoolExecutor

    cases = [(p, [c.spec.config for c in rules.ranked(p)]) for p in problems(24, seed=50)]
    alone = [model.predict_cost(p, configs, SM90) for p, configs in cases]
    fresh = learned.TrainedModel(model.key, model.spec, model.booster, model.manifest)  # empty memos
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda case: fresh.predict_cost(case[0], case[1], SM90), cases * 4))
    for i, costs in enumerate(together):
        np.testing.assert_array_equal(costs, alone[i % len(cases)])


def test_the_model_ranks_the_rules_shortlist_and_the_vendor_and_leaves_the_rest_in_the_rules_order():
    """A GEMM of the default set has ~80 candidates: the model costs the rules' best few (the op's
    model_shortlist) and the vendor's only (here it reverses their order), and the others follow,
    uncosted, in the rules' order. Conv's model costs every candidate."""
    from tiledispatch.core.op import get_op

    MODEL_SHORTLIST = get_op("gemm").model_shortlist

    class Reversed:
        label = "reversed"
        seen = []

        def predict_cost(self, problem, configs, arch, scores=None):
            self.seen.append(len(configs))
            return [-float(i) for i in range(len(configs))]  # the rules' last of the shortlist costs least

    registry = Registry.from_rule_sets(["gemm"], RuleSet.DEFAULT, SM90)
    problem = problems(1, seed=5)[0]
    rules = Dispatcher(registry, SM90, strategy="rules").ranked(problem)
    assert len(rules) > MODEL_SHORTLIST + 1
    ranked = Dispatcher(registry, SM90, strategy="model", models=OneModel(Reversed())).ranked(problem)
    shortlist = [c for i, c in enumerate(rules) if i < MODEL_SHORTLIST or c.spec.family == "vendor"]
    rest = [c for i, c in enumerate(rules) if i >= MODEL_SHORTLIST and c.spec.family != "vendor"]
    assert Reversed.seen == [len(shortlist)]
    assert [c.spec.name for c in ranked] == [c.spec.name for c in shortlist[::-1] + rest]
    assert all(c.model_cost is not None for c in ranked[:len(shortlist)])
    assert all(c.model_cost is None for c in ranked[len(shortlist):])

    from tiledispatch.ops.conv import Direction, check_operands

    cl = dict(device="meta", dtype=torch.bfloat16)
    x = torch.empty(8, 64, 28, 28, **cl).to(memory_format=torch.channels_last)
    w = torch.empty(64, 64, 3, 3, **cl).to(memory_format=torch.channels_last)
    conv = check_operands(Direction.FORWARD, x=x, w=w, padding=1).problem
    convs = Registry.from_rule_sets(["conv"], RuleSet.DEFAULT, SM90)
    every = Dispatcher(convs, SM90, strategy="rules").ranked(conv)
    Reversed.seen.clear()
    ranked = Dispatcher(convs, SM90, strategy="model", models=OneModel(Reversed())).ranked(conv)
    assert get_op("conv").model_shortlist is None and len(every) > 16 and Reversed.seen == [len(every)]
    assert [c.spec.name for c in ranked] == [c.spec.name for c in every[::-1]]


def test_the_model_does_not_rank_a_candidate_the_rules_score_zero():
    """The rules prune, the model ranks the rest: on a 1x1 forward whose product the GEMM op gives
    cuBLAS, conv's gemm family scores 0 (its Triton GEMMs ran 0.57-0.88x cuDNN there), and a model
    that costs it least still does not pick it; it follows the ranked candidates, uncosted. The
    evaluation's picks split the rows the same way."""
    from tiledispatch.core.candidate_set import model_shortlist
    from tiledispatch.ops.conv import Direction, check_operands

    class GemmFamilyFirst:
        label = "gemm-family-first"
        seen = []

        def predict_cost(self, problem, configs, arch, scores=None):
            self.seen.append(len(configs))
            return [0.0 if type(c).__name__ == "PointwiseConfig" else 1.0 + i for i, c in enumerate(configs)]

    cl = dict(device="meta", dtype=torch.float16)
    x = torch.empty(32, 512, 7, 7, **cl).to(memory_format=torch.channels_last)
    w = torch.empty(2048, 512, 1, 1, **cl).to(memory_format=torch.channels_last)
    conv = check_operands(Direction.FORWARD, x=x, w=w).problem
    convs = Registry.from_rule_sets(["conv"], RuleSet.DEFAULT, SM90)
    every = Dispatcher(convs, SM90, strategy="rules").ranked(conv)
    zero = [c.spec.name for c in every if c.score.value == 0.0]
    assert zero and all(c.spec.family == "gemm" for c in every if c.spec.name in zero)
    ranked = Dispatcher(convs, SM90, strategy="model", models=OneModel(GemmFamilyFirst())).ranked(conv)
    assert GemmFamilyFirst.seen == [len(every) - len(zero)]
    assert [c.spec.name for c in ranked[-len(zero):]] == zero and ranked[0].spec.name not in zero
    assert all(c.model_cost is None for c in ranked[-len(zero):])
    rows = [(c.spec.name, c.score.value, c.spec.is_vendor) for c in every]
    kept, rest = model_shortlist(rows, lambda r: r[2], None, lambda r: r[1])
    assert [r[0] for r in rest] == zero and len(kept) + len(rest) == len(rows)


def test_the_model_does_not_rank_a_vendor_the_rules_model_past_its_cliff():
    """cuDNN's 3-D depthwise backward-weight took 50.8 ms where a direct kernel ran in 85 us; no
    sweep has the class, so the rules' stretch of cuDNN's time is all that knows it. A model that
    costs the vendor least (as the shipped bwd_weight model did, never having seen the class) does
    not pick it there, and does on a 2-D conv where the rules model it close to their best."""
    from tiledispatch.core.candidate_set import VENDOR_CLIFF
    from tiledispatch.ops.conv import Direction, check_operands

    class VendorFirst:
        label = "vendor-first"

        def predict_cost(self, problem, configs, arch, scores=None):
            return [0.0 if type(c).__name__ == "VendorConfig" else 1.0 + i for i, c in enumerate(configs)]

    def weight_grad(n, c, groups, size, filt):
        cl = dict(device="meta", dtype=torch.bfloat16)
        fmt = torch.channels_last_3d if len(size) == 3 else torch.channels_last
        x = torch.empty(n, c, *size, **cl).to(memory_format=fmt)
        dy = torch.empty(n, c, *size, **cl).to(memory_format=fmt)
        pad = tuple(f // 2 for f in filt)
        return check_operands(Direction.BWD_WEIGHT, x=x, dy=dy, weight_size=(c, c // groups, *filt), padding=pad,
                              groups=groups).problem

    convs = Registry.from_rule_sets(["conv"], RuleSet.DEFAULT, SM90)
    cliff = weight_grad(2, 96, 96, (8, 56, 56), (5, 5, 5))
    rules = Dispatcher(convs, SM90, strategy="rules").ranked(cliff)
    vendor = next(c for c in rules if c.spec.is_vendor)
    assert vendor.score.value * VENDOR_CLIFF < rules[0].score.value  # the rules model it past the cliff
    picked = Dispatcher(convs, SM90, strategy="model", models=OneModel(VendorFirst())).select(cliff)
    assert not picked.is_vendor and picked.name == rules[0].spec.name
    plain = weight_grad(32, 256, 1, (14, 14), (3, 3))
    assert Dispatcher(convs, SM90, strategy="model", models=OneModel(VendorFirst())).select(plain).is_vendor
