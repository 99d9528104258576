"""What a sweep runs in a worker process: build a batch of kernels, check each against its op's
reference, time it.

One child process per GPU (`IsolatedRunner`) does the work, pinned by its parent with
CUDA_VISIBLE_DEVICES; the parent never touches the GPU. The child reports each kernel before it
runs it and each outcome as it has it, so when it dies (an illegal address, a device assert) or
outlives the time limit, the parent knows the kernel in flight: that kernel is a FAULT or a
TIMEOUT row, and the rest of the batch goes to a fresh child. On the CPU the "GPU" is Triton's
interpreter: the same path, one wall-clock run per kernel.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import json
import math
import multiprocessing
import os
import signal
import socket
import subprocess
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..core.kernel import environment
from ..core.spec import KernelSpec
from .table import Status

# Test hook: {"<kernel name>": "exit" | "hang" | "kill-worker"} (`Inject`), read by `injected`.
INJECT_ENV = "TILEDISPATCH_SWEEP_INJECT"
BUILDING = "<build>"  # the in-flight marker of a batch's parallel build
PREPARING = "<prepare>"  # ... of making its problem's operands and float64 reference
PREPARE_S = 3600.0  # the limit of PREPARING: a long problem's CPU reference takes minutes, and never hangs
SAMPLE_MS = 20.0  # each timing sample replays a graph of back-to-back calls lasting about this long
MAX_CALLS = 200
ROUNDS = 5  # samples per kernel; the median is kept
ERROR_CHARS = 2000
STARTUP_S = 600.0  # a child's imports (torch, Triton) on a loaded host, before it takes a task


class Inject(enum.Enum):
    """What the test hook makes happen at a kernel: the FAULT and TIMEOUT paths exercised without a
    faulty kernel."""

    EXIT = "exit"  # the child dies on reaching the kernel
    HANG = "hang"  # the child sleeps past any time limit
    KILL_WORKER = "kill-worker"  # the Dask worker dies on a task holding it (`distributed.run_in_worker`)


@dataclass(frozen=True)
class Task:
    """One problem and a batch of its candidate kernels, for one worker."""

    problem: Any
    kernels: tuple[KernelSpec, ...]
    jobs: int = 1  # compile processes of the batch's build
    seed: int = 0  # of the fresh operands


@dataclass(frozen=True)
class Outcome:
    kernel: str
    status: Status
    error: str | None = None
    time_ms: float | None = None


@dataclass(frozen=True)
class DeviceInfo:
    """The device that timed a batch: None on the CPU (the interpreter)."""

    gpu: str | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    host: str = field(default_factory=socket.gethostname)


@dataclass(frozen=True)
class TaskResult:
    outcomes: tuple[Outcome, ...]
    device: DeviceInfo
    build_s: float = 0.0  # wall time of the batch's compiles
    run_s: float = 0.0  # wall time of its checks and timings


def smi_query(index: str, fields: str) -> list[str] | None:
    """nvidia-smi's answer for one GPU (by the index CUDA_VISIBLE_DEVICES names), or None."""
    try:
        text = subprocess.run(["nvidia-smi", "-i", index, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in text.splitlines()[0].split(",")] if text else []
    return values if len(values) == len(fields.split(",")) else None


def injected(kernels: tuple[KernelSpec, ...]) -> dict[str, Inject]:
    """The test hook's actions by kernel name. Kernels of a GPU arch never take them, so a variable
    left in a shell cannot fault a real sweep; a malformed value is an error, not ignored."""
    from .. import arch as arch_facts

    text = os.environ.get(INJECT_ENV)
    if not text or not kernels or not arch_facts.load(kernels[0].arch).is_interpreter:
        return {}
    try:
        return {str(name): Inject(action) for name, action in json.loads(text).items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"{INJECT_ENV}={text[:200]!r} must be a JSON object of kernel names to one of "
                         f"{', '.join(i.value for i in Inject)} (a test hook); unset it for a real sweep") from None


def device_info() -> DeviceInfo:
    """This process's GPU (the first visible one): its name and clocks as nvidia-smi gives them
    (the name the parent resumes by), torch's name where nvidia-smi does not answer."""
    import torch

    if not torch.cuda.is_available():
        return DeviceInfo()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    found = smi_query(visible, "name,clocks.sm,clocks.mem")
    if found is None:
        return DeviceInfo(torch.cuda.get_device_name(0))
    try:
        return DeviceInfo(found[0], float(found[1]), float(found[2]))
    except ValueError:  # "[N/A]" clocks
        return DeviceInfo(found[0])


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:ERROR_CHARS]


