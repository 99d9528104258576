"""The dispatcher: problem -> candidates -> ranking -> kernel -> launch, for every op.

Selections are memoized per problem key, and launchers per kernel name, so a call on
a problem seen before costs a table lookup, the plan and the launch. Every memo is safe
to share between threads and made once per key (`memo.LruTable.get_or_make`); those
keyed by problem are bounded, so a process that sees millions of shapes stays small.
"""

from __future__ import annotations

import array
import contextlib
import contextvars
import functools
import itertools
import logging
import os
import threading
import weakref
from typing import Any, Callable, Sequence

from . import kernel as kernel_step
from .choice import Choice
from .cache import KernelCache
from .errors import BuildError, CacheError, InsecureCacheError, NoKernelError, UnsupportedError
from .launch import execute
from .memo import LruTable
from .op import RuleSet, all_ops, get_op
from .candidate_set import CandidateSet, model_order
from .ranking import Accepted, Candidate, Explanation, ModelSource, Ranking, model_source
from .registry import Registry
from .tuning import TuningRecord, TuningStore, finalist_reference, policy, wrong_result
from .runtime import Backend, check_device, current_arch, default_backend
from .spec import KernelSpec

log = logging.getLogger("tiledispatch.dispatcher")


class Strategy(Choice):
    FIRST = "first"  # the first supporting kernel in registry order
    RULES = "rules"  # the analytic score of the op (tile waste, waves, occupancy)
    AUTOTUNE = "autotune"  # the finalists timed once per problem, the fastest remembered on disk; they are
    # taken from the model's order where a model ships for the problem (its picks on unseen problems:
    # docs/selection.md), else from the rules'.
    MODEL = "model"  # a learned model's costs order what the rules accept (the rules where no model covers)


