"""An attention forward's ranking stands in for its bucket of sequence lengths (a decode over a
cache that grows a token a step is ranked once per bucket); a backward and varlen rank themselves."""

import dataclasses

from tiledispatch import arch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.dtypes import DType
from tiledispatch.core.op import OpKind
from tiledispatch.core.registry import Registry
from tiledispatch.ops.attention import AttentionProblem, Direction, supports
from tiledispatch.ops.attention.problem import MAX_SEQLEN, ranking_problem

SM90 = arch.load("sm_90")


def decode(keys: int) -> AttentionProblem:
    return AttentionProblem(4, 32, 8, 1, keys, 128, 128, DType.BF16)


def test_a_growing_decode_is_ranked_once_a_bucket_with_the_kernels_each_length_accepts():
    dispatcher = Dispatcher(Registry.from_rule_set(OpKind.ATTENTION, "default", SM90), SM90, strategy="rules")
    stand_in = dispatcher.explain(decode(1024))
    assert stand_in.refusals.ranked_as is None
    for keys in range(961, 1024, 7):
        seen = dispatcher.explain(decode(keys))
        assert seen.refusals.ranked_as == decode(1024)
        names = [c.spec.name for c in seen.ranked]
        assert names and all(supports(c.spec.config, decode(keys)) is None for c in seen.ranked)
        assert names == [c.spec.name for c in stand_in.ranked if c.spec.name in set(names)]
        assert seen.selected == dispatcher.select(decode(keys))


def test_a_backward_and_short_sequences_rank_themselves():
    backward = dataclasses.replace(decode(1000), seqlen_q=1000, direction=Direction.BACKWARD)
    assert ranking_problem(backward) is backward
    assert ranking_problem(decode(64)) == decode(64)
    assert ranking_problem(decode(1000)) == decode(1024)
    assert ranking_problem(dataclasses.replace(decode(1000), seqlen_q=100)).seqlen_q == 104


def test_a_length_whose_bucket_passes_the_limit_ranks_itself():
    longest = decode(MAX_SEQLEN - 5)
    assert ranking_problem(longest) == longest
