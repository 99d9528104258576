"""A GEMM's ranking stands in for its bucket of token counts: each bucket is ranked once, as its
largest M, and each problem in it takes that order of the kernels it accepts itself."""

import pytest

from tiledispatch import arch
from tiledispatch.core.arith import rank_bucket
from tiledispatch.core.candidate_set import CandidateSet
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.op import OpKind
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm.problem import Activation, Epilogue, GemmLayout, GemmProblem, ranking_problem
from tiledispatch.ops.gemm.rules import supports

from .test_correctness import FP16

SM90 = arch.load("sm_90")


def linear(m: int) -> GemmProblem:
    return GemmProblem(m, 4096, 4096, 1, FP16, GemmLayout.parse("rcr"),
                       Epilogue(False, Activation.parse("none"), False))


def test_each_octave_above_the_exact_counts_is_cut_into_buckets_ranked_as_their_largest_count():
    tops = set()
    for m in range(1, 1 << 14):
        top = ranking_problem(linear(m)).m
        assert top == rank_bucket(m)
        if m <= 64:
            assert top == m
            continue
        step = (1 << (m.bit_length() - 1)) // 8
        assert m <= top < m + step and top % step == 0
        assert ranking_problem(linear(top)).m == top  # a bucket's largest count stands for itself
        tops.add(top)
    assert len(tops) <= 8 * 8  # eight octaves above 64 up to 2**14, eight buckets each


@pytest.mark.parametrize("strategy", ["rules", "model"])
def test_a_bucket_is_ranked_once_and_each_problem_takes_its_order_of_the_kernels_it_accepts(monkeypatch, strategy):
    dispatcher = Dispatcher(Registry.from_rule_set(OpKind.GEMM, "default", SM90), SM90, strategy=strategy)
    scored = []
    real_scores = CandidateSet.scores

    def scores(self, rows, problem):
        scored.append(problem.m)
        return real_scores(self, rows, problem)

    monkeypatch.setattr(CandidateSet, "scores", scores)
    stand_in = dispatcher.explain(linear(1024))
    assert stand_in.refusals.ranked_as is None  # a bucket's largest count ranks itself
    for m in (1001, 1020, 1023):
        seen = dispatcher.explain(linear(m))
        assert seen.refusals.ranked_as == linear(1024)
        assert seen.to_dict(limit=1)["ranked_as"]["m"] == 1024
        names = [c.spec.name for c in seen.ranked]
        assert names and all(supports(c.spec.config, linear(m)) is None for c in seen.ranked)
        assert names == [c.spec.name for c in stand_in.ranked if c.spec.name in set(names)]  # the stand-in's order
        assert seen.selected == seen.ranked[0].spec == dispatcher.select(linear(m))
    assert scored == [1024]  # the three problems of the bucket were not scored again


def test_a_problem_of_few_tokens_ranks_itself():
    dispatcher = Dispatcher(Registry.from_rule_set(OpKind.GEMM, "default", SM90), SM90, strategy="rules")
    assert dispatcher.explain(linear(33)).refusals.ranked_as is None
    assert dispatcher.explain(linear(65)).refusals.ranked_as == linear(72)


def test_a_dispatcher_that_plans_sweeps_ranks_each_problem_itself():
    """A sweep times every kernel a problem accepts and records its own scores: no stand-in."""
    dispatcher = Dispatcher(Registry.from_rule_set(OpKind.GEMM, "default", SM90), SM90, strategy="rules",
                            rank_buckets=False)
    own = dispatcher.explain(linear(1001))
    assert own.refusals.ranked_as is None
    candidates = dispatcher.registry.candidates(OpKind.GEMM, linear(1001))
    assert {c.spec.name for c in own.ranked} == {s.name for s in candidates if supports(s.config, linear(1001)) is None}


def test_a_count_whose_bucket_passes_the_largest_size_ranks_itself():
    assert ranking_problem(linear(2**31 - 7)) == linear(2**31 - 7)
