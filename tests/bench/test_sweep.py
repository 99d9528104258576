"""The sweep engine on the CPU interpreter: rows with every column, the check, faults, hangs,
resuming, the Dask path, the CLI; gemm, conv and attention each swept once."""

import json
import math
import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tiledispatch import arch as arch_facts
from tiledispatch.bench import sweep_runner, sweep_worker
from tiledispatch.bench.sweep import CandidatePolicy, gather, planned, read_table, sweep
from tiledispatch.bench.table import COLUMNS, Status, canonical_json, problem_from_row, problem_id
from tiledispatch.cli.main import app
from tiledispatch.core.errors import InvalidArgumentError
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry

from ..conftest import on_gpu

pytestmark = pytest.mark.skipif(on_gpu(), reason="sweeps the interpreter's tiny rule set on CPU tensors")

INTERP = "interpreter"


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def gemm_problems():
    from tiledispatch.ops.gemm import check_operands

    return [check_operands(meta(33, 40), meta(40, 24)).problem, check_operands(meta(5, 24), meta(24, 48)).problem]


def conv_problem(direction=None):
    from tiledispatch.ops.conv import Direction, check_operands

    x = meta(2, 8, 6, 6).to(memory_format=torch.channels_last)
    w = meta(8, 8, 3, 3).to(memory_format=torch.channels_last)
    return check_operands(Direction.FORWARD, x=x, w=w, padding=(1, 1)).problem


def attention_problems():
    from tiledispatch.ops.attention import AttentionOptions, Direction, check_operands

    q, k = meta(1, 4, 16, 32, dtype=torch.float32), meta(1, 2, 16, 32, dtype=torch.float32)
    forward = check_operands(q, k, k, options=AttentionOptions(causal=True)).problem
    backward = check_operands(q, k, k, options=AttentionOptions(causal=True), direction=Direction.BACKWARD,
                              out=meta(1, 4, 16, 32, dtype=torch.float32), lse=meta(1, 4, 16, dtype=torch.float32),
                              grad_out=meta(1, 4, 16, 32, dtype=torch.float32)).problem
    return [forward, backward]


def ranked_names(problem, count):
    interpreter = arch_facts.load(INTERP)
    dispatcher = Dispatcher(Registry.from_rule_sets([problem.op], "tiny", interpreter), interpreter)
    return [c.spec.name for c in dispatcher.ranked(problem)][:count]


def test_gemm_rows_have_every_column_and_a_rerun_adds_none(tmp_path):
    problems = gemm_problems()
    policy = CandidatePolicy(top=2, sample=1, seed=3)
    report = sweep("gemm", problems + problems[:1], out=tmp_path, rule_set="tiny", arch=INTERP, candidates=policy,
                   kernels_per_task=2, problem_set_name="unit")  # a problem given twice is swept once
    frame = read_table(tmp_path)
    assert list(frame.columns) == list(COLUMNS)
    assert len(frame) == report.kernels == 6 and report.rows == {"ok": 6} and report.problems == 2
    assert set(frame.problem_id) == {problem_id(p) for p in problems}
    for _, row in frame.iterrows():
        problem = problem_from_row("gemm", row.problem)
        assert row.problem_id == problem_id(problem) and row.problem == canonical_json(problem)
        assert (row.op, row.direction, row["dtype"], row.arch, row.problem_set) == ("gemm", "forward", "fp16", INTERP,
                                                                                 "unit")
        assert row.status == "ok" and row.time_ms > 0 and math.isclose(row.tflops, row.flops / row.time_ms / 1e9)
        assert row.bytes == problem.bytes() and row.flops == problem.flops() and row.gbps > 0
        assert row.kernel.endswith("_interp") and row.family and not row.vendor and row.triton and row.torch
        assert row.host and row.timestamp and row.rule_score is not None and row.rule_rank >= 0
    for problem in problems:  # the rules' top 2 of each problem are in, with their ranks
        ranks = sorted(frame[frame.problem_id == problem_id(problem)].rule_rank)
        assert ranks[:2] == [0, 1] and len(ranks) == 3
    staging = tmp_path / ".part-20260101T000000-0123456789ab.parquet.tmp"  # a part a killed sweep left half-written
    staging.write_bytes(b"PAR1")
    again = sweep("gemm", problems, out=tmp_path, rule_set="tiny", arch=INTERP, candidates=policy, kernels_per_task=2)
    assert again.kernels == 0 and again.skipped == 6 and len(read_table(tmp_path)) == 6 and not staging.exists()