def _poison(output: Any, zeroed: tuple) -> None:
    """NaN into every floating tensor of a plan's output (a tensor or a dataclass of them), except
    those the plan needs as zeros: an element the kernel never writes then fails the check."""
    import torch

    tensors = [output] if isinstance(output, torch.Tensor) else list(vars(output).values()) if hasattr(
        output, "__dataclass_fields__") else []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not any(t is z for z in zeroed):
            t.fill_(float("nan"))


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _context_lost(device) -> bool:
    """Whether the GPU's context is broken: CUDA errors of a kernel's fault stick to the process."""
    if device.type != "cuda":
        return False
    import torch

    try:
        torch.cuda.synchronize(device)
        return False
    except Exception:  # torch's AcceleratorError or RuntimeError, by version
        return True


def _time(run: Callable[[], None], on_gpu: bool) -> float:
    """Median milliseconds per call: CUDA-graph replays sampled in rounds on the GPU (events around
    plain launches where a graph cannot capture the kernel), one wall-clock run on the CPU."""
    from .timing import calls_lasting, event_sampler, graph_sampler, interleaved_medians, time_call

    if not on_gpu:
        return time_call(run, on_gpu=False).median_ms
    calls = calls_lasting(run, SAMPLE_MS, least=1, most=MAX_CALLS, repeats=3)
    try:
        sampler = graph_sampler(lambda _: run(), [None], calls)
    except RuntimeError:  # a stage that syncs or allocates on the host
        sampler = event_sampler(run, calls)
    return interleaved_medians({"kernel": sampler}, ROUNDS)["kernel"]


# (problem key, operand sets, reference) of the last problem this process prepared
_PREPARED: tuple[Any, list, Any] | None = None


class _Kernels:
    """A task's kernels on this process's device: built, checked, timed in turn."""

    def __init__(self, task: Task) -> None:
        import torch

        from .. import arch as arch_facts
        from ..core.dispatcher import Dispatcher
        from ..core.registry import Registry

        self.task = task
        self.definition = task.kernels[0].definition
        self.arch = arch_facts.load(task.kernels[0].arch)
        self.on_gpu = not self.arch.is_interpreter
        self.device = torch.device("cuda" if self.on_gpu else "cpu")
        self.dispatcher = Dispatcher(Registry(task.kernels), self.arch)
        self.specialization = self.definition.specialization_of(task.problem)
        self.operands: list | None = None
        self.expected: Any = None

    def build(self) -> dict[str, Outcome]:
        """Compiles the batch's kernels missing from the cache, `jobs` processes at once (none are
        started when every kernel is cached); the kernels that failed, as outcomes."""
        from ..core.kernel import LOADED_FILES, build_all, unit_key, units

        if not self.on_gpu:
            return {}
        cache = self.dispatcher.cache
        missing = [s for s in self.task.kernels if any(
            u.kind.compiled and cache.lookup(unit_key(s, u, self.specialization, cache), required=LOADED_FILES) is None
            for u in units(s, self.specialization))]
        if not missing:
            return {}
        results = build_all(missing, cache, self.task.jobs, specializations=(self.specialization,))
        return {r.name: Outcome(r.name, Status.BUILD_FAILED, (r.error or "")[:ERROR_CHARS])
                for r in results if not r.ok}

    def prepare(self) -> str | None:
        """The operand sets (enough to outgrow L2 on the GPU) and the reference; why not, if they
        cannot be made. The last problem's are kept: a problem's batches follow one another, and
        its float64 reference (on the CPU) can take longer than timing a batch."""
        global _PREPARED
        from ..heuristics import autotune

        make = self.definition.tuning_operands
        if make is None:
            return f"the {self.definition.kind.value} op makes no fresh operands (OpDefinition.tuning_operands)"
        key = (self.definition.kind.value, self.task.problem, self.task.seed, str(self.device))
        if _PREPARED is None or _PREPARED[0] != key:
            _PREPARED = None  # the last problem's tensors go before this one's are made
            sets = autotune.operand_sets(self.task.problem.bytes(), self.arch.l2_bytes, self.on_gpu)
            operands = [make(self.task.problem, self.device, self.task.seed + i) for i in range(sets)]
            expected = None
            if all(o is not None for o in operands) and self.definition.reference is not None:
                expected = self.definition.reference(operands[0])
            _PREPARED = (key, operands, expected)
        _, self.operands, self.expected = _PREPARED
        if any(o is None for o in self.operands):
            return "fresh operands do not reproduce this problem (its layout, alignment or tensors)"
        return None

    def run(self, spec: KernelSpec) -> Outcome:
        from ..core.dispatcher import stream_getter
        from ..core.errors import BuildError, CacheError
        from ..core.launch import execute

        name, definition = spec.name, self.definition
        try:
            launchers = self.dispatcher.launchers(spec, self.specialization)
        except (BuildError, CacheError) as e:
            return Outcome(name, Status.BUILD_FAILED, _error(e))
        stream = stream_getter(self.device)
        try:
            plan = definition.plan(spec.config, self.operands[0])
            _poison(plan.output, plan.zeroed)
            execute(plan, launchers, stream())
            _sync(self.device)
            if definition.check is not None:
                comparison = definition.check(plan.output, self.expected, self.operands[0])
                if not comparison.passed:
                    return Outcome(name, Status.WRONG, json.dumps(comparison.to_dict()))
            plans = itertools.cycle([plan] + [definition.plan(spec.config, o) for o in self.operands[1:]])
            time_ms = _time(lambda: execute(next(plans), launchers, stream()), self.on_gpu)
        except Exception as e:  # a Python error while planning, launching or timing: this kernel's alone,
            # unless the device's context is lost (an illegal address raises at the next sync): a FAULT
            return Outcome(name, Status.FAULT if _context_lost(self.device) else Status.LAUNCH_FAILED, _error(e))
        if not math.isfinite(time_ms) or time_ms <= 0:
            return Outcome(name, Status.LAUNCH_FAILED, f"timed at {time_ms} ms")
        return Outcome(name, Status.OK, None, time_ms)


