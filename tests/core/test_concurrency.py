"""Threads and processes sharing the dispatcher: interpreted launches, one-time loads and
rankings, per-kernel waits, and memo tables bounded by least recent use."""

import faulthandler
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import arch
from tiledispatch.core import dispatcher as dispatcher_module
from tiledispatch.core import kernel as kernel_step
from tiledispatch.core import registry as registry_module
from tiledispatch.core import runtime
from tiledispatch.core import spec as spec_module
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.errors import BuildError, CacheError, InsecureCacheError, NoKernelError
from tiledispatch.core.memo import LruTable
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm import check_operands
from tiledispatch.ops.gemm.problem import GemmProblem, GemmTypes

from ..conftest import interpreter_only

INTERP = arch.load("interpreter")
GEMM = get_op(OpKind.GEMM)
WAIT_S = 60  # how long a thread may take before the test calls it stuck (never reached when it passes)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, INTERP)


def problem(m: int) -> GemmProblem:
    return GemmProblem(m=m, n=8, k=8, types=GemmTypes.parse("fp16"))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return float(torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want))


def run_threads(count: int, work) -> list:
    """work(i) in `count` threads started together; their results, or their errors re-raised."""
    start = threading.Barrier(count)

    def one(i):
        start.wait(timeout=WAIT_S)
        return work(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count), timeout=WAIT_S * 4))


# --- LruTable ----------------------------------------------------------------------------


def test_lru_table_keeps_its_capacity_and_the_recently_used():
    table = LruTable(3)
    for key in "abc":
        table.put(key, key.upper())
    assert table.get("a") == "A"  # a is now the most recent: b is the oldest
    table.put("d", "D")
    assert len(table) == 3 and "b" not in table and table.keys() == ["c", "a", "d"]
    assert table.get("b", "missing") == "missing"
    for i in range(100):
        table.put(i, i)
    assert len(table) == 3 and table.keys() == [97, 98, 99]
    with pytest.raises(ValueError, match="capacity"):
        LruTable(0)


def test_get_or_make_makes_a_key_once_for_threads_that_ask_together():
    table = LruTable(8)
    made = []

    def make():
        made.append(threading.get_ident())
        time.sleep(0.05)  # the other threads arrive while it is being made
        return object()

    values = run_threads(8, lambda i: table.get_or_make("key", make))
    assert len(made) == 1 and all(v is values[0] for v in values)


def test_get_or_make_shares_errors_only_when_asked():
    shared, own = LruTable(4), LruTable(4)
    calls = []

    def failing():
        calls.append(1)
        time.sleep(0.05)
        raise BuildError("no compiler")

    def attempt(table, **kwargs):
        try:
            table.get_or_make("k", failing, **kwargs)
        except BuildError as e:
            return str(e)

    assert run_threads(4, lambda i: attempt(shared, share_errors=True)) == ["no compiler"] * 4
    assert len(calls) == 1 and len(shared) == 0  # a failure is not remembered
    calls.clear()
    assert run_threads(4, lambda i: attempt(own)) == ["no compiler"] * 4
    assert len(calls) == 4  # each thread tried for itself


def test_get_or_make_of_its_own_key_inside_make_does_not_wait_on_itself():
    table = LruTable(4)
    assert table.get_or_make("k", lambda: table.get_or_make("k", lambda: 1) + 1) == 2
    assert table.get("k") == 2


# --- the dispatcher's memos ----------------------------------------------------------------


def test_selections_and_bound_calls_are_bounded_and_keep_what_is_reused(registry, monkeypatch):
    monkeypatch.setattr(dispatcher_module, "SELECTIONS_KEPT", 4, raising=False)
    monkeypatch.setattr(dispatcher_module, "BOUND_KEPT", 4, raising=False)
    d = Dispatcher(registry, INTERP)
    kept = problem(1)
    first = d.select(kept)
    d.memo("kept", lambda: "bound")
    for m in range(2, 14):  # three times the capacity in other problems, the kept one used between
        d.select(problem(m))
        d.memo(("other", m), lambda: m)
        assert d.select(kept) is first and d.memo("kept", lambda: pytest.fail("made again")) == "bound"
    assert len(d._selected) == 4 and len(d._bound) == 4
    assert problem(2).key() not in d._selected and ("other", 2) not in d._bound  # the oldest went