# The memos' capacities. Selections and bound calls (1-3 KiB a shape, together) are kept
# for the shapes in use: 4096 of each bound a serving process however many shapes it sees.
# A ranking is read on a problem's first sight only (select, then a launch-bound call's
# graph replays' pick): a few dozen cover the threads binding at once. Each is a byte or
# two per kernel of the op (the refusals, compactly) plus the accepted candidates' scores.
SELECTIONS_KEPT = 4096
BOUND_KEPT = 4096
RANKINGS_KEPT = 32
# Candidate sets (`core.candidate_set`): one per class of problems in use (a GEMM class is its dtypes, layout and
# epilogue), each a few KB of columns.
CANDIDATE_SETS_KEPT = 256
BROKEN = "failed to build on this machine"  # the refusal of a kernel that failed to build or load here
class Dispatcher:
    def __init__(self, registry: Registry, arch=None, *, strategy: Strategy | str = Strategy.RULES,
                 cache: KernelCache | None = None, tuning: TuningStore | None = None,
                 models: ModelSource | None = None, rank_buckets: bool = True) -> None:
        self.arch = arch if arch is not None else current_arch()
        # Where the op ranks a bucket of problems once (`OpDefinition.ranking_problem`); False: each
        # problem its own, as a sweep plans (every kernel a problem accepts, with its own scores).
        self.rank_buckets = rank_buckets
        self.registry = registry.for_arch(self.arch)
        self.strategy = Strategy.parse(strategy)
        self._cache = cache
        if models is not None and not callable(getattr(models, "model_for", None)):
            from .errors import InvalidArgumentError

            raise InvalidArgumentError(f"models must be a model source (a core.ranking.ModelSource, such as "
                                       f"learned.Models([model])), or None for the shipped models; got "
                                       f"{type(models).__name__}")
        self._models = models  # the `model` strategy's; None: the registered (shipped) ones
        self._selected = LruTable(SELECTIONS_KEPT)  # problem key -> KernelSpec
        self._rankings = LruTable(RANKINGS_KEPT)  # see _ranking
        # id(a registry class's candidates) -> its CandidateSet, which holds the tuple (so the id stays its own)
        self._sets = LruTable(CANDIDATE_SETS_KEPT)
        self._bound = LruTable(BOUND_KEPT)  # an op's bound calls: see memo
        # (kernel name, specialization) -> launchers by stage. Not bounded by use: the registry
        # and the op's specializations bound it, and a bound call keeps its launchers' loaded
        # module alive anyway, so dropping an entry would only load the module a second time.
        self._launchers = LruTable(None)
        # Names of kernels that failed to build here: a subset of the registry's names.
        self._broken: set[str] = set()
        self._tuning = tuning  # autotune's records; by default beside the kernel cache
        self._lock = threading.RLock()  # guards _broken and the lazily made cache and tuning store
        self._timing = threading.Lock()  # autotune times one problem at a time: see _tuned
        _DISPATCHERS.add(self)

    def _after_fork(self) -> None:
        """A forked child has only the forking thread: a lock another thread held stays held
        there (its memo tables reset themselves: `memo.LruTable`)."""
        self._lock = threading.RLock()
        self._timing = threading.Lock()

    @property
    def cache(self) -> KernelCache:
        if self._cache is None:  # made on first build only: the interpreter never needs one
            with self._lock:
                if self._cache is None:
                    self._cache = KernelCache()
        return self._cache

    # -- candidates and ranking -----------------------------------------------------
    def _ranking(self, problem) -> Ranking:
        """The problem's ranking, kept for the last RANKINGS_KEPT problems used.

        A call's first sight of a problem ranks it for `select`, and binding a launch-bound
        call looks again for its graph replays' pick (gemm's `replay_pick`): threads that see
        a new problem at once wait for one ranking. A kernel that fails to build changes the
        ranking, so the count of those is part of the key.
        """
        key = (problem.key(), len(self._broken))
        return self._rankings.get_or_make(key, lambda: self._rank(problem), share_errors=True)

    def _rank(self, problem) -> Ranking:
        specs = self.registry.candidates(problem.op, problem)
        definition = get_op(problem.op)  # every candidate's: the registry gives the problem's op's kernels
        candidates = self._sets.get_or_make(id(specs), lambda: CandidateSet(definition, specs, self.arch))
        refusals = candidates.refusals(problem)
        if self._broken:
            broken = self._broken
            refusals = [BROKEN if r is None and s.name in broken else r for r, s in zip(refusals, specs)]
        reasons: dict[str | None, int] = {None: 0}
        reason_ids = [reasons.setdefault(reason, len(reasons)) for reason in refusals]
        typecode = "B" if len(reasons) <= 0xFF else "H" if len(reasons) <= 0xFFFF else "L"
        rows = [i for i, reason in enumerate(refusals) if reason is None]
        stand_in = problem if definition.ranking_problem is None or not self.rank_buckets \
            else definition.ranking_problem(problem)
        if stand_in != problem and self.strategy is not Strategy.FIRST:
            ranked = self._ranking(stand_in)
            if ranked.specs is specs and isinstance(ranked.accepted, Accepted):
                accepted = ranked.accepted.within(refusals)
                if accepted:
                    return Ranking(accepted, specs, tuple(reasons), array.array(typecode, reason_ids), ranked.model,
                                   stand_in)
        model = None
        if self.strategy is Strategy.FIRST:
            accepted = Accepted(specs, rows)
        else:
            scores = candidates.scores(rows, problem)
            # By score, best first; stable, so ties keep registry order.
            order = sorted(range(len(rows)), key=scores.values.__getitem__, reverse=True)
            costs = None
            source = self._models if self._models is not None else model_source()
            if self.strategy in (Strategy.MODEL, Strategy.AUTOTUNE) and rows and source is not None:
                predictor = source.model_for(problem, self.arch)  # None where none covers the problem
                if predictor is not None:
                    order, costs = model_order(predictor, problem, self.arch, candidates, rows, scores, order)
                    model = predictor.label
            accepted = Accepted(specs, rows, scores, order, costs)
        return Ranking(accepted, specs, tuple(reasons), array.array(typecode, reason_ids), model)

    def ranked(self, problem) -> Sequence[Candidate]:
        """The candidates that accept `problem`, best first: `explain(problem).ranked` without
        the refusals, which cost an object per kernel of the registry to spell out."""
        return self._ranking(problem).accepted

    def select(self, problem, *, device=None) -> KernelSpec:
        """The kernel for a problem. Under `autotune`, the remembered winner, or one timed now
        on `device` (the first ranked where there is neither: `explain`, a graph capture)."""
        key = problem.key()
        spec = self._selected.get(key)
        if spec is not None:
            return spec
        ranking = self._ranking(problem)
        accepted = ranking.accepted
        if not accepted:
            refused = ranking.refused()
            broken = sum(c.refused == BROKEN for c in refused)
            if broken:
                raise NoKernelError(
                    f"the {broken} kernel(s) for {problem.op.value} on {self.arch.name} that support this problem "
                    f"({problem.describe()}) {BROKEN}; the warnings logged (tiledispatch.dispatcher) say why")
            reasons = sorted({c.refused for c in refused})[:5]
            dtypes = sorted({c.spec.dtype for c in refused})
            raise NoKernelError(
                f"no kernel among {len(refused)} for {problem.op.value} on {self.arch.name} supports this "
                f"problem ({problem.describe()}); the registry has kernels for dtypes {dtypes}; "
                f"reasons given: {reasons or ['the registry is empty']}"
            )
        spec = accepted[0].spec
        if self.strategy is Strategy.AUTOTUNE:
            record = self._tuned(problem, accepted, device)
            if record is None:
                return spec  # not remembered: a later call with a device tunes
            spec = self.registry.get(record.winner)
        self._selected.put(key, spec)
        return spec

    def explain(self, problem) -> Explanation:
        ranking = self._ranking(problem)
        accepted = ranking.accepted
        selected = accepted[0].spec if accepted else None
        record = self._tuned(problem, accepted, None) if accepted and self.strategy is Strategy.AUTOTUNE else None
        if record is not None:
            selected = self.registry.get(record.winner)
        return Explanation(problem, self.arch.name, self.strategy, selected, accepted, ranking,
                           None if record is None else record.times_ms)

    # -- autotune ----------------------------------------------------------------------
    @property
    def tuning(self) -> TuningStore:
        if self._tuning is None:  # beside the compiled kernels, under the same private root
            with self._lock:
                if self._tuning is None:
                    self._tuning = TuningStore(self.cache.root)
        return self._tuning

    def _tuned(self, problem, accepted: list[Candidate], device) -> TuningRecord | None:
        """The stored record of this problem's finalists; timed now if there is none and `device` allows."""
        finalists = policy().finalists(accepted)
        names = [c.spec.name for c in finalists]
        key = self.tuning.key(problem.op.value, self.arch.name, problem, names, _device_name(device, self.arch))
        record = self.tuning.get(key, finalists=names)
        if record is None and device is not None:
            # One timing at a time: kernels timed at once on one device slow each other down,
            # and threads meeting one new problem together time it once.
            with self._timing:
                record = self.tuning.get(key, finalists=names)
                if record is None:
                    record = self._time_finalists(problem, finalists, device)
                    if record is not None:
                        self.tuning.put(key, record)
        return record if record is not None and record.winner in names else None

    def _time_finalists(self, problem, finalists: list[Candidate], device) -> TuningRecord | None:
        definition = finalists[0].spec.definition
        on_gpu = device.type == "cuda"
        if definition.tuning_operands is None or (on_gpu and _capturing()):
            log.info("autotune: cannot time %s now; ranked by rules", problem.describe())
            return None
        sets = policy().operand_sets(problem.bytes(), self.arch.l2_bytes, on_gpu)
        operands = [definition.tuning_operands(problem, device, seed) for seed in range(sets)]
        if any(o is None for o in operands):
            log.info("autotune: no fresh operands reproduce %s; ranked by rules", problem.describe())
            return None
        stream = stream_getter(device)  # read at each call: a graph capture runs on a stream of its own
        expected = finalist_reference(definition, operands[0], problem)
        runs = {}
        for candidate in finalists:
            spec = candidate.spec
            try:
                launchers = self.load_for(problem, spec)
            except BuildError:
                log.warning("kernel %s failed to build; not a finalist", spec.name, exc_info=True)
                with self._lock:
                    self._broken.add(spec.name)
                continue
            wrong = expected is not None and wrong_result(definition, spec.config, operands[0], expected, launchers,
                                                          stream(), device)
            if wrong:
                log.error("autotune: kernel %s gave a wrong result on %s (%s); not a finalist", spec.name,
                          problem.describe(), wrong)
                continue
            plans = itertools.cycle([definition.plan(spec.config, o) for o in operands])
            runs[spec.name] = functools.partial(_run_next, plans, launchers, stream)
        if not runs:
            return None
        times = policy().measure(runs, on_gpu)
        vendors = [c.spec.name for c in finalists if not kernel_step.compiles(c.spec)]
        winner = policy().winner(times, vendors)
        log.info("autotune: %s -> %s (%s)", problem.describe(), winner,
                 ", ".join(f"{n} {t:.4f} ms" for n, t in times.items()))
        return TuningRecord(winner, times, problem.describe())

    def resolve(self, kernel: str | KernelSpec, problem) -> KernelSpec:
        """A forced kernel, checked: a name (or a KernelSpec) that is registered, a kernel of the
        problem's op (another op's support check reads fields this problem lacks), and one that
        supports the problem."""
        from .args import as_kernel_name
        from .errors import InvalidArgumentError

        name = as_kernel_name(kernel, "kernel")
        if name is None:
            raise InvalidArgumentError("kernel must name the kernel to force (None selects one)")
        spec = self.registry.get(name)
        if spec.op is not problem.op:
            op = problem.op.value
            raise UnsupportedError(f"kernel {name} is a {spec.op.value} kernel; {op} takes {op} kernels, "
                                   f"see `tiledispatch registry list --op {op}`")
        reason = spec.definition.supports(spec.config, problem)
        if reason is not None:
            raise UnsupportedError(f"kernel {spec.name} cannot run this problem: {reason}")
        return spec

    # -- kernel and launch ------------------------------------------------------------
    def launchers(self, spec: KernelSpec, specialization: Any | None = None) -> dict[str, Any]:
        """The kernel's launchers by stage, loaded (built if need be) once per specialization.

        Threads asking for one kernel at once wait for its one load, and share its BuildError
        or CacheError; a thread asking for another kernel meanwhile goes on without waiting.
        """
        return self._launchers.get_or_make((spec.name, specialization),
                                           functools.partial(self._load, spec, specialization), share_errors=True)

    def load_for(self, problem, spec: KernelSpec) -> dict[str, Any]:
        """`spec`'s launchers for `problem`'s specialization: every path that loads a kernel to run
        a problem asks here (a warm-up's Recorder notes the pair)."""
        return self.launchers(spec, spec.definition.specialization_of(problem))

    def _load(self, spec: KernelSpec, specialization: Any | None) -> dict[str, Any]:
        cache = None if self.arch.is_interpreter else self.cache
        return kernel_step.load(spec, cache, specialization)

    def run(self, operands, *, kernel: str | KernelSpec | None = None):
        """Runs the op on checked operands with the selected (or the forced) kernel."""
        spec, launchers = self.prepare(operands, kernel=kernel)
        plan = spec.definition.plan(spec.config, operands)
        return execute(plan, launchers, _stream(operands.device))

    def prepare(self, operands, *, kernel: str | KernelSpec | None = None) -> tuple[KernelSpec, dict[str, Any]]:
        """The kernel for checked operands and its launchers: the first candidate that builds."""
        problem = operands.problem
        check_device(operands.device, self.arch)
        failure: Exception | None = None
        while True:
            try:
                spec = (self.resolve(kernel, problem) if kernel is not None
                        else self.select(problem, device=operands.device))
            except NoKernelError as e:
                if failure is None:
                    raise
                raise e from failure  # every candidate left failed to load: say why the last one did
            try:
                launchers = self.load_for(problem, spec)
                break
            except (BuildError, CacheError) as e:
                if kernel is not None or isinstance(e, InsecureCacheError):
                    raise  # a forced kernel has no next candidate; an untrusted cache fails them all
                failure = e
                log.warning("kernel %s failed to %s; selecting the next candidate", spec.name,
                            "build" if isinstance(e, BuildError) else "load from the cache", exc_info=True)
                with self._lock:
                    self._broken.add(spec.name)
                self._selected.pop(problem.key(), None)
        return spec, launchers

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """A per-dispatcher memo for an op's bound calls (its fast path), made once per key.

        The last BOUND_KEPT keys used are kept. Where `make` fails, its error is the calling
        thread's alone: a thread that was waiting on it makes the value itself.
        """
        return self._bound.get_or_make(key, make)


