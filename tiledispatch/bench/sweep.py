"""The sweep engine: time the candidates of a rule set on every problem of a set, into one table.

For each problem the rule set's registry gives the candidates (refusals skipped, or recorded as
UNSUPPORTED rows), a `CandidatePolicy` picks those to time (all, or the rules' top N plus a
seeded sample of the rest: training data needs bad kernels too), and the vendor kernel is always
among them. The (problem, kernel batch) tasks run in worker processes (`sweep_runner`,
`sweep_worker`): on one GPU in one child process, on several or on many hosts through Dask
(`distributed`). Each finished task is one parquet part file in the output directory, so a
killed sweep loses one task at most, and a sweep run again skips every (problem, kernel, GPU) the
directory holds already. One sweep at a time writes a directory (a lock file); SIGTERM stops a
sweep as Ctrl-C does, its workers with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fcntl
import os
import signal
import socket
import threading
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..core.errors import InvalidArgumentError
from ..core.op import OpKind, RuleSet, get_op
from . import completeness
from .candidates import CandidatePolicy, Planned, check_families, planned
from .sweep_runner import DeadlinePassed, IsolatedRunner
from .sweep_worker import DeviceInfo, Outcome, Task, TaskResult, smi_query
from .table import COLUMNS, Status, canonical_json, distinct_rows, problem_id, selection_key, write_file

PART_GLOB = "part-*.parquet"
STAGING_GLOB = ".part-*.parquet.tmp"  # a part being written: a sweep stopped mid-write leaves one
LOCK_NAME = ".sweep.lock"


# A task's kernels. Each worker a problem's tasks reach makes its operands and reference again, and
# each task is a part file: on the 4-H200 host, 40 kernels a task ran 3.1x one GPU's throughput
# where 16 ran 2.35x (benchmarks/results/h200/README.md), and a GEMM has about 80 candidates.
KERNELS_PER_TASK = 64


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did. Rates are kernels timed per second per GPU: over the workers' time with
    their compiles, and over their checking and timing alone."""

    out: Path
    problems: int
    kernels: int  # (problem, kernel) pairs this sweep ran
    skipped: int  # pairs the output held already
    rows: Mapping[str, int]  # rows this sweep wrote, by status
    wall_s: float
    build_s: float  # the workers' compile time, summed
    run_s: float  # their check-and-time time, summed
    gpus: int
    without_candidates: int = 0  # problems no kernel of the rule set accepts (none of their rows exist)
    prebuild_s: float = 0.0  # the host's compile of every planned kernel before the workers started
    prebuild_failed: int = 0  # kernels that failed it (their workers record them as build_failed)
    tasks_left: int = 0  # tasks the time budget left unrun (a rerun into the same directory runs them)

    @property
    def per_s_per_gpu(self) -> float | None:
        return self.kernels / (self.build_s + self.run_s) if self.build_s + self.run_s > 0 else None

    @property
    def per_s_per_gpu_without_compile(self) -> float | None:
        return self.kernels / self.run_s if self.run_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "problems": self.problems, "kernels": self.kernels, "skipped": self.skipped,
                "rows": dict(self.rows), "wall_s": round(self.wall_s, 3), "build_s": round(self.build_s, 3),
                "run_s": round(self.run_s, 3), "gpus": self.gpus,
                "without_candidates": self.without_candidates,
                "prebuild_s": round(self.prebuild_s, 3), "prebuild_failed": self.prebuild_failed,
                "tasks_left": self.tasks_left,
                "kernels_per_s_per_gpu": self.per_s_per_gpu,
                "kernels_per_s_per_gpu_without_compile": self.per_s_per_gpu_without_compile,
                "kernels_per_s_wall": self.kernels / self.wall_s if self.wall_s > 0 else None}


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or SIGTERM, its workers closed; `report` says what it wrote first."""

    def __init__(self, report: SweepReport) -> None:
        super().__init__(f"the sweep into {report.out} stopped after {report.kernels} kernels")
        self.report = report


@contextlib.contextmanager
def terminating():
    """SIGTERM raises KeyboardInterrupt in the main thread while inside, so that a sweep stopped by a
    time limit closes its worker processes and its Dask cluster as Ctrl-C does (elsewhere: nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def locked(out: Path):
    """Holds `out`'s lock file while inside: a second sweep into the same directory would time the
    same kernels again, as neither sees the other's rows when it starts. The lock goes with its
    process, so a killed sweep leaves none behind; its half-written parts are removed here."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK_NAME, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidArgumentError(f"out={str(out)!r}: another sweep is writing this directory; wait for it "
                                       "to finish, or give another --out") from None
        for staging in out.glob(STAGING_GLOB):
            staging.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- the table on disk ---------------------------------------------------------------------------

def schema():
    """The parquet schema of every part file: one type per column, whatever a part's values."""
    import pyarrow as pa

    floats = {"time_ms", "tflops", "gbps", "flops", "rule_score", "sm_clock_mhz", "mem_clock_mhz"}
    types = {"vendor": pa.bool_(), "bytes": pa.int64(), "rule_rank": pa.int64()}
    return pa.schema([(c, types.get(c, pa.float64() if c in floats else pa.string())) for c in COLUMNS])


def _read_part(part: Path, columns: Sequence[str] | None = None):
    """One part file as an arrow table; a damaged one is an error that names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(part, columns=columns, schema=schema())
    except (pa.ArrowException, OSError) as e:
        raise InvalidArgumentError(f"{part}: not a readable sweep part ({type(e).__name__}: {e}); move it away "
                                   "(a sweep run again times its kernels anew)") from None


def read_table(out: str | Path):
    """Every part file under `out` as one pandas DataFrame of `bench.table.COLUMNS` (empty if none),
    each row once (`table.distinct_rows`)."""
    import pyarrow as pa

    tables = [_read_part(p) for p in sorted(Path(out).glob(PART_GLOB))]
    return distinct_rows((pa.concat_tables(tables) if tables else schema().empty_table()).to_pandas())


def gather(out: str | Path, path: str | Path) -> int:
    """Every part under `out` as one parquet file at `path` with the sweep's plan in its metadata,
    written under a temporary name and renamed; its row count. A sweep writes a part per task, too
    many files to carry or commit; the gathered file resumes as a directory again, copied into an
    empty one as a part."""
    import pyarrow as pa

    table = pa.Table.from_pandas(read_table(out), schema=schema(), preserve_index=False)
    planned = completeness.read(out)  # which problems are complete travels with the file
    return write_file(table if planned is None else completeness.attached(table, planned), path)


def write_part(out: Path, rows: list[dict[str, Any]]) -> Path | None:
    """`rows` as one new part file, written under a temporary name and renamed: a reader never
    sees half a part."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        return None
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([{c: row.get(c) for c in COLUMNS} for row in rows], schema=schema())
    name = f"part-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}.parquet"
    staging = out / f".{name}.tmp"
    with open(staging, "wb") as handle:
        pq.write_table(table, handle)
        handle.flush()
        os.fsync(handle.fileno())  # on disk before it has its name: a crash leaves no empty part
    staging.rename(out / name)
    return out / name


def done_keys(out: Path) -> set[tuple[str, str, str]]:
    """(problem_id, kernel, gpu) of every row already written ("" for the interpreter's gpu)."""
    keys = set()
    for part in Path(out).glob(PART_GLOB):
        table = _read_part(part, ["problem_id", "kernel", "gpu"])
        for pid, kernel, gpu in zip(*(table.column(c).to_pylist() for c in ("problem_id", "kernel", "gpu"))):
            keys.add((pid, kernel, gpu or ""))
    return keys


# -- what to run ---------------------------------------------------------------------------------

COMMIT_ENV = "TILEDISPATCH_COMMIT"


def _versions() -> dict[str, str | None]:
    from ..core.runtime import installed_version

    return {"torch": installed_version("torch"), "triton": installed_version("triton"), "commit": source_commit()}


def source_commit(package: Path = Path(__file__).resolve().parents[1]) -> str | None:
    """The commit of the code a sweep runs: $TILEDISPATCH_COMMIT where set, else the HEAD of the git
    checkout whose top level holds `package`; None where it has none. A tree unpacked inside another
    repository (a `git archive` copy) would otherwise report that repository's HEAD, which is not
    the code that ran: such a copy reads None, or the commit its runner sets."""
    if given := os.environ.get(COMMIT_ENV):
        return given
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                  cwd=package).stdout.strip()
        top = git("rev-parse", "--show-toplevel")
        if not top or Path(top).resolve() != package.parent:
            return None
        return git("rev-parse", "HEAD") or None
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass
class _Rows:
    """Makes the table's rows of a problem's planned kernels and their outcomes."""

    problem_set: str
    arch: str
    gpu: str | None = None  # the sweep's one GPU model, for rows of a worker that died before it said
    versions: dict[str, str | None] = field(default_factory=_versions)

    def row(self, problem, plan: Planned, outcome: Outcome, device: DeviceInfo) -> dict[str, Any]:
        key = selection_key(problem, self.arch)
        definition = plan.spec.definition
        flops, nbytes, ms = float(problem.flops()), int(problem.bytes()), outcome.time_ms
        return {
            "op": key.op, "direction": key.direction, "dtype": key.dtype, "arch": self.arch,
            "problem_set": self.problem_set, "problem_id": problem_id(problem), "problem": canonical_json(problem),
            "kernel": plan.spec.name, "family": definition.family_of(plan.spec.config), "vendor": plan.vendor,
            "config": canonical_json(plan.spec.config), "status": outcome.status.value, "error": outcome.error,
            "time_ms": ms, "tflops": flops / ms / 1e9 if ms else None, "gbps": nbytes / ms / 1e6 if ms else None,
            "flops": flops, "bytes": nbytes, "rule_score": plan.rule_score, "rule_rank": plan.rule_rank,
            "gpu": device.gpu or self.gpu, "sm_clock_mhz": device.sm_clock_mhz, "mem_clock_mhz": device.mem_clock_mhz,
            **self.versions, "host": device.host or socket.gethostname(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }


# -- running -------------------------------------------------------------------------------------

def _local_gpu_names(gpus: Sequence[str] | None, on_gpu: bool) -> list[str]:
    """The name of each GPU a local sweep runs on, as its workers record them ("" off the GPU):
    those of `gpus`, else of the first visible device."""
    indices = gpus or [(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0")]
    return [(smi_query(str(index), "name") or [""])[0] if on_gpu else "" for index in indices]


def _run_local(tasks: list[Task], gpu: str | None, timeout_s: float,
               deadline: float | None = None) -> Iterator[tuple[Task, TaskResult]]:
    """The tasks in one child process, until `deadline` passes: the task then running is dropped,
    but the first always runs whole, so that a sweep whose prebuild spent its budget still goes on."""
    runner = IsolatedRunner({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}, timeout_s)
    finished = False
    try:
        for i, task in enumerate(tasks):
            try:
                result = runner.run(task, None if i == 0 else deadline)
            except DeadlinePassed:
                break
            yield task, result
        finished = True
    finally:  # stopped mid-task: the child is killed at once rather than waited for
        runner.close(5.0 if finished else 0.0)


def _unique(problems: Iterable[Any], kind: OpKind) -> list[Any]:
    """`problems`, each once (a problem given twice is swept once), checked to be `kind`'s before
    any row is written."""
    unique = {}
    for i, problem in enumerate(problems):
        op = getattr(problem, "op", None)
        if op is not kind:
            what = f"a {op.value} problem" if isinstance(op, OpKind) else f"a {type(problem).__name__}"
            raise InvalidArgumentError(f"problems[{i}] is {what}, not a {kind.value} problem "
                                       "(a sweep takes one op's problems)")
        unique.setdefault(problem_id(problem), problem)
    return list(unique.values())


def _check_arguments(kernels_per_task, timeout_s, jobs, prebuild_jobs, gpus, scheduler,
                     budget_s=None) -> list[str] | None:
    """The arguments `sweep` checks before it starts anything; `gpus` as strings (None: none given)."""
    for name, value, least in (("kernels_per_task", kernels_per_task, 1), ("jobs", jobs, 1),
                               ("prebuild_jobs", prebuild_jobs, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidArgumentError(f"{name}={value!r} must be an integer >= {least}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        raise InvalidArgumentError(f"timeout_s={timeout_s!r} must be a positive number of seconds, e.g. 300")
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))
                                 or not 0 < budget_s < float("inf")):
        raise InvalidArgumentError(f"budget_s={budget_s!r} must be a positive number of seconds, or None for no limit")
    if not gpus:
        return None
    if scheduler is not None:
        raise InvalidArgumentError(f"gpus={list(gpus)!r} and scheduler={scheduler!r}: give one (a running "
                                   "cluster's workers are pinned to their GPUs already)")
    names = [str(g).strip() for g in gpus]
    if not all(n.isdigit() for n in names) or len(set(names)) != len(names):
        raise InvalidArgumentError(f"gpus={list(gpus)!r} must be distinct GPU indices, e.g. [0, 1, 2, 3]")
    return names


def sweep(op: OpKind | str, problems: Iterable[Any], *, out: str | Path, rule_set: RuleSet | str = RuleSet.DEFAULT,
          arch: Any = None, candidates: CandidatePolicy = CandidatePolicy(), timeout_s: float = 300.0,
          gpus: Sequence[int | str] | None = None, scheduler: str | None = None,
          kernels_per_task: int = KERNELS_PER_TASK, jobs: int = 1, problem_set_name: str = "custom", seed: int = 0,
          prebuild_jobs: int = 0, budget_s: float | None = None, space: str | None = None,
          progress: Callable[[int, int], None] | None = None) -> SweepReport:
    """Times `candidates` of `rule_set` for `op` on every problem; rows appended under `out`.

    `space` names one of the op's tile spaces (`OpDefinition.spaces`): each problem's candidates
    are then that space's configs for it, and the rule set's vendor kernel beside them.

    `gpus` (indices) run one worker process each, through a local Dask cluster when there are
    several; `scheduler` (tcp://host:port) sends the tasks to a running Dask cluster instead (its
    workers started with `tiledispatch sweep-worker`). Neither: one worker on this machine's device
    (the interpreter without a GPU). `progress(done, total)` is called as tasks finish.
    `prebuild_jobs` compiles every planned kernel first, that many processes at once on this host
    (`prebuild`): the workers then find them in the cache rather than each compiling the kernels
    its problems share with the other workers' at the same time.
    `budget_s` (seconds from the start, the prebuild included) stops the sweep cleanly past it: the
    prebuild's queued compiles are dropped, and the tasks stop at once (on one GPU, the first task
    always runs whole); the workers are closed, tasks still running are dropped, and the report's
    `tasks_left` counts what a rerun would do (a time-limited machine, where a stop by signal waits
    on the work in flight). Another sweep writing `out` is an error; Ctrl-C or SIGTERM closes the
    workers and raises `SweepInterrupted`, whose report says what was written.
    """
    from .. import arch as arch_facts
    from ..core.dispatcher import Dispatcher, Strategy
    from ..core.registry import Registry
    from ..core.runtime import current_arch

    start = time.perf_counter()
    kind, out = get_op(op).kind, Path(out)
    facts = current_arch() if arch is None else arch if not isinstance(arch, str) else arch_facts.load(arch)
    gpus = _check_arguments(kernels_per_task, timeout_s, jobs, prebuild_jobs, gpus, scheduler, budget_s)
    check_families(kind.value, candidates.families)
    dispatcher = Dispatcher(Registry.from_rule_sets([kind], rule_set, facts), facts, strategy=Strategy.RULES,
                            rank_buckets=False)
    planner = space_planner(get_op(op), space, dispatcher) if space is not None else lambda problem: dispatcher
    problems = _unique(problems, kind)
    if scheduler is not None:
        from .distributed import cluster_gpus

        workers = cluster_gpus(scheduler)
    else:
        workers = _local_gpu_names(gpus, not facts.is_interpreter)
    names = set(workers)
    maker = _Rows(problem_set_name, facts.name, next(iter(names)) or None if len(names) == 1 else None)
    with terminating(), locked(out):
        tasks, plans, statuses, (skipped, empty) = _tasks(
            kind, problems, planner, candidates, done_keys(out), names, out, maker, (kernels_per_task, jobs, seed))
        planned_names: dict[str, list[str]] = {}
        for pid, name in plans:
            planned_names.setdefault(pid, []).append(name)
        completeness.record(out, planned_names)
        deadline = None if budget_s is None else start + budget_s
        built = (prebuild(tasks, dispatcher, prebuild_jobs, deadline) if prebuild_jobs and not facts.is_interpreter
                 else None)
        counts = (statuses, skipped, len(problems), start, empty, len(workers))
        report = _execute(tasks, plans, out, maker, gpus, scheduler, timeout_s, counts, progress, deadline)
    if built is None:
        return report
    return dataclasses.replace(report, prebuild_s=built[0], prebuild_failed=built[1])


def prebuild(tasks: Sequence[Task], dispatcher, jobs: int, deadline: float | None = None) -> tuple[float, int]:
    """Compiles every compiled kernel of `tasks` for its problem's specialisation into the
    dispatcher's cache, `jobs` processes at once, until `deadline` (`kernel.build_each`); (seconds,
    kernels that failed)."""
    from ..core.kernel import build_each, compiles

    start = time.perf_counter()
    work: dict[tuple, tuple] = {}  # (specialisation, kernel name) -> (spec, (specialisation,))
    for task in tasks:
        specialization = task.kernels[0].definition.specialization_of(task.problem) if task.kernels else None
        for spec in task.kernels:
            if compiles(spec, specialization):
                work[specialization, spec.name] = (spec, (specialization,))
    failed = sum(not r.ok for r in build_each(work.values(), dispatcher.cache, jobs, deadline=deadline))
    return time.perf_counter() - start, failed


def space_planner(definition, space: str, dispatcher) -> Callable[[Any], Any]:
    """problem -> a dispatcher over `space`'s configs for it and `dispatcher`'s vendor kernels for it."""
    from ..core.dispatcher import Dispatcher, Strategy
    from ..core.registry import Registry

    if space not in definition.spaces:
        known = ", ".join(sorted(definition.spaces)) or "none"
        raise InvalidArgumentError(f"space {space!r}: {definition.kind.value} has no such tile space (its spaces: "
                                   f"{known})")
    generate = definition.spaces[space]

    def for_problem(problem):
        registry = Registry.from_configs(definition.kind, generate(problem, dispatcher.arch), dispatcher.arch,
                                         source=f"space {space!r}")
        for candidate in dispatcher.ranked(problem):  # the accepted ones: no refusal spelt out
            if candidate.spec.is_vendor:
                registry.add(candidate.spec)
        return Dispatcher(registry, dispatcher.arch, strategy=Strategy.RULES, cache=dispatcher.cache,
                          rank_buckets=False)
    return for_problem


def _tasks(kind, problems, planner, candidates, done, names, out, maker, sizes):
    """(tasks, planned rows by (problem id, kernel), rows written by status, (rows skipped, problems
    without candidates)): the refusals' rows are written at once, as nothing runs for them.
    `planner(problem)` is the dispatcher whose candidates a problem gets."""
    kernels_per_task, jobs, seed = sizes
    tasks, plans, skipped, refusals, empty = [], {}, 0, 0, 0
    for problem in problems:
        pid, rows = problem_id(problem), planned(planner(problem), problem, candidates)
        empty += not any(p.refused is None for p in rows)
        todo = [p for p in rows if not any((pid, p.spec.name, n) in done for n in names)]
        skipped += len(rows) - len(todo)
        plans.update({(pid, p.spec.name): p for p in todo})
        to_run = [p.spec for p in todo if p.refused is None]
        for i in range(0, len(to_run), kernels_per_task):
            tasks.append(Task(problem, tuple(to_run[i:i + kernels_per_task]), jobs, seed))
        refused = [p for p in todo if p.refused is not None]
        refusals += len(refused)
        write_part(out, [maker.row(problem, p, Outcome(p.spec.name, Status.UNSUPPORTED, p.refused), DeviceInfo())
                         for p in refused])
    return tasks, plans, Counter({Status.UNSUPPORTED.value: refusals} if refusals else {}), (skipped, empty)


def _execute(tasks, plans, out, maker: _Rows, gpus, scheduler, timeout_s, counts, progress,
             deadline: float | None = None) -> SweepReport:
    """Runs the tasks where they go and writes a part per finished task, until `deadline` passes;
    the report (in a `SweepInterrupted` when the sweep is stopped, after its workers are closed)."""
    statuses, skipped, problems, start, empty, workers = counts
    build_s = run_s = 0.0
    kernels = finished = 0

    def report() -> SweepReport:
        return SweepReport(out, problems, kernels, skipped, dict(statuses), time.perf_counter() - start, build_s,
                           run_s, max(1, workers), empty, tasks_left=len(tasks) - finished)

    if scheduler is not None or (gpus and len(gpus) > 1):
        from .distributed import run_tasks

        results = run_tasks(tasks, gpus=gpus, scheduler=scheduler, timeout_s=timeout_s, deadline=deadline)
    else:
        results = _run_local(tasks, gpus[0] if gpus else None, timeout_s, deadline)
    try:
        with contextlib.closing(results):  # its workers closed here, however the loop ends
            for finished, (task, result) in enumerate(results, 1):
                pid = problem_id(task.problem)
                rows = [maker.row(task.problem, plans[(pid, o.kernel)], o, result.device) for o in result.outcomes]
                write_part(out, rows)
                statuses.update(r["status"] for r in rows)
                build_s, run_s, kernels = build_s + result.build_s, run_s + result.run_s, kernels + len(rows)
                if progress is not None:
                    progress(finished, len(tasks))
                if deadline is not None and time.perf_counter() > deadline:
                    break
    except KeyboardInterrupt:
        raise SweepInterrupted(report()) from None
    return report()
