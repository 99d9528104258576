"""A conv direction's model trains on every direction's rows (`OpDefinition.model_pools_directions`):
the rows pooled, the direction a feature, cross-validation judging the key's own problems alone;
an op that does not pool (GEMM) keeps its own rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("lightgbm")

from tiledispatch import arch  # noqa: E402
from tiledispatch.bench import problemsets  # noqa: E402
from tiledispatch.bench.table import COLUMNS, SelectionKey, Status, canonical_json, problem_id  # noqa: E402
from tiledispatch.core.dispatcher import Dispatcher, Strategy  # noqa: E402
from tiledispatch.core.op import RuleSet, get_op  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.heuristics import learned, training  # noqa: E402

SM90 = arch.load("sm_90")
FORWARD, BWD_DATA = (SelectionKey("conv", d, "bf16", "sm_90") for d in ("forward", "bwd_data"))


def conv_table(directions=("forward", "bwd_data"), per_direction: int = 6) -> "pd.DataFrame":
    """Every default candidate of a few random convs per direction, timed by a synthetic GPU: the
    rules' score with a direction's own bias, and noise."""
    rules = Dispatcher(Registry.from_rule_sets(["conv"], RuleSet.DEFAULT, SM90), SM90, strategy=Strategy.RULES)
    rng, rows = np.random.default_rng(0), []
    for direction in directions:
        for problem in problemsets.problem_set("conv-random-small", dtype="bf16", direction=direction,
                                               limit=per_direction, seed=1):
            for rank, candidate in enumerate(rules.ranked(problem)):
                spec = candidate.spec
                bias = 1.5 if direction == "bwd_data" and spec.is_vendor else 1.0
                row = dict.fromkeys(COLUMNS)
                row.update(op="conv", direction=direction, dtype="bf16", arch="sm_90", problem_set=f"synthetic-{direction}",
                           problem_id=problem_id(problem), problem=canonical_json(problem), kernel=spec.name,
                           family=spec.family, vendor=spec.is_vendor, config=canonical_json(spec.config),
                           status=Status.OK.value, gpu="synthetic-h200", rule_score=candidate.score.value,
                           rule_rank=rank, time_ms=bias / max(candidate.score.value, 1e-3) * math.exp(rng.normal(0, 0.05)))
                rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


@pytest.fixture(scope="module")
def table():
    return conv_table()


def test_conv_pools_its_directions_and_gemm_does_not():
    assert get_op("conv").model_pools_directions and not get_op("gemm").model_pools_directions


def test_a_directions_training_rows_hold_every_direction_sorted_by_problem(table):
    rows = training.training_rows(table, BWD_DATA)
    own, other = training.rows_of(table, BWD_DATA), training.rows_of(table, FORWARD)
    assert len(rows) == len(own) + len(other)
    assert set(rows["problem_id"]) == set(own["problem_id"]) | set(other["problem_id"])
    assert list(rows["problem_id"]) == sorted(rows["problem_id"])  # each problem's rows contiguous
    alone = table[table["direction"] == "bwd_data"]
    assert training.training_rows(alone, BWD_DATA).equals(own)  # nothing to pool


def test_a_pooled_model_is_judged_on_its_own_problems_and_says_what_it_learned_from(table):
    model = learned.train(table, BWD_DATA, folds=2, params={"num_iterations": 7})
    m = model.manifest
    own = table[table["direction"] == "bwd_data"]["problem_id"].nunique()
    assert m["directions"] == ["bwd_data", "forward"] and m["problems"] == table["problem_id"].nunique()
    assert m["problem_sets"] == ["synthetic-bwd_data", "synthetic-forward"]
    assert m["cv"]["selection"]["problems"] == own  # the forward problems train, never judged
    assert "problem_direction" in model.spec.names  # the direction tells the rows apart
    forward_alone = learned.train(table[table["direction"] == "forward"], FORWARD, folds=2,
                                  params={"num_iterations": 7})
    assert forward_alone.manifest["directions"] == ["forward"]