_DISPATCHERS: "weakref.WeakSet[Dispatcher]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for dispatcher in list(_DISPATCHERS):
        dispatcher._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _run_next(plans, launchers, stream: Callable[[], int | None]) -> None:
    execute(next(plans), launchers, stream())


def _device_name(device, arch) -> str:
    """The GPU's model (an H100 and an H200 share an arch, not a bandwidth); the interpreter's name."""
    if arch.is_interpreter:
        return "interpreter"
    import torch

    return torch.cuda.get_device_name(device if device is not None and device.type == "cuda" else None)


def _capturing() -> bool:
    import torch

    return torch.cuda.is_current_stream_capturing()


def _stream(device) -> int | None:
    return stream_getter(device)()


def stream_getter(device) -> Callable[[], int | None]:
    """A function giving the current stream of `device` (None off the GPU), for ops' fast paths.

    It reads torch's raw getter: torch.cuda.current_stream builds a Stream object each call.
    """
    if device.type != "cuda":
        return _no_stream
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


def _no_stream() -> None:
    return None


# One dispatcher per rule set and backend (eight at most), made once: threads making their first calls
# together share one, with one memo of rankings, selections and loaded kernels.
_DEFAULTS = LruTable(None)


def default_dispatcher(rule_set: RuleSet | str = RuleSet.DEFAULT, backend: Backend | None = None) -> Dispatcher:
    """One per process and backend (default: `runtime.default_backend`): the shipped rule sets of
    every implemented op, for that backend's arch, ranked by `$TILEDISPATCH_STRATEGY`, else by the
    learned models where the arch ships any, else by the rules (`default_strategy`). `cache_clear()`
    forgets them (tests that change the environment)."""
    key = (RuleSet.parse(rule_set), backend or default_backend())
    return _DEFAULTS.get_or_make(key, functools.partial(_make_default, *key))


