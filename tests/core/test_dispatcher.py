"""The dispatcher on the interpreter arch: selection, memoization, explain, strategies, fallback."""

from dataclasses import replace

import pytest
import torch

from tiledispatch import arch
from tiledispatch.core import kernel as kernel_step
from tiledispatch.core import dispatcher as dispatcher_module
from tiledispatch.core import spec as spec_module
from tiledispatch.core.dispatcher import RANKINGS_KEPT, Candidate, Dispatcher, Strategy
from tiledispatch.core.errors import (
    BuildError,
    InvalidProblemError,
    NoKernelError,
    UnknownKernelError,
    UnsupportedError,
)
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm import check_operands
from tiledispatch.ops.gemm.problem import Activation, Epilogue, GemmLayout, GemmProblem, GemmTypes
from tiledispatch.ops.gemm.rules import supports

from ..conftest import interpreter_only

INTERP, SM90 = arch.load("interpreter"), arch.load("sm_90")
GEMM = get_op(OpKind.GEMM)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_rule_set(OpKind.GEMM, RuleSet.TESTS, INTERP)


@pytest.fixture
def dispatcher(registry) -> Dispatcher:
    return Dispatcher(registry, INTERP)


def operands(m=40, n=24, k=48, seed=0, **kwargs):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).half()
    b = torch.randn(n, k, generator=g).half().t()  # column-major: an rcr problem
    return check_operands(a, b, **kwargs)


PROBLEM = operands().problem  # 40 x 24 x 48, fp16, rcr


def reference(ops) -> torch.Tensor:
    return (ops.a[0].double() @ ops.b[0].double()).reshape(1, ops.problem.m, ops.problem.n)


def assert_close(out, ops):
    ref = reference(ops)
    got = out.double().reshape(ref.shape)
    assert torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref) < 4e-3


@pytest.fixture
def count_supports(monkeypatch):
    """Counts `supports` calls made through the op's definition (the dispatcher's and KernelSpec.definition's)."""
    calls = []

    def counting(config, problem):
        calls.append(config)
        return supports(config, problem)

    counted = replace(GEMM, supports=counting)
    monkeypatch.setattr(spec_module, "get_op", lambda op: counted)
    monkeypatch.setattr(dispatcher_module, "get_op", lambda op: counted)  # its ranking asks the op once
    return calls


# --- selection -----------------------------------------------------------------------


def test_operands_describe_the_problem():
    assert (PROBLEM.m, PROBLEM.n, PROBLEM.k, PROBLEM.batch) == (40, 24, 48, 1)
    assert PROBLEM.layout.name == "rcr" and PROBLEM.types.name == "fp16" and PROBLEM.epilogue.name == "none"
    # A and B have rows of 48 halves (16-element strides); C's rows of 24 halves are 48 bytes:
    # 16-byte aligned, though not a multiple of 16 elements.
    assert [int(x) for x in (PROBLEM.alignment.a, PROBLEM.alignment.b, PROBLEM.alignment.c)] == [2, 2, 1]
    assert operands(seed=9).problem == PROBLEM


def test_select_returns_a_supporting_spec(dispatcher):
    spec = dispatcher.select(PROBLEM)
    assert spec.name in dispatcher.registry
    assert spec.arch == "interpreter" and spec.op is OpKind.GEMM
    assert supports(spec.config, PROBLEM) is None
    assert spec.config.types == PROBLEM.types and spec.config.epilogue == PROBLEM.epilogue


def test_select_follows_the_problem_signature(dispatcher):
    for problem in (
        GemmProblem(m=33, n=17, k=64, types=GemmTypes.parse("fp32"), layout=GemmLayout.parse("crr")),
        GemmProblem(m=8, n=8, k=8, types=GemmTypes.parse("tf32"), epilogue=Epilogue(True, Activation.SILU)),
        GemmProblem(m=64, n=64, k=64, batch=3, types=GemmTypes.parse("fp8e4m3xfp8e5m2"),
                    layout=GemmLayout.parse("sss"), epilogue=Epilogue(residual=True)),
    ):
        spec = dispatcher.select(problem)
        assert supports(spec.config, problem) is None


def test_dispatcher_only_keeps_its_arch(registry):
    both = registry.merge(Registry.from_rule_set("gemm", "tests", SM90))
    dispatcher = Dispatcher(both, INTERP)
    assert len(dispatcher.registry) == len(registry)
    assert all(s.arch == "interpreter" for s in dispatcher.registry)
    assert dispatcher.select(PROBLEM).arch == "interpreter"


