"""A ranking's batch (`score_batch`, `support_key`) gives the scalar model's answers: the same
refusals, and the same scores and terms to the last bit."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tiledispatch import arch
from tiledispatch.core.candidate_set import CandidateSet
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.registry import Registry
from tiledispatch.bench.table import SelectionKey
from tiledispatch.heuristics import learned
from tiledispatch.ops.gemm import ranking, score_batch, tile_batch
from tiledispatch.ops.gemm.problem import Activation, Align, Alignment, Epilogue, GemmLayout, GemmProblem, GemmTypes

GEMM = get_op(OpKind.GEMM)
SIZES = (1, 2, 7, 16, 33, 100, 128, 257, 1000, 1024, 4093, 4096, 8192, 16384, 50000)
TYPES = tuple(GemmTypes.parse(t) for t in ("bf16", "fp16", "fp32", "tf32", "fp8e4m3", "fp8e4m3xfp8e5m2"))
LAYOUTS = tuple(GemmLayout.parse(x) for x in ("rcr", "rrr", "crr", "srr", "rrs"))
EPILOGUES = (Epilogue(), Epilogue(bias=True), Epilogue(bias=True, activation=Activation.GELU), Epilogue(residual=True))
ALIGNMENTS = (Alignment(), Alignment(a=Align.NONE), Alignment(a=Align.BYTES16, b=Align.BYTES16, m=Align.NONE),
              Alignment(*[False] * 6), Alignment(c=Align.NONE))


def problems(count: int, seed: int) -> list[GemmProblem]:
    """Problems of every kind the supports and scores tell apart: sizes from 1 to past a split's
    workspace, batches, dtypes, layouts, epilogues, unaligned operands, 64-bit offsets."""
    rng = random.Random(seed)
    return [GemmProblem(rng.choice(SIZES), rng.choice(SIZES), rng.choice(SIZES), rng.choice((1, 1, 4, 32)),
                        rng.choice(TYPES), rng.choice(LAYOUTS), rng.choice(EPILOGUES), rng.choice(ALIGNMENTS),
                        wide_offsets=rng.random() < 0.05) for _ in range(count)]


def candidate_sets(rule_set: RuleSet, target, count: int, seed: int):
    registry = Registry.from_rule_sets([OpKind.GEMM], rule_set, target)
    for problem in problems(count, seed):
        specs = registry.candidates(OpKind.GEMM, problem)
        yield problem, specs, CandidateSet(GEMM, specs, target)


@pytest.mark.parametrize("target", ["sm_90", "sm_80", "sm_100", "interpreter"])
def test_refusals_by_group_are_each_configs_own(target):
    target = arch.load(target)
    asked = 0
    for problem, specs, candidates in candidate_sets(RuleSet.FULL, target, 25, seed=1):
        assert candidates.refusals(problem) == [GEMM.supports(s.config, problem) for s in specs]
        asked += len(specs)
    assert asked > 5000  # the full rule set's classes: every family, split and realign option


@pytest.mark.parametrize("target, rule_set", [("sm_90", RuleSet.FULL), ("sm_80", RuleSet.DEFAULT),
                                              ("sm_100", RuleSet.DEFAULT), ("interpreter", RuleSet.TESTS)])
def test_batch_scores_are_the_scalar_scores(target, rule_set):
    """Each score and each of its terms, in rule_score's order, to the last bit: two tiles whose
    scalar scores differ in the last bit (64x128 and 128x64) keep their order."""
    target = arch.load(target)
    compared = set()
    for problem, specs, candidates in candidate_sets(rule_set, target, 16, seed=2):
        rows = [i for i, reason in enumerate(candidates.refusals(problem)) if reason is None]
        scores = candidates.scores(rows, problem)
        for j, i in enumerate(rows):
            expected = ranking.rule_score(specs[i].config, problem, target)
            got = scores.score(j)
            assert got == expected and scores.values[j] == expected.value
            assert list(got.terms) == list(expected.terms)  # and their order: `explain` writes them so
        compared |= {(specs[i].family, getattr(specs[i].config, "realign", False)) for i in rows}
    assert ("tiled", False) in compared
    if target.name == "sm_90":  # every kind of row the batch tells apart, realign's among them
        assert {("tiled", True), ("tma-persistent", True), ("tma-persistent", False), ("stream-k", False),
                ("ws-persistent", False), ("gemv", False), ("vendor", False)} <= compared


def test_column_powers_round_as_pythons():
    """numpy's `power` may round apart from Python's pow (AVX-512's vector pow): the batch's do not."""
    rng = random.Random(4)
    bases = [rng.uniform(0, 4) * 10 ** rng.randint(-12, 3) for _ in range(5000)]
    for exponent in (3, 6, 8, 1 / 3, 1 / 6, 1 / 8):
        assert tile_batch.power_of(np.array(bases), exponent).tolist() == [b**exponent for b in bases]


def test_a_models_features_read_from_the_table_are_the_scores():
    """`rows(js).table(names)`, which a model's featurizer reads, is each score's value and terms by
    name (NaN where it has none), as the Score objects give them, the vendor's and stream-K's too."""
    names = list(score_batch._COLUMNS) + ["epilogue_steps", "no_such_term"]
    target = arch.load("sm_90")
    model, featurized = learned.shipped(SelectionKey("gemm", "forward", "bf16", "sm_90")), 0
    for problem, specs, candidates in candidate_sets(RuleSet.DEFAULT, target, 30, seed=5):
        rows = [i for i, reason in enumerate(candidates.refusals(problem)) if reason is None]
        scores, js = candidates.scores(rows, problem), list(range(len(rows)))[::-1]
        expected = [[s.value if name == "value" else s.terms.get(name, np.nan) for name in names]
                    for s in (candidates.scores(rows, problem).score(j) for j in js)]
        np.testing.assert_array_equal(scores.rows(js).table(names), np.array(expected).reshape(len(js), len(names)))
        if problem.types.name == "bf16" and js:
            configs = [specs[rows[j]].config for j in js]
            np.testing.assert_array_equal(model.featurizer.matrix(problem, configs, target, scores.rows(js)),
                                          model.featurizer.matrix(problem, configs, target, list(scores.rows(js))))
            featurized += 1
    assert featurized >= 3


def test_a_problem_past_exact_int64_columns_is_scored_config_by_config():
    """Past EXACT_FLOPS the model's integers may pass 2**53 (or int64): each config takes rule_score."""
    target = arch.load("sm_90")
    registry = Registry.from_rule_sets([OpKind.GEMM], RuleSet.DEFAULT, target)
    for m in (2**17, 2**30):
        problem = GemmProblem(m, 2**30, 2**30, 4, GemmTypes.parse("bf16"), GemmLayout.parse("rcr"))
        specs = registry.candidates(OpKind.GEMM, problem)
        candidates = CandidateSet(GEMM, specs, target)
        rows = [i for i, reason in enumerate(candidates.refusals(problem)) if reason is None]
        assert problem.flops() >= score_batch.EXACT_FLOPS and rows
        scores = candidates.scores(rows, problem)
        assert [scores.score(j) for j in range(len(rows))] == [ranking.rule_score(specs[i].config, problem, target)
                                                               for i in rows]