def test_rankings_are_bounded_and_small(registry):
    d = Dispatcher(registry, INTERP)
    problems = [problem(m) for m in range(1, dispatcher_module.RANKINGS_KEPT + 9)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for p in problems:
            d.select(p)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    kept = problems[-dispatcher_module.RANKINGS_KEPT:]
    accepted = sum(len(d.explain(p).ranked) for p in kept)
    # A refused kernel costs a byte or two (not an object and its reason); an accepted one, its
    # candidate and score.
    assert held < len(kept) * len(registry) * 8 + accepted * 4096
    assert len(d._rankings) == len(kept)
    explanation = d.explain(problems[-1])
    assert len(explanation.ranked) + len(explanation.refused) == len(registry)
    assert all(c.refused == c.spec.definition.supports(c.spec.config, problems[-1]) for c in explanation.refused)


@pytest.fixture
def slow_supports(monkeypatch):
    """Counts `supports` calls; the first one sleeps, so that threads meet one unranked problem."""
    calls = []

    def counting(config, problem):
        calls.append(config)
        if len(calls) == 1:
            time.sleep(0.2)
        return GEMM.supports(config, problem)

    counted = replace(GEMM, supports=counting)
    monkeypatch.setattr(spec_module, "get_op", lambda op: counted)
    monkeypatch.setattr(dispatcher_module, "get_op", lambda op: counted)  # its ranking asks the op once
    return calls


def test_threads_meeting_a_new_problem_rank_it_once(registry, slow_supports):
    d = Dispatcher(registry, INTERP)
    picks = run_threads(8, lambda i: d.select(problem(24)))
    assert len(set(picks)) == 1
    # One ranking: each group of kernels that `supports` sees alike asked once (`OpDefinition.support_key`).
    assert len(slow_supports) == len({GEMM.support_key(spec.config) for spec in registry}) < len(registry)


def test_first_calls_from_threads_make_one_default_dispatcher(monkeypatch):
    made = []
    original = Registry.from_rule_set.__func__

    def slow(cls, op, rule_set, arch):
        made.append(op)
        time.sleep(0.05)
        return original(cls, op, rule_set, arch)

    monkeypatch.setattr(registry_module.Registry, "from_rule_set", classmethod(slow))
    tiledispatch.default_dispatcher.cache_clear()
    try:
        made_by_threads = run_threads(8, lambda i: tiledispatch.default_dispatcher(RuleSet.TINY))
        assert all(d is made_by_threads[0] for d in made_by_threads)
        assert tiledispatch.default_dispatcher("tiny") is made_by_threads[0]
        assert len(made) == len(set(made))  # each op's registry made once
    finally:
        tiledispatch.default_dispatcher.cache_clear()  # the next caller makes one with the real registries


# --- loading kernels ---------------------------------------------------------------------------


def test_a_slow_load_holds_up_only_the_threads_that_want_its_kernel(registry, monkeypatch):
    slow, other = list(registry)[:2]
    release, started = threading.Event(), threading.Event()
    loads = []

    def load(spec, cache, specialization=None):
        loads.append(spec.name)
        if spec.name == slow.name:
            started.set()
            assert release.wait(WAIT_S)
        return {"main": spec.name}

    monkeypatch.setattr(kernel_step, "load", load)
    d = Dispatcher(registry, INTERP)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(d.launchers, slow)
        assert started.wait(WAIT_S)
        second = pool.submit(d.launchers, slow)  # waits for the one build of its kernel
        # Another kernel loads while the slow build is still running.
        assert pool.submit(d.launchers, other).result(timeout=WAIT_S) == {"main": other.name}
        assert not first.done() and not second.done()
        release.set()
        assert first.result(timeout=WAIT_S) is second.result(timeout=WAIT_S)
    assert sorted(loads) == sorted([slow.name, other.name])  # each loaded once


@interpreter_only  # CPU tensors: a GPU process refuses them before any load
def test_threads_share_a_build_error_and_each_falls_back(registry, monkeypatch):
    d = Dispatcher(registry, INTERP)
    ops = check_operands(torch.randn(24, 16).half(), torch.randn(16, 8).half())
    broken = d.select(ops.problem)
    loads = []
    original = kernel_step.load

    def load(spec, cache, specialization=None):
        loads.append(spec.name)
        if spec.name == broken.name:
            time.sleep(0.3)  # the other threads ask for it meanwhile
            raise BuildError(f"ptxas died compiling {spec.name}")
        return original(spec, cache, specialization)

    monkeypatch.setattr(kernel_step, "load", load)
    picks = run_threads(4, lambda i: d.prepare(ops)[0])
    assert broken not in picks and len(set(picks)) == 1
    assert loads.count(broken.name) == 1


# --- races of real calls -------------------------------------------------------------------------


@interpreter_only
def test_threads_calling_ops_on_the_interpreter_get_right_answers():
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    cases = [(torch.randn(24, 16, generator=g).to(dtype), torch.randn(16, 8, generator=g).to(dtype))
             for dtype in (torch.float16, torch.float32)]
    q, k, v = (torch.randn(1, 2, 16, 32, generator=g) for _ in range(3))
    x, w = torch.randn(1, 4, 6, 6, generator=g), torch.randn(8, 4, 3, 3, generator=g)
    for a, b in cases:  # warm: the kernels are loaded; the race is between launches
        tiledispatch.gemm(a, b)

    def work(i):
        errors = []
        for j in range(3):
            a, b = cases[(i + j) % 2]
            errors.append(relative_error(tiledispatch.gemm(a, b), a.double() @ b.double()))
        if i % 8 == 0:
            errors.append(relative_error(tiledispatch.attention(q, k, v), F.scaled_dot_product_attention(q, k, v)))
        if i % 8 == 4:
            errors.append(relative_error(tiledispatch.conv(x, w, padding=1), F.conv2d(x, w, padding=1)))
        return max(errors)

    assert max(run_threads(16, work)) < 4e-3


# A small registry: the process's first call ranks it; importing torch is most of a process's time.
PROCESS_SCRIPT = """
import torch, tiledispatch
from tiledispatch import arch
dispatcher = tiledispatch.Dispatcher(tiledispatch.Registry.from_rule_set("gemm", "tiny", arch.load("interpreter")))
g = torch.Generator().manual_seed({seed})
a, b = torch.randn(40, 24, generator=g), torch.randn(24, 16, generator=g)
want = a.double() @ b.double()
got = tiledispatch.gemm(a, b, dispatcher=dispatcher).double()
err = torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)
assert err < 1e-4, float(err)
print("ok")
"""


@interpreter_only
def test_processes_making_first_calls_against_one_fresh_cache(tmp_path):
    os.chmod(tmp_path, 0o700)
    env = {**os.environ, "TILEDISPATCH_CACHE_DIR": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    seeds = [int.from_bytes(os.urandom(2), "little") + i for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS_SCRIPT.format(seed=seed)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in seeds]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok", err[-2000:]


@interpreter_only
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_a_child_forked_while_other_threads_hold_locks_runs_kernels(registry):
    """A child forked while its parent's threads run a kernel and make a memo's value has those
    threads' locks and flights, not the threads: it must take fresh ones."""
    d = Dispatcher(registry, INTERP)
    a, b = torch.randn(24, 16), torch.randn(16, 8)
    tiledispatch.gemm(a, b, dispatcher=d)  # warm: the child launches a loaded kernel
    table, hold, held = LruTable(4), threading.Event(), threading.Barrier(3)

    def run_a_kernel():
        with runtime.INTERPRETER_LOCK:
            held.wait(WAIT_S)
            hold.wait(WAIT_S)

    def make_a_value():
        table.get_or_make("k", lambda: held.wait(WAIT_S) + hold.wait(WAIT_S))

    want = a.double() @ b.double()  # here: a BLAS thread pool may not survive a fork

    def child():
        faulthandler.dump_traceback_later(WAIT_S / 2, exit=True)  # where a hang is, in the test's output
        assert table.get_or_make("k", lambda: "the child's") == "the child's"
        assert relative_error(tiledispatch.gemm(a, b, dispatcher=d), want) < 1e-4

    threads = [threading.Thread(target=run_a_kernel), threading.Thread(target=make_a_value)]
    for t in threads:
        t.start()
    held.wait(WAIT_S)
    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    try:
        process.join(WAIT_S)
        assert process.exitcode == 0, "the forked child failed" if process.exitcode else "the forked child hung"
    finally:
        if process.exitcode is None:
            process.kill()
        hold.set()
        for t in threads:
            t.join(WAIT_S)


@interpreter_only
def test_a_cache_error_falls_back_to_the_next_candidate_unless_the_cache_is_insecure(registry, monkeypatch):
    a, b = torch.randn(24, 16), torch.randn(16, 8)
    ops = check_operands(a, b)
    d = Dispatcher(registry, INTERP)
    unreadable = d.select(ops.problem)
    original = kernel_step.load

    def load(spec, cache, specialization=None):
        if spec.name == unreadable.name:
            raise CacheError(f"the cache entry of {spec.name} cannot be read")
        return original(spec, cache, specialization)

    monkeypatch.setattr(kernel_step, "load", load)
    assert relative_error(d.run(ops), a.double() @ b.double()) < 1e-4
    assert d.select(ops.problem) != unreadable

    def insecure(spec, cache, specialization=None):
        raise InsecureCacheError("the cache directory is writable by others")

    monkeypatch.setattr(kernel_step, "load", insecure)
    with pytest.raises(InsecureCacheError):  # every kernel would fail alike: said once, not hidden
        Dispatcher(registry, INTERP).run(ops)

    def unreadable_all(spec, cache, specialization=None):
        raise CacheError(f"the cache entry of {spec.name} cannot be read")

    monkeypatch.setattr(kernel_step, "load", unreadable_all)
    with pytest.raises(NoKernelError, match="failed to build on this machine") as caught:
        Dispatcher(registry, INTERP).run(ops)
    assert isinstance(caught.value.__cause__, CacheError)  # the last candidate's reason, kept
