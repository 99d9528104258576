"""A ranking's batch (`score_batch`, `support_key`) gives the scalar model's answers: the same
refusals, scores within the last bits, and the same order (near ties in the scalar numbers)."""

from __future__ import annotations

import random

import pytest

from tiledispatch import arch
from tiledispatch.core.candidate_set import CandidateSet
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm import ranking, score_batch
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
    """Each score and each of its terms, in rule_score's order, within the last bits (numpy's vector
    pow may round them apart); where two scores nearly tie, the scalar numbers exactly."""
    target = arch.load(target)
    compared = set()
    for problem, specs, candidates in candidate_sets(rule_set, target, 16, seed=2):
        rows = [i for i, reason in enumerate(candidates.refusals(problem)) if reason is None]
        scores = candidates.scores(rows, problem)
        scalar = [ranking.rule_score(specs[i].config, problem, target) for i in rows]
        for j, expected in enumerate(scalar):
            got = scores.score(j)
            assert got.value == pytest.approx(expected.value, rel=1e-13) and got.value == scores.values[j]
            assert list(got.terms) == list(expected.terms)
            assert list(got.terms.values()) == pytest.approx(list(expected.terms.values()), rel=1e-13)
        for j in score_batch._near_ties([s.value for s in scalar]):
            assert scores.values[j] == scalar[j].value
        compared |= {(specs[i].family, getattr(specs[i].config, "realign", False)) for i in rows}
    assert ("tiled", False) in compared
    if target.name == "sm_90":  # every kind of row the batch tells apart, realign's among them
        assert {("tiled", True), ("tma-persistent", True), ("tma-persistent", False), ("stream-k", False),
                ("ws-persistent", False), ("gemv", False), ("vendor", False)} <= compared


def test_the_batch_orders_as_the_scalar_model():
    """The ranking's order (by score, ties in registry order) is the scalar model's on the default
    rule set, whose transposed tiles (64x128, 128x64) score within a last bit of each other."""
    target = arch.load("sm_90")
    for problem, specs, candidates in candidate_sets(RuleSet.DEFAULT, target, 60, seed=3):
        rows = [i for i, reason in enumerate(candidates.refusals(problem)) if reason is None]
        values = candidates.scores(rows, problem).values
        batch = sorted(range(len(rows)), key=values.__getitem__, reverse=True)
        scalar = [ranking.rule_score(specs[i].config, problem, target).value for i in rows]
        assert [rows[j] for j in batch] == [rows[j] for j in sorted(range(len(rows)), key=lambda j: -scalar[j])]


def test_near_ties_are_found_wherever_they_sit():
    values = [0.5, 0.25, 0.5 * (1 + 1e-15), 0.75, 0.25, 0.1]
    assert score_batch._near_ties(values) == [0, 1, 2, 4]
    assert score_batch._near_ties([0.5, 0.6]) == []
