"""What a sweep runs in a worker process: build a batch of kernels, check each against its op's
reference, then time those that pass, in turns.

One child process per GPU (`sweep_runner.IsolatedRunner`, pinned by its parent with
CUDA_VISIBLE_DEVICES) runs `run_task`, naming each kernel before it runs it and reporting each
outcome as it has it, so that its parent knows the kernel in flight when it dies. On the CPU the
"GPU" is Triton's interpreter: the same path, one wall-clock run per kernel.
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable

from ..core.spec import KernelSpec
from .table import Status

# Test hook: {"<kernel name>": "exit" | "hang" | "kill-worker"} (`Inject`), read by `injected`.
INJECT_ENV = "TILEDISPATCH_SWEEP_INJECT"
BUILDING = "<build>"  # the in-flight marker of a batch's parallel build
PREPARING = "<prepare>"  # ... of making its problem's operands and float64 reference
PREPARE_S = 3600.0  # the limit of PREPARING: a long problem's CPU reference takes minutes, and never hangs
SAMPLE_MS = 20.0  # each timing sample replays a graph of back-to-back calls lasting about this long
MAX_CALLS = 200
ROUNDS = 5  # samples per kernel, taken in turns with the batch's other kernels; the median is kept
# A kernel whose first two timed calls both take this many times the problem's fastest so far keeps
# the faster one's time: it cannot be the oracle, and a model's grade is 0 below 1/8 of the oracle's
# speed (training's LambdaRank grades), so its samples buy nothing; a pathological one (a 14 s call
# where the fastest takes 29 ms) would hold the GPU for minutes.
SLOW_FACTOR = 8.0
HELD_SHARE = 0.25  # of the device's free memory, the most the outputs of kernels waiting to be timed hold
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


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:ERROR_CHARS]


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


def _first_ms(run: Callable[[], None], on_gpu: bool) -> float | None:
    """One call's GPU time, a queued call before it: how far a kernel is from the problem's fastest.
    None on the CPU, where the interpreter's one wall-clock run is the whole measurement."""
    from .timing import time_call

    return time_call(run, on_gpu=True, repeats=1, warmup=1).median_ms if on_gpu else None


def _sampler(run: Callable[[], None], on_gpu: bool) -> Callable[[], float]:
    """Milliseconds per call of `run`, a sample at a time: a replay of a CUDA graph of back-to-back
    calls on the GPU (events around plain launches where a graph cannot capture the kernel), one
    wall-clock run on the CPU."""
    from .timing import calls_lasting, event_sampler, graph_sampler, time_call

    if not on_gpu:
        return lambda: time_call(run, on_gpu=False).median_ms
    calls = calls_lasting(run, SAMPLE_MS, least=1, most=MAX_CALLS, repeats=3)
    try:
        return graph_sampler(lambda _: run(), [None], calls)
    except RuntimeError:  # a stage that syncs or allocates on the host
        return event_sampler(run, calls)


@dataclass
class _Timer:
    """A checked kernel waiting for its turns: its sampler, its plans, and the bytes they hold.

    The sampler's CUDA graph writes the plans' outputs and workspaces at the addresses they had
    when it was captured: the timer keeps them, or a replay would write memory the allocator has
    handed to the next kernel's plans, or fault on memory it has released."""

    name: str
    sample: Callable[[], float]
    plans: list
    held_bytes: int