def run_task(task: Task, started: Callable[[str], None] = lambda name: None,
             finished: Callable[[Outcome], None] = lambda outcome: None) -> TaskResult:
    """Builds, checks and times `task`'s kernels in this process, calling `started(name)` before
    each kernel (and `started(BUILDING)` before the build) and `finished(outcome)` after it."""
    inject = injected(task.kernels)
    kernels = _Kernels(task)
    started(BUILDING)
    begin = time.perf_counter()
    failed = kernels.build()
    build_s = time.perf_counter() - begin
    started(PREPARING)
    why_not = kernels.prepare()
    outcomes = []
    for spec in task.kernels:
        started(spec.name)
        action = inject.get(spec.name)
        if action is Inject.EXIT:
            os._exit(3)
        if action is Inject.HANG:
            time.sleep(3600)
        outcome = failed.get(spec.name) or (Outcome(spec.name, Status.UNSUPPORTED, why_not) if why_not
                                            else kernels.run(spec))
        outcomes.append(outcome)
        finished(outcome)
        if outcome.status is Status.FAULT:  # no kernel can run in this process's context any more
            os._exit(4)
    return TaskResult(tuple(outcomes), device_info(), build_s, time.perf_counter() - begin - build_s)


def _child_main(conn) -> None:
    """A worker process's start: it leads a process group of its own, so that killing the group
    also ends the compile processes it started (`IsolatedRunner._kill`)."""
    os.setpgid(0, 0)
    _child(conn)


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
            detail = _error(e) + "\n" + traceback.format_exc()[-ERROR_CHARS:]
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

    def run(self, task: Task) -> TaskResult:
        """Every kernel of `task` with an outcome: a kernel that killed the child is a FAULT, one
        that outlived the limit a TIMEOUT, and the rest of the batch runs in a fresh child."""
        done: dict[str, Outcome] = {}
        device, build_s, run_s = DeviceInfo(), 0.0, 0.0
        pending = task.kernels
        while pending:
            if self._process is None:
                self._start()
            result, in_flight, status = self._attempt(replace(task, kernels=pending), done)
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

    def _attempt(self, task: Task, done: dict[str, Outcome]) -> tuple[TaskResult | None, str | None, Status]:
        in_flight = None
        try:
            self._conn.send(task)
            while True:
                if not self._conn.poll(max(self.timeout_s, PREPARE_S) if in_flight == PREPARING else self.timeout_s):
                    self._kill()
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
