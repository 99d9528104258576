"""A ranking's candidate set and its lazily made candidates: what an op's batch saves is invisible
to the ranking's readers (the same refusals, scores and order as one call per kernel)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from tiledispatch import arch
from tiledispatch.core.candidate_set import CandidateSet
from tiledispatch.core.dtypes import DType
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.ranking import Accepted, Candidate
from tiledispatch.core.registry import Registry
from tiledispatch.ops.attention import AttentionProblem
from tiledispatch.ops.conv import ConvProblem, ConvTypes, Direction
from tiledispatch.ops.gemm.problem import GemmLayout, GemmProblem, GemmTypes

SM90 = arch.load("sm_90")
GEMM = get_op(OpKind.GEMM)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_rule_sets([OpKind.GEMM], RuleSet.DEFAULT, SM90)


def problem(m: int, n: int = 4096, k: int = 4096) -> GemmProblem:
    return GemmProblem(m, n, k, types=GemmTypes.parse("bf16"), layout=GemmLayout.parse("rcr"))


def one_by_one(specs, p):
    """The ranking as it was made before candidate sets: each kernel asked and scored alone."""
    scored = [(s, GEMM.rule_score(s.config, p, SM90)) for s in specs if GEMM.supports(s.config, p) is None]
    return sorted(scored, key=lambda pair: -pair[1].value)


@pytest.mark.parametrize("m", [1, 16, 1000, 4096])
def test_a_ranking_is_the_one_made_kernel_by_kernel(registry, m):
    """Of the problem that ranks it: M = 1000 is ranked as its bucket's 1024 (`GEMM.ranking_problem`)."""
    p = problem(m)
    ranking = Dispatcher(registry, SM90, strategy="rules").explain(p)
    stand_in = GEMM.ranking_problem(p)
    assert (stand_in == p) == (m != 1000)
    expected = [(s, score) for s, score in one_by_one(registry.candidates(OpKind.GEMM, stand_in), stand_in)
                if GEMM.supports(s.config, p) is None]
    assert [(c.spec, c.score) for c in ranking.ranked] == expected
    assert {c.spec.name: c.refused for c in ranking.refused} == {
        s.name: GEMM.supports(s.config, p) for s in registry.candidates(OpKind.GEMM, p)
        if GEMM.supports(s.config, p) is not None}


def test_conv_and_attention_sets_refuse_and_score_as_each_config_would():
    """conv's and attention's support keys group their configs (a forward class's 111 and 273 into
    29 and 38): each config's refusal and score is still the one asked of it alone."""
    attention = get_op(OpKind.ATTENTION)
    registry = Registry.from_rule_sets([OpKind.ATTENTION], RuleSet.DEFAULT, SM90)
    p = AttentionProblem(2, 8, 8, 512, 512, 64, 64, DType.BF16)
    specs = registry.candidates(OpKind.ATTENTION, p)
    assert CandidateSet(attention, specs, SM90).refusals(p) == [attention.supports(s.config, p) for s in specs]
    conv = get_op(OpKind.CONV)
    assert conv.support_key is not None
    registry = Registry.from_rule_sets([OpKind.CONV], RuleSet.DEFAULT, SM90)
    p = ConvProblem(Direction.FORWARD, 8, 64, 64, 1, (56, 56), (3, 3), 1, 1, 1, ConvTypes.parse("bf16"))
    specs = registry.candidates(OpKind.CONV, p)
    candidates = CandidateSet(conv, specs, SM90)
    refusals = candidates.refusals(p)
    assert refusals == [conv.supports(s.config, p) for s in specs] and None in refusals
    rows = [i for i, r in enumerate(refusals) if r is None]
    scores = candidates.scores(rows, p)
    assert [scores.score(j) for j in range(len(rows))] == [conv.rule_score(specs[i].config, p, SM90) for i in rows]
    assert scores.values == [conv.rule_score(specs[i].config, p, SM90).value for i in rows]


def test_accepted_reads_as_a_tuple_of_its_candidates(registry):
    p = problem(512)
    ranking = Dispatcher(registry, SM90, strategy="rules")._rank(p)
    accepted = ranking.accepted
    assert isinstance(accepted, Accepted)
    every = tuple(accepted)
    assert len(every) == len(accepted) > 3 and all(isinstance(c, Candidate) for c in every)
    assert accepted[0] is every[0] and accepted[-1] is every[-1]  # made once, then the same object
    assert accepted[1:3] == every[1:3] and accepted[::-1] == every[::-1]
    assert accepted == every and every == accepted and accepted != every[:-1]
    assert list(reversed(accepted)) == list(reversed(every)) and every[2] in accepted
    with pytest.raises(IndexError):
        accepted[len(every)]
    assert repr(accepted) == repr(every)


def test_threads_reading_a_candidate_get_one_object(registry):
    accepted = Dispatcher(registry, SM90, strategy="rules")._rank(problem(2048)).accepted
    seen, start = [], threading.Barrier(8)

    def read() -> None:
        start.wait()
        seen.append([accepted[i] for i in range(len(accepted))])

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(all(a is b for a, b in zip(row, seen[0])) for row in seen)


def test_the_first_strategy_has_no_scores(registry):
    p = problem(64)
    ranked = Dispatcher(registry, SM90, strategy="first").ranked(p)
    specs = [s for s in registry.candidates(OpKind.GEMM, p) if GEMM.supports(s.config, p) is None]
    assert [c.spec for c in ranked] == specs and all(c.score is None and c.model_cost is None for c in ranked)


def test_a_set_groups_the_configs_supports_sees_alike(registry):
    specs = registry.candidates(OpKind.GEMM, problem(64))
    candidates = CandidateSet(GEMM, specs, SM90)
    keys = {GEMM.support_key(s.config) for s in specs}
    asked = []
    counted = replace(GEMM, supports=lambda config, p: asked.append(config) or GEMM.supports(config, p))
    CandidateSet(counted, specs, SM90).refusals(problem(64))
    assert len(asked) == len(keys) < len(specs) / 2
    assert candidates.vendor == [s.is_vendor for s in specs] and sum(candidates.vendor) == 1
