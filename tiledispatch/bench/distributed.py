"""A sweep over many GPUs and hosts, through Dask distributed.

One Dask worker process per GPU, pinned by CUDA_VISIBLE_DEVICES, one thread each. A task is a
(problem, kernel batch); the Dask worker hands it to a child process of its own
(`sweep_runner.IsolatedRunner`), so a kernel that faults or hangs kills that child, not the
worker: the kernel becomes a FAULT or TIMEOUT row and the batch goes on. Should a worker die all
the same (the host lost, out of memory), the scheduler runs its tasks elsewhere; a task that took
down workers `ALLOWED_FAILURES` + 1 times is recorded as FAULT rather than retried for ever. Tasks
are idempotent: a worker returns outcomes, and the client alone writes rows.

On one host, `run_tasks(gpus=[0, 1, ...])` starts a local cluster. Across hosts, start a scheduler
with `SCHEDULER_ENV` (`dask scheduler`), then on each host one worker per GPU (`tiledispatch
sweep-worker tcp://host:8786 --gpus 0,1,2,3`), and sweep with `--scheduler tcp://host:8786`.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from typing import Iterator, Sequence

from ..core.errors import InvalidArgumentError
from .sweep_runner import IsolatedRunner
from .sweep_worker import DeviceInfo, Inject, Outcome, Task, TaskResult, injected, smi_query
from .table import Status

ALLOWED_FAILURES = 1  # a task that kills its worker twice is a fault, not retried again
# A Dask worker process must be allowed children: each runs its tasks in one (and that child
# compiles in a process pool of its own).
WORKER_ENV = {"DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
# The scheduler's settings (a worker ignores them): how many workers a task may kill, and one task
# at a time sent to a worker's one thread. Dask's default saturation sends a second, so a worker
# that dies takes a queued task down with the one that killed it, and that task counts a failure.
SCHEDULER_CONFIG = {"distributed.scheduler.allowed-failures": ALLOWED_FAILURES,
                    "distributed.scheduler.worker-saturation": 1.0}
SCHEDULER_ENV = {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(ALLOWED_FAILURES),
                 "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0"}

_RUNNER: IsolatedRunner | None = None  # this Dask worker process's child, made by its first task


def _require():
    try:
        import distributed
    except ImportError:
        raise ImportError("a sweep over several GPUs or a --scheduler needs Dask distributed: "
                          "pip install 'tiledispatch[distributed]' (or run on one GPU, without Dask)") from None
    return distributed


def run_in_worker(task: Task, timeout_s: float) -> TaskResult:
    """A Dask task: `task` in this worker's child process (started once, restarted after a fault)."""
    global _RUNNER
    actions = injected(task.kernels)
    if any(actions.get(spec.name) is Inject.KILL_WORKER for spec in task.kernels):  # the test hook, on the worker
        os._exit(5)
    if _RUNNER is None or _RUNNER.timeout_s != timeout_s:
        if _RUNNER is None:  # at the worker's exit, before multiprocessing joins its children
            atexit.register(_close_runner)
        _close_runner()
        _RUNNER = IsolatedRunner({}, timeout_s)
    return _RUNNER.run(task)


def _close_runner() -> None:
    if _RUNNER is not None:
        _RUNNER.close()


def worker_gpu() -> str:
    """The GPU a worker is pinned to, by name as its rows record it ("" without one)."""
    index = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return (smi_query(index, "name") or [""])[0] if index else ""


def cluster_gpus(scheduler: str, connect_s: float = 30.0) -> list[str]:
    """The GPU name of each worker of a running cluster, for resuming and the report's rates."""
    distributed = _require()
    try:
        with distributed.Client(scheduler, timeout=connect_s) as client:
            names = list(client.run(worker_gpu).values())
    except (OSError, ValueError) as e:  # unreachable (a TimeoutError is an OSError), or not an address
        raise InvalidArgumentError(f"scheduler={scheduler!r}: no Dask scheduler answers there in {connect_s:g} s "
                                   f"({type(e).__name__}: {e}); give its tcp://host:port, started with "
                                   "`dask scheduler`") from None
    if not names:  # tasks sent there would wait for ever
        raise InvalidArgumentError(f"scheduler={scheduler!r} has no workers: start them on each GPU host with "
                                   f"`tiledispatch sweep-worker {scheduler} --gpus 0,1,...`")
    return names


def local_cluster(gpus: Sequence[str]):
    """A cluster on this host: one worker process per GPU, pinned to it, one thread each."""
    distributed = _require()
    import dask

    workers = {f"gpu{gpu}": {"cls": distributed.Nanny,
                             "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(gpu), **WORKER_ENV},
                                         "dashboard_address": None, "silence_logs": 40}}
               for gpu in gpus}
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": None}}
    # Set for this process, not for the call: a Nanny reads it each time it starts its worker, and it
    # restarts one that a task killed long after this returns (a daemonic worker could run no task).
    dask.config.set({"distributed.worker.daemon": False})
    with dask.config.set(SCHEDULER_CONFIG):
        return distributed.SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40)


def _lost(task: Task, error: BaseException) -> TaskResult:
    message = f"the workers that ran this task died each time ({type(error).__name__}: {error})"[:2000]
    return TaskResult(tuple(Outcome(s.name, Status.FAULT, message) for s in task.kernels), DeviceInfo())


def run_tasks(tasks: list[Task], *, gpus: Sequence[str] | None, scheduler: str | None,
              timeout_s: float, deadline: float | None = None) -> Iterator[tuple[Task, TaskResult]]:
    """(task, result) as each finishes, on a local cluster of `gpus` or the cluster at `scheduler`,
    until `deadline` (a `time.perf_counter()` time) passes: then the tasks still running are dropped
    at once, not waited for (a task of slow kernels can run for minutes past a lent machine's end)."""
    distributed = _require()
    cluster = None if scheduler is not None else local_cluster(gpus or ["0"])
    try:
        with distributed.Client(scheduler if scheduler is not None else cluster) as client:
            futures = {client.submit(run_in_worker, task, timeout_s, pure=False): task for task in tasks}
            left = None if deadline is None else max(0.0, deadline - time.perf_counter())
            try:
                for future in distributed.as_completed(futures, timeout=left):
                    task = futures[future]
                    try:
                        yield task, future.result()
                    except distributed.KilledWorker as e:
                        yield task, _lost(task, e)
            except distributed.TimeoutError:  # the deadline: the client cancels what is left as it closes
                return
    finally:
        if cluster is not None:
            cluster.close()


def start_workers(scheduler: str, gpus: Sequence[str], name: str | None = None) -> int:
    """Runs one `dask worker` per GPU of this host against `scheduler`, pinned and allowed
    children; returns when they all exit (the first nonzero exit status, else 0)."""
    _require()
    procs = []
    try:
        for gpu in gpus:
            env = {**os.environ, **WORKER_ENV, "CUDA_VISIBLE_DEVICES": str(gpu)}
            command = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--nthreads", "1",
                       "--nworkers", "1", "--name", f"{name or os.uname().nodename}-gpu{gpu}"]
            procs.append(subprocess.Popen(command, env=env))
        codes = [p.wait() for p in procs]
    finally:  # stopped (Ctrl-C, SIGTERM through `terminating`): the workers stop too, none left serving
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return next((c for c in codes if c), 0)