def test_one_sweep_at_a_time_writes_a_directory_and_a_damaged_part_is_named(tmp_path):
    from tiledispatch.bench.sweep import locked

    with locked(tmp_path):  # as a sweep running into the same directory holds it
        with pytest.raises(InvalidArgumentError, match="another sweep is writing"):
            sweep("gemm", gemm_problems(), out=tmp_path, rule_set="tiny", arch=INTERP)
    (tmp_path / "part-bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(InvalidArgumentError, match="part-bad.parquet"):
        read_table(tmp_path)
    with pytest.raises(InvalidArgumentError, match="part-bad.parquet"):
        sweep("gemm", gemm_problems(), out=tmp_path, rule_set="tiny", arch=INTERP)


@pytest.mark.parametrize("arguments, match", [
    ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": float("nan")}, "timeout_s"), ({"jobs": 0}, "jobs"),
    ({"kernels_per_task": 0}, "kernels_per_task"), ({"prebuild_jobs": -1}, "prebuild_jobs"),
    ({"gpus": ["0", "x"]}, "gpus"), ({"gpus": [0, 0]}, "gpus"), ({"gpus": [0], "scheduler": "tcp://h:1"}, "give one"),
    ({"problems": "conv"}, r"problems\[2\] is a conv problem"), ({"problems": "dict"}, r"problems\[2\] is a dict")])
def test_bad_sweep_arguments_are_named_before_anything_runs(tmp_path, arguments, match):
    problems = gemm_problems() + {"conv": [conv_problem()], "dict": [{"m": 1}]}.get(arguments.pop("problems", ""), [])
    with pytest.raises(InvalidArgumentError, match=match):  # no row written before: not even a refusal's
        sweep("gemm", problems, out=tmp_path, rule_set="tiny", arch=INTERP,
              candidates=CandidatePolicy(record_refused=True), **arguments)
    assert not list(tmp_path.glob("*.parquet"))


def test_check_catches_a_wrong_kernel(monkeypatch):
    """A kernel whose output is off is WRONG, its error naming the max error; the others are OK."""
    from tiledispatch.core import launch

    problem = gemm_problems()[0]
    names = ranked_names(problem, 2)
    registry = Registry.from_rule_sets([problem.op], "tiny", arch_facts.load(INTERP))
    registry.candidates(problem.op, problem)
    specs = tuple(registry.get(n) for n in names)
    real = launch.execute

    def off_by_one(plan, launchers, stream):
        out = real(plan, launchers, stream)
        if launchers is wrong_launchers[0]:
            out.add_(1.0)
        return out

    wrong_launchers = []
    loaded = sweep_worker._Kernels.check

    def check(self, spec):
        launchers = self.dispatcher.launchers(spec, self.specialization)
        wrong_launchers[:] = [launchers if spec.name == names[1] else None]
        return loaded(self, spec)

    monkeypatch.setattr(launch, "execute", off_by_one)
    monkeypatch.setattr(sweep_worker._Kernels, "check", check)
    result = sweep_worker.run_task(sweep_worker.Task(problem, specs))
    right, wrong = result.outcomes
    assert right.status is Status.OK and right.time_ms > 0
    assert wrong.status is Status.WRONG and wrong.time_ms is None
    detail = json.loads(wrong.error)
    assert detail["max_abs_error"] >= 0.99 and not detail["passed"]


def test_checked_kernels_are_timed_in_turns_and_in_groups_their_outputs_fit(monkeypatch):
    """Every kernel is checked before any is timed; each round samples each waiting kernel once, the
    kernel named in flight before each sample; a timer that raises fails its kernel alone; kernels
    whose outputs together pass the device's share are timed in groups."""
    problem = gemm_problems()[0]
    registry = Registry.from_rule_sets([problem.op], "tiny", arch_facts.load(INTERP))
    registry.candidates(problem.op, problem)
    specs = tuple(registry.get(n) for n in ranked_names(problem, 3))
    events = []

    def check(self, spec):
        events.append(("check", spec.name))

        def sample():
            events.append(("sample", spec.name))
            if spec is specs[1]:
                raise RuntimeError("a launch failed")
            return 1.0 + specs.index(spec)
        return sweep_worker._Timer(spec.name, sample, [], 10)

    init = sweep_worker._Kernels.__init__

    def three_rounds(self, task):
        init(self, task)
        self.rounds = 3

    monkeypatch.setattr(sweep_worker._Kernels, "check", check)
    monkeypatch.setattr(sweep_worker._Kernels, "__init__", three_rounds)
    for limit, groups in ((100, [specs]), (15, [specs[:2], specs[2:]])):
        events.clear()
        monkeypatch.setattr(sweep_worker._Kernels, "held_bytes_limit", lambda self, limit=limit: limit)
        started = []
        result = sweep_worker.run_task(sweep_worker.Task(problem, specs), started.append)
        statuses = [o.status for o in result.outcomes]
        assert statuses == [Status.OK, Status.LAUNCH_FAILED, Status.OK]
        assert [o.time_ms for o in result.outcomes] == [1.0, None, 3.0]
        assert "a launch failed" in result.outcomes[1].error
        done = 0
        for group in groups:  # its checks, then its rounds: each a permutation of the kernels still timed
            names = [s.name for s in group]
            assert events[done:done + len(group)] == [("check", n) for n in names]
            done += len(group)
            timed = [n for n in names if n != specs[1].name]
            samples = events[done:done + 1 + 3 * len(timed)]
            failing = specs[1].name in names
            rounds = [e[1] for e in samples if e[1] != specs[1].name]
            assert sorted(rounds) == sorted(timed * 3)
            for r in range(3):
                assert sorted(rounds[r * len(timed):(r + 1) * len(timed)]) == sorted(timed)
            done += len(timed) * 3 + failing
        assert done == len(events)
        sampled = [name for name in started if name in {s.name for s in specs}]
        assert sampled.count(specs[0].name) == 1 + 3  # its check and each sample


def test_a_kernel_far_slower_than_the_batchs_fastest_in_two_calls_is_not_sampled(monkeypatch):
    """A checked kernel whose first two calls both take more than SLOW_FACTOR times the fastest first
    call so far is OK with the faster call's time and a note, and never sampled; one whose second call
    comes within the factor (the first was held up) is sampled as usual, as is one within it at once."""
    problem = gemm_problems()[0]
    registry = Registry.from_rule_sets([problem.op], "tiny", arch_facts.load(INTERP))
    registry.candidates(problem.op, problem)
    specs = tuple(registry.get(n) for n in ranked_names(problem, 4))
    assert len(specs) == 4
    # the first sets the pace; 9x then 9.5x is past the factor of 8; 75x then 1.2x was a held-up call; 7.5x is not
    firsts = iter([1.0, 9.0, 9.5, 75.0, 1.2, 7.5])
    samplers = []
    real_sampler = sweep_worker._sampler

    def sampler(run, on_gpu):
        samplers.append(run)
        return real_sampler(run, on_gpu)

    monkeypatch.setattr(sweep_worker, "_first_ms", lambda run, on_gpu: next(firsts))
    monkeypatch.setattr(sweep_worker, "_sampler", sampler)
    result = sweep_worker.run_task(sweep_worker.Task(problem, specs))
    fast, slow, held_up, near = result.outcomes
    assert sweep_worker.SLOW_FACTOR == 8.0
    assert slow.status is Status.OK and slow.time_ms == 9.0 and "9x" in slow.error
    for outcome in (fast, held_up, near):
        assert outcome.status is Status.OK and outcome.error is None
        assert outcome.time_ms not in (1.0, 1.2, 75.0, 7.5)  # sampled, not a first call's time
    assert len(samplers) == 3  # all but the slow one's
    assert next(firsts, None) is None  # the slow and the held-up kernels were each called twice


def test_a_fault_while_timing_in_turns_is_reported_at_once(monkeypatch):
    """A lost context fails every later sample: the kernel whose sample lost it is reported before
    any other, as the worker then ends (`report` exits the process on a FAULT)."""
    kernels = object.__new__(sweep_worker._Kernels)
    kernels.rounds, kernels.device = 3, torch.device("cpu")
    monkeypatch.setattr(sweep_worker, "_context_lost", lambda device: True)
    lost = []

    def sample_of(name):
        def sample():
            if name == "b" or lost:
                lost.append(name)
                raise RuntimeError("an illegal memory access was encountered")
            return 1.0
        return sample
    reported = []

    class Exited(Exception):
        pass

    def report(outcome):
        reported.append(outcome)
        if outcome.status is Status.FAULT:
            raise Exited
    timers = [sweep_worker._Timer(name, sample_of(name), [], 0) for name in "abc"]
    with pytest.raises(Exited):
        kernels.time_in_turns(timers, lambda name: None, report)
    assert [(o.kernel, o.status) for o in reported] == [("b", Status.FAULT)]
    assert "illegal memory access" in reported[0].error


class _Pipe:
    """The child's end of its pipe, in this process: the tasks it is sent, what it sends back."""

    def __init__(self, *tasks):
        self.inbox, self.sent = [*tasks, None], []

    def recv(self):
        return self.inbox.pop(0)

    def send(self, message):
        self.sent.append(message)


def test_a_batch_failing_after_its_kernels_ran_keeps_their_outcomes(monkeypatch):
    """A task that fails as a whole after some kernels finished (here: reading the device at its
    end) reports those kernels' outcomes, and LAUNCH_FAILED only for the kernels it never ran."""
    problem = gemm_problems()[1]
    registry = Registry.from_rule_sets([problem.op], "tiny", arch_facts.load(INTERP))
    registry.candidates(problem.op, problem)
    specs = tuple(registry.get(n) for n in ranked_names(problem, 2))

    def broken():
        raise RuntimeError("nvidia-smi is gone")

    monkeypatch.setattr(sweep_worker, "device_info", broken)
    pipe = _Pipe(sweep_worker.Task(problem, specs))
    sweep_runner._child(pipe)
    (result,) = [value for kind, value in pipe.sent if kind == "done"]
    assert [o.status for o in result.outcomes] == [Status.OK, Status.OK]
    assert all(o.time_ms > 0 for o in result.outcomes)


def test_the_fault_hooks_take_interpreter_kernels_only(monkeypatch):
    problem = gemm_problems()[0]
    interpreter = Registry.from_rule_sets([problem.op], "tiny", arch_facts.load(INTERP))
    interpreter.candidates(problem.op, problem)
    spec = interpreter.get(ranked_names(problem, 1)[0])
    sm90 = Dispatcher(Registry.from_rule_sets([problem.op], "default", arch_facts.load("sm_90")),
                      arch_facts.load("sm_90"))
    gpu_spec = sm90.ranked(problem)[0].spec
    monkeypatch.setenv(sweep_worker.INJECT_ENV, json.dumps({spec.name: "exit", gpu_spec.name: "exit"}))
    assert sweep_worker.injected((spec,))[spec.name] is sweep_worker.Inject.EXIT
    assert sweep_worker.injected((gpu_spec,)) == {}  # a real sweep never takes them, whatever the shell holds
    for text in ("exit", json.dumps({spec.name: "explode"})):
        monkeypatch.setenv(sweep_worker.INJECT_ENV, text)
        with pytest.raises(ValueError, match=sweep_worker.INJECT_ENV):
            sweep_worker.injected((spec,))


def test_a_killed_worker_takes_its_compile_processes_with_it():
    runner = sweep_runner.IsolatedRunner({}, 30)
    runner._start()
    try:
        leader = runner._process.pid
        assert os.getpgid(leader) == leader
        # a process of the child's group, as its build's compile processes are
        compiler = subprocess.Popen(["sleep", "120"], process_group=leader)
    finally:
        runner.close(0)
    assert compiler.wait(20) == -signal.SIGKILL


def _marked(marker: bytes) -> list[int]:
    """The live processes whose environment holds `marker` (a zombie has ended: only its entry waits
    for a parent to reap it, and an orphan's parent, PID 1 in a container, may never do so)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and marker in (entry / "environ").read_bytes()
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_sigterm_stops_the_cli_sweep_with_its_report_and_no_process_left(tmp_path):
    """A sweep stopped by a time limit's SIGTERM prints what it wrote (exit 130) and leaves no
    worker behind, though its worker hangs in a kernel."""
    problem = gemm_problems()[0]
    names = ranked_names(problem, 2)
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps([json.loads(canonical_json(problem))]))
    marker = f"R1_SWEEP_MARK={uuid.uuid4().hex}"
    env = {**os.environ, sweep_worker.INJECT_ENV: json.dumps({names[1]: "hang"}), "R1_SWEEP_MARK": marker[14:]}
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "tiledispatch", "sweep", "--op", "gemm", "--problems", str(problems),
                             "--rule-set", "tiny", "--arch", INTERP, "--top", "2", "--kernels-per-task", "1",
                             "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("part-*.parquet")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)  # the worker reaches the hanging kernel
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    document = json.loads(stdout)
    assert document["status"] == "interrupted" and document["rows"] == {"ok": 1} and "1/2 tasks" in stderr
    assert read_table(out).kernel.tolist() == [names[0]]
    time.sleep(1)
    assert _marked(marker.encode()) == []


def test_a_fault_and_a_hang_are_rows_and_the_sweep_goes_on(tmp_path, monkeypatch):
    problem = gemm_problems()[0]
    names = ranked_names(problem, 4)
    monkeypatch.setenv(sweep_worker.INJECT_ENV, json.dumps({names[1]: "exit", names[2]: "hang"}))
    report = sweep("gemm", [problem], out=tmp_path, rule_set="tiny", arch=INTERP, candidates=CandidatePolicy(top=4),
                   kernels_per_task=4, timeout_s=6)
    status = dict(zip(*(read_table(tmp_path)[c] for c in ("kernel", "status"))))
    assert status == {names[0]: "ok", names[1]: "fault", names[2]: "timeout", names[3]: "ok"}
    assert report.rows == {"ok": 2, "fault": 1, "timeout": 1}


def test_conv_and_attention_sweep_with_refusals_recorded(tmp_path):
    conv = sweep("conv", [conv_problem()], out=tmp_path / "conv", rule_set="tiny", arch=INTERP,
                 candidates=CandidatePolicy(top=2, record_refused=True))
    frame = read_table(tmp_path / "conv")
    assert conv.rows["ok"] == 2 and conv.rows["unsupported"] == len(frame) - 2 > 0
    refused = frame[frame.status == "unsupported"]
    assert refused.error.str.len().min() > 0 and refused.time_ms.isna().all() and refused.rule_rank.isna().all()
    attention = sweep("attention", attention_problems(), out=tmp_path / "attention", rule_set="tiny", arch=INTERP,
                      candidates=CandidatePolicy(top=1))
    frame = read_table(tmp_path / "attention")
    assert attention.rows == {"ok": 2} and set(frame.direction) == {"fwd", "bwd"}


def test_candidate_policy_and_the_vendor_flag():
    policy = CandidatePolicy(top=2, sample=3, seed=1)
    chosen = policy.choose(list(range(20)), "abc")
    assert chosen[:2] == [0, 1] and len(chosen) == 5 and chosen == policy.choose(list(range(20)), "abc")
    assert CandidatePolicy().choose(list(range(4)), "x") == [0, 1, 2, 3]
    for bad in ({"top": 0}, {"top": True}, {"sample": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CandidatePolicy(**bad)
    # On a GPU arch the vendor kernel (cuBLAS through torch) is always timed, whatever the policy.
    sm90 = arch_facts.load("sm_90")
    problem = gemm_problems()[0]
    dispatcher = Dispatcher(Registry.from_rule_sets([problem.op], "default", sm90), sm90)
    rows = planned(dispatcher, problem, CandidatePolicy(top=1))
    vendors = [r for r in rows if r.vendor]
    assert vendors and all(r.spec.is_vendor for r in vendors)
    assert rows[0].rule_rank == 0 and len(rows) == 1 + sum(r.rule_rank != 0 for r in vendors)
    # A refused vendor kernel (SDPA's backward on a forward problem) is flagged as the vendor's too.
    from tiledispatch.ops.attention import check_operands

    q, k = meta(1, 4, 16, 32), meta(1, 2, 16, 32)
    attention = check_operands(q, k, k).problem
    dispatcher = Dispatcher(Registry.from_rule_sets([attention.op], "default", sm90), sm90)
    rows = planned(dispatcher, attention, CandidatePolicy(top=1, record_refused=True))
    assert [r.vendor for r in rows] == [r.spec.is_vendor for r in rows]
    assert any(r.refused and r.vendor for r in rows)
    # A 1x1 conv: cuDNN is the vendor; the gemm family, a Python call into the GEMM op's Triton
    # kernels, is not.
    from tiledispatch.ops.conv import Direction
    from tiledispatch.ops.conv import check_operands as conv_operands

    cl = dict(device="meta", dtype=torch.bfloat16)
    x = torch.empty(8, 64, 14, 14, **cl).to(memory_format=torch.channels_last)
    w = torch.empty(256, 64, 1, 1, **cl).to(memory_format=torch.channels_last)
    conv = conv_operands(Direction.FORWARD, x=x, w=w).problem
    dispatcher = Dispatcher(Registry.from_rule_sets([conv.op], "default", sm90), sm90)
    rows = {r.spec.definition.family_of(r.spec.config): r.vendor for r in planned(dispatcher, conv, CandidatePolicy())}
    assert rows["vendor"] and rows["gemm"] is False


def test_cli_sweeps_a_problem_file(tmp_path):
    problem = gemm_problems()[0]
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps([json.loads(canonical_json(problem))]))
    result = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(problems), "--dtype", "fp16",
                                      "--rule-set", "tiny", "--top", "1", "--out", str(tmp_path / "out")])
    document = json.loads(result.stdout)
    assert result.exit_code == 0, result.output
    assert document["rows"] == {"ok": 1} and document["problem_set"] == "problems" and document["problems"] == 1
    named = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", "gemm-llm-small", "--dtype", "fp16",
                                     "--limit", "1", "--rule-set", "tiny", "--top", "1",
                                     "--out", str(tmp_path / "set")])
    assert named.exit_code == 0, named.output
    document = json.loads(named.stdout)
    assert document["problem_set"] == "gemm-llm-small" and document["problems"] == 1 and document["kernels"] == 1
    assert read_table(tmp_path / "set").problem_set.tolist() == ["gemm-llm-small"]
    bad = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(problems), "--gpus", "0,x",
                                   "--out", str(tmp_path / "out")])
    assert bad.exit_code == 3 and "--gpus" in json.loads(bad.stdout)["error"]["message"]
    filtered = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(problems), "--dtype", "fp16",
                                        "--rule-set", "tiny", "--family", "tiled", "--match", "_w4_",
                                        "--out", str(tmp_path / "filtered")])  # tiny has w2 and tma-persistent ones
    assert filtered.exit_code == 0, filtered.output
    kernels = read_table(tmp_path / "filtered").kernel.tolist()  # gemm_<dtype>_<layout>_<family>_...
    assert kernels and all("_w4_" in k and k.split("_")[3] == "tiled" for k in kernels)


def test_a_problem_file_of_another_dtype_is_refused_naming_the_dtypes_it_holds(tmp_path):
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps([json.loads(canonical_json(p)) for p in gemm_problems()[:2]]))
    result = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(problems), "--dtype", "fp8e4m3",
                                      "--out", str(tmp_path / "out")])
    message = json.loads(result.stdout)["error"]["message"]
    assert result.exit_code == 3 and "no gemm problem of dtype fp8e4m3" in message
    assert "2 of dtype fp16, direction forward" in message
    assert not (tmp_path / "out").exists()


def test_a_running_cluster_takes_the_sweep_by_its_scheduler_address(tmp_path):
    pytest.importorskip("distributed")
    from tiledispatch.bench.distributed import local_cluster

    problem = gemm_problems()[0]
    cluster = local_cluster(["0", "1"])
    try:
        report = sweep("gemm", [problem], out=tmp_path, rule_set="tiny", arch=INTERP,
                       candidates=CandidatePolicy(top=2), kernels_per_task=1, scheduler=cluster.scheduler_address)
        again = sweep("gemm", [problem], out=tmp_path, rule_set="tiny", arch=INTERP,
                      candidates=CandidatePolicy(top=2), kernels_per_task=1, scheduler=cluster.scheduler_address)
    finally:
        cluster.close()
    assert report.rows == {"ok": 2} and report.gpus == 2 and again.kernels == 0 and again.skipped == 2
    frame = read_table(tmp_path)  # the rows one worker would write: each kernel with its rank
    assert sorted(zip(frame.rule_rank, frame.kernel, frame.status)) == [
        (rank, name, "ok") for rank, name in enumerate(ranked_names(problem, 2))]


def test_a_scheduler_that_cannot_take_tasks_is_named():
    distributed = pytest.importorskip("distributed")
    from tiledispatch.bench.distributed import cluster_gpus

    with pytest.raises(InvalidArgumentError, match="no Dask scheduler answers"):
        cluster_gpus("tcp://127.0.0.1:1", connect_s=1)
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as empty:
        with pytest.raises(InvalidArgumentError, match="has no workers"):
            cluster_gpus(empty.scheduler_address)


def test_a_task_that_kills_its_dask_workers_twice_is_a_fault(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    problem = gemm_problems()[1]
    names = ranked_names(problem, 2)
    monkeypatch.setenv(sweep_worker.INJECT_ENV, json.dumps({names[1]: "kill-worker"}))
    report = sweep("gemm", [problem], out=tmp_path, rule_set="tiny", arch=INTERP, candidates=CandidatePolicy(top=2),
                   kernels_per_task=1, gpus=[0, 1])
    frame = read_table(tmp_path)
    status = dict(zip(frame.kernel, frame.status))
    assert status == {names[0]: "ok", names[1]: "fault"} and report.rows == {"ok": 1, "fault": 1}
    assert report.gpus == 2
    assert "workers that ran this task died" in frame[frame.kernel == names[1]].error.iloc[0]


def test_on_several_gpus_a_budget_drops_the_tasks_still_running(tmp_path, monkeypatch):
    """A task that hangs would hold the sweep until its kernel's timeout; past the budget the sweep
    stops at once, the hung task dropped (no row: a rerun runs it), the rows it has kept. The closed
    cluster kills the Dask worker that waits on the hung kernel, and that worker's child goes too."""
    pytest.importorskip("distributed")
    problem = gemm_problems()[1]
    names = ranked_names(problem, 2)
    marker = f"sweep-budget-{uuid.uuid4().hex}"
    multiprocessing.resource_tracker.ensure_running()  # this process's own, started before the marker is set
    monkeypatch.setenv(sweep_worker.INJECT_ENV, json.dumps({names[0]: "hang"}))
    monkeypatch.setenv("TILEDISPATCH_TEST_MARKER", marker)  # the workers and their children inherit it
    start = time.perf_counter()
    report = sweep("gemm", [problem], out=tmp_path, rule_set="tiny", arch=INTERP, candidates=CandidatePolicy(top=2),
                   kernels_per_task=1, gpus=[0, 1], timeout_s=300, budget_s=10)
    assert time.perf_counter() - start < 300  # not held until the hung kernel's timeout
    frame = read_table(tmp_path)
    assert names[0] not in set(frame.kernel) and set(frame.status) <= {"ok"}
    assert report.tasks_left >= 1 and report.tasks_left + len(frame) == 2
    until = time.monotonic() + 20  # an orphan notices its parent's death within ORPHAN_POLL_S
    while _marked(marker.encode()) and time.monotonic() < until:
        time.sleep(0.5)
    assert not _marked(marker.encode())


def test_on_one_gpu_a_budget_drops_the_task_running_after_the_first(tmp_path, monkeypatch):
    """One GPU, no Dask: past the budget the task in flight is dropped too (its child killed), not
    waited for until its kernel's timeout; the first task always runs whole."""
    problem = gemm_problems()[1]
    names = ranked_names(problem, 2)
    monkeypatch.setenv(sweep_worker.INJECT_ENV, json.dumps({names[1]: "hang"}))
    start = time.perf_counter()
    report = sweep("gemm", [problem], out=tmp_path, rule_set="tiny", arch=INTERP, candidates=CandidatePolicy(top=2),
                   kernels_per_task=1, timeout_s=300, budget_s=1e-6)
    assert time.perf_counter() - start < 300  # not held until the hung kernel's timeout
    frame = read_table(tmp_path)
    assert dict(zip(frame.kernel, frame.status)) == {names[0]: "ok"}
    assert report.tasks_left == 1 and report.kernels == 1


def test_a_worker_restarted_after_a_task_killed_it_runs_the_next_task(tmp_path, monkeypatch):
    """One worker: the task that kills it twice is a FAULT, and the worker its Nanny restarts runs
    the next task (in a child process of its own: a restarted worker is allowed children too). The
    next task waits at the scheduler meanwhile: queued on the dying worker, it would die with it."""
    pytest.importorskip("distributed")
    from tiledispatch.bench.distributed import local_cluster

    problem = gemm_problems()[1]
    names = ranked_names(problem, 2)
    monkeypatch.setenv(sweep_worker.INJECT_ENV, json.dumps({names[0]: "kill-worker"}))
    cluster = local_cluster(["0"])
    try:
        sweep("gemm", [problem], out=tmp_path, rule_set="tiny", arch=INTERP, candidates=CandidatePolicy(top=2),
              kernels_per_task=1, scheduler=cluster.scheduler_address)
    finally:
        cluster.close()
    frame = read_table(tmp_path)
    assert dict(zip(frame.kernel, frame.status)) == {names[0]: "fault", names[1]: "ok"}, frame.error.tolist()


def test_prebuild_compiles_each_planned_kernel_once_per_specialization(monkeypatch):
    """The host's compile before the workers: one pool for every (kernel, specialisation) pair of
    the tasks, each pair once however many problems share it, the vendor (nothing to compile) left
    out."""
    from tiledispatch.bench import sweep as sweep_module
    from tiledispatch.bench.sweep_worker import Task
    from tiledispatch.core import kernel as kernel_module

    calls = []
    monkeypatch.setattr(kernel_module, "build_each", lambda work, cache, jobs, deadline=None: calls.append(
        ([(spec.name, sp) for spec, sp in work], jobs, deadline)) or [])
    sm90 = arch_facts.load("sm_90")
    problems = gemm_problems()
    dispatcher = Dispatcher(Registry.from_rule_sets([problems[0].op], "default", sm90), sm90)
    tasks = [Task(p, tuple(c.spec for c in dispatcher.ranked(p))) for p in problems]
    seconds, failed = sweep_module.prebuild(tasks, dispatcher, 5, deadline=1234.5)  # the budget's end
    assert failed == 0 and seconds >= 0
    assert len(calls) == 1 and calls[0][1:] == (5, 1234.5)
    pairs = calls[0][0]
    wanted = {(c.spec.name, (p.alignment,)) for p in problems for c in dispatcher.ranked(p)
              if kernel_module.compiles(c.spec, p.alignment)}
    assert len({p.alignment for p in problems}) > 1  # the pairs span several specialisations
    assert len(pairs) == len(set(pairs)) and set(pairs) == wanted and pairs


def test_the_policy_keeps_the_families_and_names_asked_for_and_the_vendor():
    """--family and --match: only those kernels are timed (the vendor beside them), each row keeping
    its rank in the whole ranking; an unknown family or a bad expression is refused, named."""
    sm90 = arch_facts.load("sm_90")
    problem = gemm_problems()[0]
    dispatcher = Dispatcher(Registry.from_rule_sets([problem.op], "default", sm90), sm90)
    ranked = [c.spec for c in dispatcher.ranked(problem)]
    rows = planned(dispatcher, problem, CandidatePolicy(families=("tiled",), match="_s3_"))
    timed = [r for r in rows if not r.vendor]
    assert timed and all(r.spec.config.family.value == "tiled" and "_s3_" in r.spec.name for r in timed)
    assert [r.spec.name for r in timed] == [s.name for s in ranked
                                            if s.config.family.value == "tiled" and "_s3_" in s.name]
    assert all(ranked[r.rule_rank].name == r.spec.name for r in rows)
    assert any(r.vendor for r in rows)
    top = planned(dispatcher, problem, CandidatePolicy(top=2, families=("tma-persistent",)))
    assert [r.spec.config.family.value for r in top if not r.vendor] == ["tma-persistent"] * 2
    with pytest.raises(InvalidArgumentError, match="not a regular expression"):
        CandidatePolicy(match="tiled(")
    with pytest.raises(InvalidArgumentError, match=r"tilde.*tiled, tma-persistent"):
        sweep("gemm", [problem], out=Path("/nonexistent/never-made"), arch=INTERP,
              candidates=CandidatePolicy(families=("tilde",)))


def test_a_budget_stops_the_sweep_cleanly_and_a_rerun_goes_on(tmp_path):
    """--budget-s: past it the sweep stops after the task that finished, says how many tasks it left,
    and a rerun into the same directory runs exactly those."""
    problems = gemm_problems()
    policy = CandidatePolicy(top=2)
    first = sweep("gemm", problems, out=tmp_path, rule_set="tiny", arch=INTERP, candidates=policy,
                  kernels_per_task=1, budget_s=1e-6)
    assert first.kernels == 1 and first.tasks_left == 3 and first.to_dict()["tasks_left"] == 3
    rest = sweep("gemm", problems, out=tmp_path, rule_set="tiny", arch=INTERP, candidates=policy, kernels_per_task=1)
    assert rest.skipped == 1 and rest.kernels == 3 and rest.tasks_left == 0
    assert len(read_table(tmp_path)) == 4
    with pytest.raises(InvalidArgumentError, match="budget_s"):
        sweep("gemm", problems, out=tmp_path, arch=INTERP, budget_s=0)


def test_a_tile_space_plans_its_own_configs_for_each_problem_beside_the_vendor():
    """--space: each problem's candidates are the space's configs for it (those `supports` takes)
    and the rule set's vendor kernel; an unknown space is refused with the op's spaces named."""
    from tiledispatch.bench.sweep import space_planner
    from tiledispatch.core.op import get_op
    from tiledispatch.ops.gemm import check_operands
    from tiledispatch.ops.gemm.spaces import gemv

    sm90 = arch_facts.load("sm_90")
    dispatcher = Dispatcher(Registry.from_rule_sets(["gemm"], "default", sm90), sm90)
    planner = space_planner(get_op("gemm"), "gemv", dispatcher)
    problem = check_operands(meta(1, 4096), meta(1024, 4096).t()).problem
    rows = planned(planner(problem), problem, CandidatePolicy())
    space = {c.name for c in gemv(problem, sm90)}
    ours = {r.spec.config.name for r in rows if not r.vendor}
    assert ours and ours <= space and len(space) > 20
    assert [r.spec.definition.family_of(r.spec.config) for r in rows if r.vendor] == ["vendor"]
    wide = check_operands(meta(64, 4096), meta(1024, 4096).t()).problem  # gemv's space is M = 1's alone
    assert all(r.vendor for r in planned(planner(wide), wide, CandidatePolicy()))
    with pytest.raises(InvalidArgumentError, match="split-k.*stream-k|decode, gemv"):
        space_planner(get_op("gemm"), "tiles", dispatcher)
    with pytest.raises(InvalidArgumentError, match="none"):
        space_planner(get_op("conv"), "gemv", dispatcher)


def test_cli_sweeps_a_tile_space(tmp_path):
    from tiledispatch.ops.gemm import check_operands

    problem = check_operands(meta(1, 512), meta(16, 512).t()).problem
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps([json.loads(canonical_json(problem))]))
    result = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(problems), "--dtype", "fp16",
                                      "--space", "gemv", "--match", "_1x4x256_w2_s1_", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    table = read_table(tmp_path / "out")
    interp = arch_facts.load(INTERP)
    vendors = [c.spec.name for c in Dispatcher(Registry.from_rule_sets(["gemm"], "default", interp), interp)
               .explain(problem).ranked if c.spec.is_vendor]  # none on the interpreter: its rule set has none
    assert set(table.status) == {"ok"}
    assert sorted(table.kernel) == sorted(["gemm_fp16_rcr_gemv_1x4x256_w2_s1_g1_k1_none_interp", *vendors])
    unknown = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(problems), "--dtype", "fp16",
                                       "--space", "tiles", "--out", str(tmp_path / "other")])
    assert unknown.exit_code == 3 and "space 'tiles'" in json.loads(unknown.stdout)["error"]["message"]