def test_select_is_memoized(dispatcher, count_supports):
    first = dispatcher.select(PROBLEM)
    evaluated = len(count_supports)
    # every candidate was asked once, through one of its group (those `supports` sees alike)
    assert evaluated == len({GEMM.support_key(spec.config) for spec in dispatcher.registry})
    again = dispatcher.select(operands(seed=5).problem)  # an equal problem, from other tensors
    assert again is first
    assert len(count_supports) == evaluated  # no candidate evaluated again
    other = dispatcher.select(replace(PROBLEM, m=41))
    assert len(count_supports) == 2 * evaluated  # a new problem is evaluated
    assert supports(other.config, replace(PROBLEM, m=41)) is None


def test_explain_reuses_the_ranking_select_made(dispatcher, count_supports):
    """A problem is ranked once: explain (and gemm's pick for graph replays, on a call's first
    sight of a launch-bound problem) take the ranking that select made."""
    first = dispatcher.select(PROBLEM)
    n = len(count_supports)
    explanation = dispatcher.explain(PROBLEM)
    assert len(count_supports) == n
    assert explanation.selected == first and explanation.ranked[0].spec == first


def test_only_recent_rankings_are_kept(dispatcher, count_supports):
    dispatcher.explain(PROBLEM)
    n = len(count_supports)
    for m in range(1, RANKINGS_KEPT + 1):  # as many other problems as the dispatcher keeps
        dispatcher.explain(replace(PROBLEM, m=PROBLEM.m + m))
    assert len(count_supports) == (RANKINGS_KEPT + 1) * n
    dispatcher.explain(PROBLEM)  # the oldest ranking was dropped: ranked again
    assert len(count_supports) == (RANKINGS_KEPT + 2) * n


# --- explain -------------------------------------------------------------------------


def test_explain_ranks_accepted_and_gives_reasons(dispatcher):
    explanation = dispatcher.explain(PROBLEM)
    assert explanation.strategy is Strategy.RULES and explanation.arch == "interpreter"
    ranked, refused = explanation.ranked, explanation.refused
    assert ranked and refused
    assert len(ranked) + len(refused) == len(dispatcher.registry)
    scores = [c.score.value for c in ranked]
    assert scores == sorted(scores, reverse=True)
    assert all(0 < s <= 1 for s in scores)
    for c in ranked:
        assert c.refused is None and supports(c.spec.config, PROBLEM) is None
        assert {"tile_m", "tile_n", "tile_k", "waves", "modelled_us"} <= set(c.score.terms)
    for c in refused:
        assert c.score is None and isinstance(c.refused, str) and c.refused
        assert c.refused == supports(c.spec.config, PROBLEM)
    assert explanation.selected == ranked[0].spec == dispatcher.select(PROBLEM)


def test_explain_to_dict(dispatcher):
    d = dispatcher.explain(PROBLEM).to_dict(limit=3)
    assert d["selected"] == d["ranking"][0]["kernel"]
    assert d["problem"]["layout"] == "rcr" and d["strategy"] == "rules" and d["arch"] == "interpreter"
    assert len(d["ranking"]) == 3 and len(d["refused"]) == 3
    assert d["accepted"] + d["refused_count"] == len(dispatcher.registry)
    assert all("score" in c and "terms" in c and "refused" not in c for c in d["ranking"])
    assert all("refused" in c and "score" not in c for c in d["refused"])
    full = dispatcher.explain(PROBLEM).to_dict()
    assert len(full["ranking"]) == full["accepted"] and len(full["refused"]) == full["refused_count"]


def test_explain_with_no_candidates(dispatcher):
    bf16 = GemmProblem(m=8, n=8, k=8, types=GemmTypes.parse("bf16"))  # the interpreter has no bf16 kernels
    explanation = dispatcher.explain(bf16)
    assert explanation.selected is None and explanation.ranked == ()
    assert len(explanation.refused) == len(dispatcher.registry)


# --- strategies and forced kernels -----------------------------------------------------