def _held_bytes(plans: list) -> int:
    """Device bytes of the plans' outputs (and scratch): what a timer keeps alive until it is timed."""
    import torch

    held = 0
    for plan in plans:
        outputs = [getattr(plan.output, f.name) for f in fields(plan.output)] \
            if is_dataclass(plan.output) else [plan.output]
        held += sum(t.untyped_storage().nbytes() for t in (*outputs, *plan.zeroed) if isinstance(t, torch.Tensor))
    return held


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
        self.rounds = ROUNDS if self.on_gpu else 1  # the interpreter's wall clock is no measurement
        self.device = torch.device("cuda" if self.on_gpu else "cpu")
        self.dispatcher = Dispatcher(Registry(task.kernels), self.arch)
        self.specialization = self.definition.specialization_of(task.problem)
        self.operands: list | None = None
        self.expected: Any = None
        self.fastest_ms = math.inf  # the least first-call time of the batch's checked kernels so far

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

    def check(self, spec: KernelSpec) -> Outcome | _Timer:
        """Builds `spec`'s launchers, runs it once on poisoned outputs and checks the result: its
        outcome where it fails, else a timer of its plans over every operand set; a kernel far slower
        than the batch's fastest so far in two calls (`SLOW_FACTOR`), the faster call's time as an OK outcome."""
        from ..core.dispatcher import stream_getter
        from ..core.errors import BuildError, CacheError
        from ..core.launch import execute, run_checked

        name, definition = spec.name, self.definition
        try:
            launchers = self.dispatcher.launchers(spec, self.specialization)
        except (BuildError, CacheError) as e:
            return Outcome(name, Status.BUILD_FAILED, error_text(e))
        stream = stream_getter(self.device)
        try:
            plan, comparison = run_checked(definition, spec.config, self.operands[0], self.expected, launchers,
                                           stream(), self.device)
            if comparison is not None and not comparison.passed:
                return Outcome(name, Status.WRONG, json.dumps(comparison.to_dict()))
            plans = [plan] + [definition.plan(spec.config, o) for o in self.operands[1:]]
            turn = itertools.cycle(plans)
            run = lambda: execute(next(turn), launchers, stream())  # noqa: E731
            first_ms = _first_ms(run, self.on_gpu)
            if first_ms is not None and first_ms > SLOW_FACTOR * self.fastest_ms:
                # One call can be held up: by the host, binding a Python family's call on an operand set
                # it meets first, or on the GPU (a 4.8 us kernel once read 2.6 ms). The checked plan,
                # bound already, must agree.
                first_ms = min(first_ms, _first_ms(lambda: execute(plan, launchers, stream()), self.on_gpu))
                if first_ms > SLOW_FACTOR * self.fastest_ms:
                    return Outcome(name, Status.OK, f"the faster of two calls, {first_ms / self.fastest_ms:.0f}x the "
                                   "batch's fastest first call: not sampled in turns", first_ms)
            if first_ms is not None:
                self.fastest_ms = min(self.fastest_ms, first_ms)
            sample = _sampler(run, self.on_gpu)
        except Exception as e:
            return self.failed(name, e)
        return _Timer(name, sample, plans, _held_bytes(plans) if self.on_gpu else 0)

    def failed(self, name: str, e: BaseException) -> Outcome:
        """A Python error while planning, launching or timing: this kernel's alone, unless the
        device's context is lost (an illegal address raises at the next sync): then a FAULT."""
        return Outcome(name, Status.FAULT if _context_lost(self.device) else Status.LAUNCH_FAILED, error_text(e))

    def time_in_turns(self, timers: list[_Timer], started: Callable[[str], None],
                      report: Callable[[Outcome], None]) -> None:
        """Reports the timers' medians, sampled in turns (`timing.interleaved_medians`: the GPU's
        clock drifts by more than the kernels of a problem differ, so each kernel's samples are
        drawn from the same moments as the others'); `started(name)` before each sample names the
        kernel in flight. A timer that raises is that kernel's failure and the others go on, but a
        FAULT is reported at once: the device's context is lost, and the kernels sampled after it
        would fail for it (`report` ends the process on a FAULT)."""
        failures: dict[str, Outcome] = {}

        def guarded(timer: _Timer) -> Callable[[], float]:
            def sample() -> float:
                if timer.name in failures:
                    return math.nan
                started(timer.name)
                try:
                    return timer.sample()
                except Exception as e:
                    failures[timer.name] = failure = self.failed(timer.name, e)
                    if failure.status is Status.FAULT:
                        report(failure)
                    return math.nan
            return sample

        from .timing import interleaved_medians

        medians = interleaved_medians({t.name: guarded(t) for t in timers}, self.rounds)
        for timer in timers:
            time_ms = medians[timer.name]
            if timer.name in failures:
                report(failures[timer.name])
            elif not math.isfinite(time_ms) or time_ms <= 0:
                report(Outcome(timer.name, Status.LAUNCH_FAILED, f"timed at {time_ms} ms"))
            else:
                report(Outcome(timer.name, Status.OK, None, time_ms))

    def held_bytes_limit(self) -> int:
        """Bytes the timers waiting for their turns may hold: a share of the device's free memory."""
        import torch

        return int(torch.cuda.mem_get_info(self.device)[0] * HELD_SHARE) if self.on_gpu else 0


def run_task(task: Task, started: Callable[[str], None] = lambda name: None,
             finished: Callable[[Outcome], None] = lambda outcome: None) -> TaskResult:
    """Builds and checks `task`'s kernels in this process, then times those that pass in turns,
    calling `started(name)` before each kernel's check and each of its samples (and
    `started(BUILDING)` before the build) and `finished(outcome)` once a kernel has its outcome.

    The checked kernels wait for their turns together, as many as `held_bytes_limit` lets their
    outputs stay on the device at once; a larger batch is timed in groups."""
    inject = injected(task.kernels)
    kernels = _Kernels(task)
    started(BUILDING)
    begin = time.perf_counter()
    failed = kernels.build()
    build_s = time.perf_counter() - begin
    started(PREPARING)
    why_not = kernels.prepare()
    outcomes: dict[str, Outcome] = {}
    waiting: list[_Timer] = []
    limit = kernels.held_bytes_limit() if why_not is None else 0

    def report(outcome: Outcome) -> None:
        outcomes[outcome.kernel] = outcome
        finished(outcome)
        if outcome.status is Status.FAULT:  # no kernel can run in this process's context any more
            os._exit(4)

    def time_waiting() -> None:
        kernels.time_in_turns(waiting, started, report)
        waiting.clear()

    for spec in task.kernels:
        started(spec.name)
        action = inject.get(spec.name)
        if action is Inject.EXIT:
            os._exit(3)
        if action is Inject.HANG:
            time.sleep(3600)
        checked = failed.get(spec.name) or (Outcome(spec.name, Status.UNSUPPORTED, why_not) if why_not
                                            else kernels.check(spec))
        if isinstance(checked, Outcome):
            report(checked)
            continue
        waiting.append(checked)
        if sum(t.held_bytes for t in waiting) > limit:
            time_waiting()
    time_waiting()
    return TaskResult(tuple(outcomes[s.name] for s in task.kernels), device_info(), build_s,
                      time.perf_counter() - begin - build_s)
