"""A model that learns from a sibling dtype's rows too (`tiledispatch train --pool`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("lightgbm")

from tiledispatch import arch  # noqa: E402
from tiledispatch.bench.table import SelectionKey, problem_id  # noqa: E402
from tiledispatch.core.dispatcher import Dispatcher, Strategy  # noqa: E402
from tiledispatch.core.op import RuleSet  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.heuristics import learned, training  # noqa: E402

from .test_learned import KEY, synthetic_table  # noqa: E402

SM90 = arch.load("sm_90")


def as_bf16(table: "pd.DataFrame") -> "pd.DataFrame":
    """The table's problems as bf16 problems: the same layers, other problem ids."""
    def retyped(text: str) -> str:
        fields = json.loads(text)
        fields["types"] = {k: ("bf16" if v == "fp16" else v) for k, v in fields["types"].items()}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    problems = table["problem"].map(retyped)
    return table.assign(dtype="bf16", problem=problems, problem_id=problems.map(
        lambda text: problem_id(training.problem_from_row("gemm", text))))


@pytest.fixture(scope="module")
def tables():
    rules = Dispatcher(Registry.from_rule_sets(["gemm"], RuleSet.TINY, SM90), SM90, strategy=Strategy.RULES)
    fp16 = synthetic_table(rules, count=12, seed=3)
    return fp16, as_bf16(synthetic_table(rules, count=30, seed=4))


def test_a_pooled_model_learns_from_both_dtypes_and_is_judged_on_its_own(tables):
    fp16, bf16 = tables
    frame = pd.concat([fp16, bf16], ignore_index=True)
    model = learned.train(frame, KEY, folds=3, pool=("bf16",))
    m = model.manifest
    ok16, ok_bf = (t[t["status"] == "ok"] for t in tables)
    assert m["key"]["dtype"] == "fp16" and m["pooled_dtypes"] == ["bf16"]
    assert m["rows"] == len(ok16) + len(ok_bf)
    assert (m["problems"], m["own_problems"]) == (ok16["problem_id"].nunique() + ok_bf["problem_id"].nunique(),
                                                  ok16["problem_id"].nunique())
    assert m["cv"]["selection"]["problems"] == ok16["problem_id"].nunique()  # fp16 problems alone judged
    alone = learned.train(frame, KEY, folds=3)
    assert alone.manifest["pooled_dtypes"] == [] and alone.manifest["rows"] == len(ok16)


def test_pooled_folds_keep_a_layers_dtypes_together(tables, monkeypatch):
    """A held-out fp16 problem's bf16 twin trains no model that judges it: training's folds go by
    layer, each layer's two problems in one group, and only the fp16 rows are judged."""
    fp16, _ = tables
    frame = pd.concat([fp16, as_bf16(fp16)], ignore_index=True)
    seen = {}
    real = training.cross_validate

    def spy(data, folds, params, groups=None, judged=None):
        seen.update(ids=data.problem_ids, groups=groups, judged=judged)
        return real(data, folds, params, groups, judged)

    monkeypatch.setattr(training, "cross_validate", spy)
    model = learned.train(frame, KEY, folds=3, pool=("bf16",))
    by_group = pd.Series(seen["ids"]).groupby(seen["groups"]).nunique()
    assert len(by_group) == fp16["problem_id"].nunique() and (by_group == 2).all()  # a layer: its fp16 and bf16
    fp16_ids = set(fp16["problem_id"])
    assert seen["judged"].tolist() == [i in fp16_ids for i in seen["ids"]]
    assert model.manifest["cv"]["selection"]["problems"] == len(fp16_ids)


def test_a_pool_without_rows_is_refused_naming_the_key(tables):
    fp16, _ = tables
    with pytest.raises(Exception, match="no ok rows of gemm forward bf16"):
        learned.train(fp16, KEY, folds=2, pool=("bf16",))


def test_the_cli_trains_a_pooled_model_from_two_tables(tables, tmp_path):
    from typer.testing import CliRunner

    from tiledispatch.cli.main import app

    paths = []
    for name, table in zip(("fp16", "bf16"), tables):
        paths.append(tmp_path / f"{name}.parquet")
        table.to_parquet(paths[-1])
    out = tmp_path / "models"
    result = CliRunner().invoke(app, ["train", *map(str, paths), "--out", str(out), "--folds", "2", "--dtype", "fp16",
                                      "--pool", "bf16"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["models"]
    assert entry["dtype"] == "fp16" and entry["pooled_dtypes"] == ["bf16"]
    loaded = learned.load(out, SelectionKey("gemm", "forward", "fp16", "sm_90"))
    assert loaded.manifest["own_problems"] == tables[0]["problem_id"].nunique()
    assert np.isfinite(loaded.manifest["cv"]["selection"]["mean"])