# The default rule set's dispatcher by the call's `tensor.is_cuda`, once made: a plain dict read,
# as every public call without `dispatcher=` asks for it.
_BY_DEVICE: dict[bool, Dispatcher] = {}


def _clear_defaults() -> None:
    _BY_DEVICE.clear()
    _DEFAULTS.clear()


default_dispatcher.cache_clear = _clear_defaults


def dispatcher_or_default(dispatcher: Any, tensor: Any = None) -> Dispatcher:
    """The `dispatcher` argument of a public op: a Dispatcher, or None for the default one of
    the backend `tensor`'s device runs kernels on (the process's default without one). The
    device alone decides here, on every call: a forced backend is checked as the call selects."""
    if dispatcher is None:
        scoped = _SCOPED.get()
        if scoped is not None:
            return scoped
        on_gpu = getattr(tensor, "is_cuda", None)  # not `device`: it builds an object each read
        if on_gpu is None:
            return default_dispatcher()
        chosen = _BY_DEVICE.get(on_gpu)
        if chosen is None:
            chosen = _BY_DEVICE[on_gpu] = default_dispatcher(backend=Backend.CUDA if on_gpu else Backend.INTERPRETER)
        return chosen
    if not isinstance(dispatcher, Dispatcher):
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"dispatcher must be a tiledispatch.Dispatcher, or None for the default one; "
                                   f"got {dispatcher!r} ({type(dispatcher).__name__})")
    return dispatcher