def test_the_sweep_records_the_commit_of_the_code_it_runs(tmp_path, monkeypatch):
    """A checkout's own HEAD; for a tree unpacked inside another repository (a `git archive` copy),
    not that repository's HEAD: None, or the commit its runner sets in TILEDISPATCH_COMMIT."""
    from tiledispatch.bench.sweep import COMMIT_ENV, source_commit

    monkeypatch.delenv(COMMIT_ENV, raising=False)
    repo = tmp_path / "repo"
    (repo / "package").mkdir(parents=True)
    (repo / "package" / "m.py").write_text("pass\n")

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    assert source_commit(repo / "package") == git("rev-parse", "HEAD")
    copy = repo / "copy" / "package"
    copy.mkdir(parents=True)
    assert source_commit(copy) is None
    monkeypatch.setenv(COMMIT_ENV, "0123abc")
    assert source_commit(copy) == "0123abc"


def test_a_stopped_sweeps_incomplete_problems_are_left_out_of_its_evaluation(tmp_path):
    """The plan file names every kernel planned for each problem: after a stop, the problem with part
    of its kernels timed is incomplete (its fastest row is not its oracle) and `evaluate` leaves it
    out; a rerun completes it."""
    from tiledispatch.bench import completeness

    problems = gemm_problems()
    policy = CandidatePolicy(top=2)
    sweep("gemm", problems, out=tmp_path, rule_set="tiny", arch=INTERP, candidates=policy, kernels_per_task=1,
          budget_s=1e-6)
    stopped = read_table(tmp_path)
    assert len(stopped) == 1 and completeness.incomplete(tmp_path, stopped) == set(stopped.problem_id)
    planned = completeness.read(tmp_path)
    assert sorted(planned) == sorted(problem_id(p) for p in problems) and all(len(k) == 2 for k in planned.values())
    document = json.loads(CliRunner().invoke(app, ["evaluate", str(tmp_path), "--strategies", "rules"]).stdout)
    assert document["incomplete_problems_left_out"] == 1 and document["problems"] == 0
    # Gathered into one file (what a lent machine returns), and that file resumed as a directory's part:
    # the plan travels in the file's metadata, and the incomplete problem stays out.
    gathered = tmp_path.parent / f"{tmp_path.name}-gathered.parquet"
    gather(tmp_path, gathered)
    assert completeness.read(gathered) == planned
    resumed = tmp_path.parent / f"{tmp_path.name}-resumed"
    resumed.mkdir()
    (resumed / "part-0.parquet").write_bytes(gathered.read_bytes())
    assert completeness.read(resumed) == planned
    from tiledispatch.cli.train import read_complete  # what train reads

    for table in (gathered, resumed):
        document = json.loads(CliRunner().invoke(app, ["evaluate", str(table), "--strategies", "rules"]).stdout)
        assert document["incomplete_problems_left_out"] == 1 and document["problems"] == 0, table
        frame, left_out = read_complete(table)
        assert frame.empty and left_out == set(stopped.problem_id)
    sweep("gemm", problems, out=tmp_path, rule_set="tiny", arch=INTERP, candidates=policy, kernels_per_task=1)
    assert completeness.incomplete(tmp_path, read_table(tmp_path)) == set()
    assert completeness.read(tmp_path) == planned  # a rerun plans the same kernels
    result = CliRunner().invoke(app, ["evaluate", str(tmp_path), "--strategies", "rules"])
    document = json.loads(result.stdout)
    assert document["incomplete_problems_left_out"] == 0 and document["problems"] == 2, result.output