def test_first_strategy_picks_the_first_supporting_spec_in_registry_order(registry):
    dispatcher = Dispatcher(registry, INTERP, strategy="first")
    assert dispatcher.strategy is Strategy.FIRST
    first = next(s for s in registry if supports(s.config, PROBLEM) is None)
    assert dispatcher.select(PROBLEM) == first
    explanation = dispatcher.explain(PROBLEM)
    supporting = [s for s in registry if supports(s.config, PROBLEM) is None]
    assert [c.spec for c in explanation.ranked] == supporting  # registry order, no scores
    assert all(c.score is None for c in explanation.ranked)
    # The two strategies can disagree; `rules` takes the best score, not the first.
    rules = Dispatcher(registry, INTERP).explain(PROBLEM)
    assert rules.selected == max(rules.ranked, key=lambda c: c.score.value).spec


def test_unknown_strategy_raises(registry):
    with pytest.raises(UnsupportedError, match="unknown strategy 'fastest'; use one of: first, rules"):
        Dispatcher(registry, INTERP, strategy="fastest")


@interpreter_only
def test_resolve_forced_kernel(dispatcher):
    selected = dispatcher.select(PROBLEM)
    other = next(c.spec for c in dispatcher.explain(PROBLEM).ranked if c.spec != selected)
    assert dispatcher.resolve(other.name, PROBLEM) is dispatcher.registry.get(other.name)
    assert dispatcher.resolve(other, PROBLEM) == other
    ops = operands()
    assert_close(dispatcher.run(ops, kernel=other.name), ops)


def test_resolve_refuses_unsupporting_and_unknown_kernels(dispatcher):
    wrong = next(s for s in dispatcher.registry if supports(s.config, PROBLEM) is not None)
    with pytest.raises(UnsupportedError, match=f"{wrong.name} cannot run this problem: built for"):
        dispatcher.resolve(wrong.name, PROBLEM)
    with pytest.raises(UnknownKernelError, match="gemm_nope"):
        dispatcher.resolve("gemm_nope", PROBLEM)


@interpreter_only
def test_no_kernel_for_an_empty_registry():
    dispatcher = Dispatcher(Registry(), INTERP)
    with pytest.raises(NoKernelError, match="the registry is empty"):
        dispatcher.select(PROBLEM)
    with pytest.raises(NoKernelError):
        dispatcher.run(operands())


def test_no_kernel_names_the_reasons(dispatcher):
    bf16 = GemmProblem(m=8, n=8, k=8, types=GemmTypes.parse("bf16"))
    with pytest.raises(NoKernelError, match="built for fp16, the problem is bf16"):
        dispatcher.select(bf16)


# --- running -------------------------------------------------------------------------


@interpreter_only
def test_run_computes_the_product(dispatcher):
    ops = operands(seed=1)
    assert_close(dispatcher.run(ops), ops)


@pytest.fixture
def loads(monkeypatch):
    """Every (kernel, specialisation) the kernel step loads, in order."""
    seen = []
    original = kernel_step.load
    monkeypatch.setattr(kernel_step, "load", lambda spec, cache, specialization=None: seen.append(
        (spec.name, specialization)) or original(spec, cache, specialization))
    return seen


@interpreter_only
def test_run_caches_launchers(dispatcher, loads):
    ops = operands()
    dispatcher.run(ops)
    dispatcher.run(ops)
    assert loads == [(dispatcher.select(PROBLEM).name, PROBLEM.alignment)]


@interpreter_only
def test_launchers_are_specialised_on_alignment(dispatcher, loads):
    aligned = operands()
    g = torch.Generator().manual_seed(3)
    a = torch.randn(40, 49, generator=g).half()[:, :48]  # rows of 49 halves: A is not aligned
    unaligned = check_operands(a, aligned.b[0])
    assert unaligned.problem == replace(PROBLEM, alignment=replace(PROBLEM.alignment, a=False))
    spec = dispatcher.select(PROBLEM)
    # Alignment may change the ranking (unaligned loads need registers), so force one kernel:
    assert_close(dispatcher.run(aligned, kernel=spec), aligned)
    assert_close(dispatcher.run(unaligned, kernel=spec), unaligned)
    assert_close(dispatcher.run(unaligned, kernel=spec), unaligned)
    # the artifact is specialised on alignment, once per alignment.
    assert loads == [(spec.name, PROBLEM.alignment), (spec.name, unaligned.problem.alignment)]


@interpreter_only
def test_run_refuses_tensors_off_the_interpreter_device(dispatcher):
    a = torch.empty(40, 48, dtype=torch.float16, device="meta")
    b = torch.empty(24, 48, dtype=torch.float16, device="meta").t()
    with pytest.raises(InvalidProblemError, match="CPU"):
        dispatcher.run(check_operands(a, b))


