"""A sweep worker isolated in a child process of its own: what runs a task there (`run_task`,
sweep_worker.py) cannot take its caller down.

The parent never touches the GPU: it sends the child a task, reads the kernel the child names
before each step and each outcome as the child has it, and when the child dies (an illegal
address, a device assert) or outlives the time limit it records the kernel in flight as a FAULT
or a TIMEOUT row and sends the rest of the batch to a fresh child.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
import traceback
from dataclasses import replace

from ..core.kernel import environment
from .sweep_worker import (
    BUILDING,
    ERROR_CHARS,
    PREPARE_S,
    PREPARING,
    STARTUP_S,
    DeviceInfo,
    Outcome,
    Task,
    TaskResult,
    error_text,
    run_task,
)
from .table import Status


class DeadlinePassed(Exception):
    """A sweep's deadline passed while a task ran: its child was killed and the task dropped (no
    outcome of it is kept, so a rerun runs it whole)."""


ORPHAN_POLL_S = 1.0


def _child_main(conn) -> None:
    """A worker process's start: it leads a process group of its own, so that killing the group
    also ends the compile processes it started (`IsolatedRunner._kill`), and it ends that group
    when its parent dies without closing it."""
    os.setpgid(0, 0)
    threading.Thread(target=_end_when_orphaned, args=(os.getppid(),), daemon=True).start()
    _child(conn)


def _end_when_orphaned(parent: int) -> None:
    """Kills this process's group once `parent` is gone. A Dask worker that is killed while its task
    waits on a hung kernel runs no exit handler, and its child would sleep on, holding the GPU, for
    as long as the kernel hangs."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os.killpg(0, signal.SIGKILL)


def _child(conn) -> None:
    """A worker process: says it is ready, then runs the tasks it is sent until it is sent None or
    its parent goes."""
    conn.send(("ready", None))  # after the imports: a task's time limit counts its work alone
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent is gone: nobody is left to report to
            return
        if task is None:
            return
        finished: dict[str, Outcome] = {}

        def report(outcome: Outcome) -> None:
            finished[outcome.kernel] = outcome
            conn.send(("finished", outcome))

        try:
            result = run_task(task, lambda name: conn.send(("started", name)), report)
        except Exception as e:  # the rest of the batch failed as a whole (its operands, its reference):
            # every kernel not yet finished says why, and those finished keep their outcomes
            detail = error_text(e) + "\n" + traceback.format_exc()[-ERROR_CHARS:]
            result = TaskResult(tuple(finished.get(s.name) or Outcome(s.name, Status.LAUNCH_FAILED, detail)
                                      for s in task.kernels), DeviceInfo())
        try:
            conn.send(("done", result))
        except OSError:  # the parent went while the task ran
            return


class IsolatedRunner:
    """Runs tasks in a child process of its own (pinned by `env`), restarting it after a fault or a
    timeout: no kernel can take the caller down. `timeout_s` bounds each step: the batch's build, and
    each kernel's check and timing (making a problem's operands and reference has PREPARE_S)."""

    def __init__(self, env: dict[str, str] | None = None, timeout_s: float = 300.0) -> None:
        self.env, self.timeout_s = dict(env or {}), timeout_s
        self._process = self._conn = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        with environment(**self.env):
            self._process = context.Process(target=_child_main, args=(child,), daemon=False)
            self._process.start()
        child.close()
        self._conn = parent
        limit = max(STARTUP_S, self.timeout_s)
        try:
            if not parent.poll(limit):
                raise TimeoutError(f"no word from it in {limit} s")
            parent.recv()
        except (EOFError, OSError) as e:  # the environment cannot run a worker: no kernel can be swept here
            self._kill()
            raise RuntimeError(f"a sweep worker process failed to start ({type(e).__name__}: {e})") from e

    def close(self, wait_s: float = 5.0) -> None:
        """Stops the child: asked to exit, and killed with its process group if it has not within
        `wait_s` (0: at once, as a sweep that is stopped mid-task does)."""
        if self._process is not None:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(None)
            self._process.join(wait_s)
            self._kill()

    def _kill(self) -> None:
        """Kills the child and every process of its group (a batch's compile processes)."""
        if self._process is not None:
            with contextlib.suppress(OSError):  # the group is gone, or the child had not formed it yet
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.kill()
            self._process.join()
            self._conn.close()
            self._process = self._conn = None

    def run(self, task: Task, deadline: float | None = None) -> TaskResult:
        """Every kernel of `task` with an outcome: a kernel that killed the child is a FAULT, one
        that outlived the limit a TIMEOUT, and the rest of the batch runs in a fresh child.
        DeadlinePassed where `deadline` (a `time.perf_counter()` time) passes first."""
        done: dict[str, Outcome] = {}
        device, build_s, run_s = DeviceInfo(), 0.0, 0.0
        pending = task.kernels
        while pending:
            if self._process is None:
                self._start()
            result, in_flight, status = self._attempt(replace(task, kernels=pending), done, deadline)
            if result is not None:
                device, build_s, run_s = result.device, build_s + result.build_s, run_s + result.run_s
                done.update({o.kernel: o for o in result.outcomes})
            else:
                what = "timed out" if status is Status.TIMEOUT else "died"
                batch = in_flight in (BUILDING, PREPARING)
                stuck = [s.name for s in pending if s.name not in done] if batch else [in_flight]
                doing = {BUILDING: "building the batch", PREPARING: "making the problem's operands and reference"}
                for name in stuck:
                    if name is not None and name not in done:  # a fault the child reported itself keeps its error
                        done[name] = Outcome(name, status, f"the worker {what} "
                                             f"{doing.get(in_flight, 'while running this kernel')}")
            left = tuple(s for s in pending if s.name not in done)
            if left == pending:  # nothing learnt (the child went before its first report): give up on them
                for s in left:
                    done[s.name] = Outcome(s.name, status, f"the worker {what} before running the batch")
                left = ()
            pending = left
        return TaskResult(tuple(done[s.name] for s in task.kernels), device, build_s, run_s)

    def _attempt(self, task: Task, done: dict[str, Outcome],
                 deadline: float | None) -> tuple[TaskResult | None, str | None, Status]:
        in_flight = None
        try:
            self._conn.send(task)
            while True:
                limit = max(self.timeout_s, PREPARE_S) if in_flight == PREPARING else self.timeout_s
                wait = limit if deadline is None else min(limit, max(0.0, deadline - time.perf_counter()))
                if not self._conn.poll(wait):
                    self._kill()
                    if wait < limit:  # the deadline, not the step's limit, ended the wait
                        raise DeadlinePassed(f"the deadline passed with {in_flight or 'the batch'} in flight")
                    return None, in_flight, Status.TIMEOUT
                kind, value = self._conn.recv()
                if kind == "started":
                    in_flight = value
                elif kind == "finished":
                    done[value.kernel] = value
                else:
                    return value, None, Status.OK
        except (EOFError, OSError, BrokenPipeError):
            self._kill()
            return None, in_flight, Status.FAULT
