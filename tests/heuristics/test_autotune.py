"""The `autotune` strategy: finalists, timing on fresh operands, the on-disk record, and its readers.

Under the interpreter the finalists are timed by wall clock (meaningless as speed, but the
same path); `measure` is replaced where a test needs a known winner.
"""

from types import SimpleNamespace

import pytest
import torch

import tiledispatch
from tiledispatch.core.cache import KernelCache
from tiledispatch.core.dispatcher import Dispatcher, Strategy, default_dispatcher
from tiledispatch.core.op import OpKind, RuleSet
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.heuristics import autotune
from tiledispatch.ops.conv.inputs import make_inputs as conv_inputs
from tiledispatch.ops.conv.reference import compare as conv_compare
from tiledispatch.ops.gemm import check_operands

from ..conftest import on_gpu
from ..ops.conv.helpers import problem as conv_problem

ARCH = current_arch()
DEVICE = "cuda" if on_gpu() else "cpu"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_rule_set(OpKind.GEMM, RuleSet.TESTS, ARCH)


@pytest.fixture
def tuned(registry, tmp_path) -> Dispatcher:
    return Dispatcher(registry, ARCH, strategy=Strategy.AUTOTUNE, cache=KernelCache(tmp_path))


def operands(m=40, n=56, k=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).half().to(DEVICE)
    b = torch.randn(n, k, generator=g).half().t().to(DEVICE)  # column-major, as an nn.Linear weight
    return a, b


def relative_error(got, ref) -> float:
    return float(torch.linalg.vector_norm(got.double().cpu() - ref) / torch.linalg.vector_norm(ref))


def records(dispatcher: Dispatcher) -> list:
    return sorted(dispatcher.tuning.dir.glob("*.json"))


@pytest.fixture
def fixed_times(monkeypatch):
    """`measure` made deterministic: the last finalist is the fastest; returns the calls made."""
    calls = []

    def measure(runs, on_gpu):
        calls.append(list(runs))
        for run in runs.values():
            run()  # every finalist still runs on the fresh operands
        return {name: float(len(runs) - i) for i, name in enumerate(runs)}

    monkeypatch.setattr(autotune, "measure", measure)
    return calls


def test_strategy_parses():
    assert Strategy.parse("AUTOTUNE") is Strategy.AUTOTUNE


def test_finalists_are_the_top_k_then_the_best_of_each_other_family():
    ranked = [SimpleNamespace(spec=SimpleNamespace(family=f, name=str(i)))
              for i, f in enumerate(["tiled", "tiled", "tiled", "tiled", "tma", "vendor", "tma", "vendor"])]
    chosen = autotune.finalists(ranked, top_k=3)
    assert [c.spec.name for c in chosen] == ["0", "1", "2", "4", "5"]
    assert [c.spec.name for c in autotune.finalists(ranked, top_k=5)] == ["0", "1", "2", "3", "4", "5"]


def test_a_vendor_finalist_within_the_margin_wins():
    margin = autotune.VENDOR_MARGIN
    assert autotune.winner({"ours": 1.0, "vendor": 1.0 + margin / 2}, ["vendor"]) == "vendor"
    assert autotune.winner({"ours": 1.0, "vendor": 1.0 + 2 * margin}, ["vendor"]) == "ours"
    assert autotune.winner({"ours": 1.0, "other": 1.01}, []) == "ours"
    assert autotune.winner({"ours": 1.0, "vendor": 0.9}, ["vendor", "untimed"]) == "vendor"


def test_operand_sets_outgrow_l2_on_the_gpu_only():
    assert autotune.operand_sets(10**9, 50 * 2**20, on_gpu=True) == 1
    assert autotune.operand_sets(10**6, 50 * 2**20, on_gpu=True) == autotune.MAX_SETS
    assert autotune.operand_sets(10**6, 50 * 2**20, on_gpu=False) == 1


def test_autotune_times_the_finalists_and_remembers_the_fastest(tuned, fixed_times):
    a, b = operands()
    problem = check_operands(a, b).problem
    rules_order = [c.spec.name for c in autotune.finalists(tuned.explain(problem).ranked)]
    assert tuned.explain(problem).tuned_ms is None  # nothing timed yet: explain ranks by rules

    out = tiledispatch.gemm(a, b, dispatcher=tuned)
    assert relative_error(out, a.double().cpu() @ b.double().cpu()) < 4e-3
    assert fixed_times == [rules_order]
    (record,) = records(tuned)
    explanation = tuned.explain(problem)
    assert explanation.selected.name == rules_order[-1] != explanation.ranked[0].spec.name
    assert set(explanation.tuned_ms) == set(rules_order)
    assert explanation.to_dict()["tuned_ms"][rules_order[-1]] == 1.0
    assert tuned.select(problem).name == rules_order[-1]