@interpreter_only
def test_build_error_falls_back_to_the_next_candidate(dispatcher, monkeypatch):
    ranked = [c.spec for c in dispatcher.explain(PROBLEM).ranked]
    broken, runner_up = ranked[0], ranked[1]
    loads = []
    original = kernel_step.load

    def load(spec, cache, specialization=None):
        loads.append(spec.name)
        if spec.name == broken.name:
            raise BuildError(f"ptxas died compiling {spec.name}")
        return original(spec, cache, specialization)

    monkeypatch.setattr(kernel_step, "load", load)
    ops = operands(seed=2)
    out = dispatcher.run(ops)
    assert_close(out, ops)
    assert loads == [broken.name, runner_up.name]
    assert dispatcher.select(PROBLEM) == runner_up  # the memo no longer holds the broken one

    explanation = dispatcher.explain(PROBLEM)
    assert explanation.selected == runner_up
    assert broken not in [c.spec for c in explanation.ranked]
    (refused,) = [c for c in explanation.refused if c.spec == broken]
    assert refused.refused == "failed to build on this machine"
    assert Candidate(broken, "failed to build on this machine").to_dict() in explanation.to_dict()["refused"]


@interpreter_only
def test_build_error_of_a_forced_kernel_is_raised(dispatcher, monkeypatch):
    forced = dispatcher.select(PROBLEM)

    def load(spec, cache, specialization=None):
        raise BuildError("no compiler")

    monkeypatch.setattr(kernel_step, "load", load)
    with pytest.raises(BuildError, match="no compiler"):
        dispatcher.run(operands(), kernel=forced.name)


@interpreter_only
def test_every_candidate_failing_to_build_ends_in_no_kernel(registry, monkeypatch):
    small = registry.filter(lambda s: s.config.types.name == "fp16" and s.config.layout.name == "rcr"
                            and s.config.epilogue.name == "none")
    dispatcher = Dispatcher(small, INTERP)

    def load(spec, cache, specialization=None):
        raise BuildError("broken toolchain")

    monkeypatch.setattr(kernel_step, "load", load)
    with pytest.raises(NoKernelError, match="failed to build on this machine"):
        dispatcher.run(operands())


def test_the_default_for_a_tensor_is_the_default_dispatcher_and_forgotten_with_it():
    """dispatcher_or_default's per-device table stands for default_dispatcher, cache_clear included."""
    import torch

    from tiledispatch.core.dispatcher import default_dispatcher, dispatcher_or_default
    from tiledispatch.core.runtime import Backend

    t = torch.zeros(1)
    first = dispatcher_or_default(None, t)
    assert first is default_dispatcher(backend=Backend.INTERPRETER) is dispatcher_or_default(None, t)
    default_dispatcher.cache_clear()
    again = dispatcher_or_default(None, t)
    assert again is not first and again is default_dispatcher(backend=Backend.INTERPRETER)


def test_rules_first_reads_the_rules_order_back_from_a_model_ordered_ranking(registry):
    """Ranking.rules_first: the best rule score among the kept candidates, equal scores in registry
    order (as the rules' stable sort leaves them), whatever order a model put `accepted` in."""
    import array

    from tiledispatch.core.op import Score
    from tiledispatch.core.ranking import Ranking

    specs = tuple(registry)[:5]
    values = [0.5, 0.9, 0.9, 0.7, 0.9]  # three equal best: the earliest in the registry is the rules' first
    scored = [Candidate(s, None, Score(v, {})) for s, v in zip(specs, values)]
    reversed_by_model = tuple(reversed(scored))
    ranking = Ranking(reversed_by_model, specs, (None,), array.array("B", [0] * len(specs)), "a model")
    assert ranking.rules_first(lambda c: True).spec is specs[1]
    assert ranking.rules_first(lambda c: c.spec is not specs[1]).spec is specs[2]
    assert ranking.rules_first(lambda c: c.spec in (specs[0], specs[3])).spec is specs[3]
    assert ranking.rules_first(lambda c: False) is None
    rules_ordered = Ranking(tuple(sorted(scored, key=lambda c: -c.score.value)), specs, (None,),
                            array.array("B", [0] * len(specs)))
    assert rules_ordered.rules_first(lambda c: True).spec is specs[1]  # no model: the first kept