def test_cli_gathers_the_table_into_one_file_that_resumes_as_a_directory(tmp_path):
    """--gather writes the whole table as one parquet file (what a lent machine returns and what is
    committed); copied into an empty directory as a part, a sweep there skips what it holds."""
    import shutil

    import pandas as pd

    problem = gemm_problems()[0]
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps([json.loads(canonical_json(problem))]))
    common = ["sweep", "--op", "gemm", "--problems", str(problems), "--dtype", "fp16", "--rule-set", "tiny"]
    first = CliRunner().invoke(app, [*common, "--top", "1", "--out", str(tmp_path / "out"),
                                     "--gather", str(tmp_path / "table.parquet")])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["gathered"] == {"file": str(tmp_path / "table.parquet"), "rows": 1}
    frame = read_table(tmp_path / "out")
    assert frame.equals(pd.read_parquet(tmp_path / "table.parquet"))
    (tmp_path / "again").mkdir()
    shutil.copy(tmp_path / "table.parquet", tmp_path / "again" / "part-0.parquet")
    again = CliRunner().invoke(app, [*common, "--top", "2", "--out", str(tmp_path / "again")])
    assert again.exit_code == 0, again.output
    document = json.loads(again.stdout)
    assert document["skipped"] == 1 and document["kernels"] == 1  # the second kernel alone is timed
    assert len(read_table(tmp_path / "again")) == 2
    # Copied back beside the parts it gathered (resuming where they still lie), it adds no row twice.
    shutil.copy(tmp_path / "table.parquet", tmp_path / "out" / "part-0.parquet")
    assert read_table(tmp_path / "out").equals(frame)
    assert gather(tmp_path / "out", tmp_path / "twice.parquet") == 1
    from tiledispatch.cli.train import read_table as results_table  # what train and evaluate read

    assert len(results_table(tmp_path / "out")) == 1