def test_a_finalist_with_a_wrong_result_is_never_timed_nor_remembered(tuned, fixed_times, monkeypatch, caplog):
    """Each finalist runs once into a NaN-poisoned output and is checked against the float64
    reference before it is timed: one that writes nothing (here the one `measure` would call the
    fastest) is dropped, and the log names it."""
    a, b = operands(seed=4)
    problem = check_operands(a, b).problem
    names = [c.spec.name for c in autotune.finalists(tuned.explain(problem).ranked)]
    broken = names[-1]
    load_for = Dispatcher.load_for

    def silent_for_one(self, problem, spec):
        launchers = load_for(self, problem, spec)
        return {stage: (lambda grid, args, stream: None) for stage in launchers} if spec.name == broken else launchers

    monkeypatch.setattr(Dispatcher, "load_for", silent_for_one)
    with caplog.at_level("ERROR", logger="tiledispatch"):
        tuned.select(problem, device=a.device)
    assert fixed_times == [names[:-1]]  # the broken kernel was not timed
    explanation = tuned.explain(problem)
    assert broken not in explanation.tuned_ms and explanation.selected.name == names[-2]
    assert any(broken in r.getMessage() and "wrong result" in r.getMessage() for r in caplog.records)


def test_a_later_dispatcher_reads_the_winner_without_timing(registry, tmp_path, fixed_times, monkeypatch):
    a, b = operands()
    problem = check_operands(a, b).problem
    first = Dispatcher(registry, ARCH, strategy=Strategy.AUTOTUNE, cache=KernelCache(tmp_path))
    winner = first.select(problem, device=a.device)
    monkeypatch.setattr(autotune, "measure", lambda runs, on_gpu: pytest.fail("timed again"))
    later = Dispatcher(registry, ARCH, strategy=Strategy.AUTOTUNE, cache=KernelCache(tmp_path))
    assert later.select(problem, device=a.device) == winner
    assert later.select(problem) == winner  # no device needed once remembered


def test_without_a_device_the_rules_pick_is_used_and_not_memoized(tuned, fixed_times):
    a, b = operands()
    problem = check_operands(a, b).problem
    assert tuned.select(problem) == tuned.explain(problem).ranked[0].spec
    assert fixed_times == [] and records(tuned) == []
    assert tuned.select(problem, device=a.device) != tuned.explain(problem).ranked[0].spec
    assert len(fixed_times) == 1


def test_an_unreadable_record_is_tuned_again(registry, tmp_path, fixed_times):
    a, b = operands()
    problem = check_operands(a, b).problem
    Dispatcher(registry, ARCH, strategy=Strategy.AUTOTUNE, cache=KernelCache(tmp_path)).select(problem, device=a.device)
    later = Dispatcher(registry, ARCH, strategy=Strategy.AUTOTUNE, cache=KernelCache(tmp_path))
    (record,) = records(later)
    record.write_text('{"format": 1, "winner": ')  # truncated
    assert later.explain(problem).tuned_ms is None
    later.select(problem, device=a.device)
    assert len(fixed_times) == 2
    assert autotune.TuningStore(tmp_path).get(record.stem).winner == later.select(problem).name


def test_a_residual_added_in_place_is_written_once(tuned):
    """The finalists run on fresh operands: out = a @ b + out must not accumulate once per timing."""
    a, b = operands(seed=1)
    c = torch.randn(40, 56, generator=torch.Generator().manual_seed(2)).half().to(DEVICE)
    expected = a.double().cpu() @ b.double().cpu() + c.double().cpu()
    out = tiledispatch.gemm(a, b, residual=c, out=c, dispatcher=tuned)
    assert out.data_ptr() == c.data_ptr()
    assert relative_error(out, expected) < 4e-3
    assert len(records(tuned)) == 1


def test_a_problem_fresh_operands_cannot_reproduce_is_ranked_by_rules(tuned, fixed_times):
    """A starts two bytes past a 16-byte boundary: fresh tensors would be aligned, another problem."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(40 * 24 + 1, generator=g).half().to(DEVICE)[1:].view(40, 24)
    b = torch.randn(24, 56, generator=g).half().to(DEVICE)
    problem = check_operands(a, b).problem
    assert problem.alignment.unaligned_operands == ("a",)
    out = tiledispatch.gemm(a, b, dispatcher=tuned)
    assert relative_error(out, a.double().cpu() @ b.double().cpu()) < 4e-3
    assert fixed_times == [] and records(tuned) == []


def test_autotune_conv(tmp_path):
    registry = Registry.from_rule_set(OpKind.CONV, RuleSet.TESTS, ARCH)
    tuned = Dispatcher(registry, ARCH, strategy=Strategy.AUTOTUNE, cache=KernelCache(tmp_path))
    p = conv_problem("forward", 2, 8, 8, 8, (6, 5), (3, 3), padding=1)
    inputs = conv_inputs(p, device=DEVICE, seed=4)
    ops = tiledispatch.ops.conv.check_operands(p.direction, **inputs.kwargs(p))
    tuned.run(ops)
    assert conv_compare(inputs.out, ops).passed
    (record,) = records(tuned)
    assert tuned.explain(ops.problem).selected.name in tuned.explain(ops.problem).tuned_ms


def test_default_dispatcher_takes_its_strategy_from_the_environment(monkeypatch):
    default_dispatcher.cache_clear()
    monkeypatch.setenv("TILEDISPATCH_STRATEGY", "autotune")
    try:
        assert default_dispatcher(RuleSet.TINY).strategy is Strategy.AUTOTUNE
    finally:
        default_dispatcher.cache_clear()