# The dispatcher `using` puts in place of the default one, in this thread or task.
_SCOPED: contextvars.ContextVar[Dispatcher | None] = contextvars.ContextVar("tiledispatch_dispatcher", default=None)


@contextlib.contextmanager
def using(dispatcher: Dispatcher):
    """Within it, ops called without `dispatcher=` use `dispatcher` (this thread or task only;
    autograd's backward runs on threads of its own, and takes the forward's dispatcher there)."""
    if not isinstance(dispatcher, Dispatcher):
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"using() takes a tiledispatch.Dispatcher; got {type(dispatcher).__name__}")
    token = _SCOPED.set(dispatcher)
    try:
        yield dispatcher
    finally:
        _SCOPED.reset(token)


def _make_default(rule_set: RuleSet, backend: Backend) -> Dispatcher:
    """The shipped rule sets as one lazy registry: a problem class is generated at its first call."""
    arch = current_arch(backend)
    registry = Registry.from_rule_sets([definition.kind for definition in all_ops()], rule_set, arch)
    return Dispatcher(registry, arch, strategy=default_strategy(arch))


def default_strategy(arch, source: ModelSource | None = None) -> Strategy:
    """`$TILEDISPATCH_STRATEGY` where set; else `model` on an arch with shipped models (those of
    `source`, by default the registered one), `rules` elsewhere."""
    chosen = os.environ.get("TILEDISPATCH_STRATEGY")
    if chosen:
        return Strategy.parse(chosen)
    source = source if source is not None else model_source()
    return Strategy.MODEL if source is not None and source.ships(arch) else Strategy.RULES
