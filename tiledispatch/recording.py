"""Warm-up ahead of time: record the problems a model poses, compile their kernels in parallel.

A model's first real call would otherwise compile each selected kernel in turn, on the calling
thread (seconds a kernel). `warmup(model, example_inputs)` runs the model once through a
`Recorder`: a dispatcher that selects exactly as the default one does and records each problem
with its pick, but launches no compiled kernel (the vendor library's stages run, as they compile
nothing), so the outputs are uninitialised memory of the right shapes. The picks are then built
by worker processes together (`core.kernel.build_each`, Triton's launchers with them) and
loaded, so a model's first real call finds its problems ranked and its kernels loaded.

The recorded shapes are JSON (`save_shapes` / `load_shapes`) that a serving engine can ship and
warm from, without the model: `tiledispatch warmup shapes.json`, or `build_shapes(load_shapes(...))`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .core.dispatcher import Dispatcher, default_dispatcher, dispatcher_or_default, using
from .core.errors import BuildError, CacheError, InvalidArgumentError, UnknownKernelError
from .core.jsonio import read_json
from .core.kernel import BuildResult, PythonLauncher, build_each, compiles, units
from .core.op import get_op
from .core.serialize import from_jsonable, to_jsonable

log = logging.getLogger("tiledispatch.warmup")

FORMAT = "tiledispatch-shapes"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Shape:
    """One problem a program posed, and the kernel the dispatcher picked for it."""

    problem: Any
    kernel: str

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.problem.op.value, "problem": to_jsonable(self.problem), "kernel": self.kernel}

    @classmethod
    def from_dict(cls, data: Any, where: str = "shape") -> "Shape":
        if not isinstance(data, dict) or not {"op", "problem", "kernel"} <= set(data):
            raise ValueError(f"{where}: expected an object with op, problem and kernel")
        definition = get_op(data["op"])
        return cls(from_jsonable(definition.problem_type, data["problem"], f"{where}.problem"), str(data["kernel"]))


def _skip(grid, args, stream) -> None:
    """A compiled stage under recording: nothing runs, nothing is built."""


class Recorder(Dispatcher):
    """Selects as `base` does (its registry, arch, strategy, models, cache and tuning store),
    records each problem with every kernel loaded for it, and launches no compiled kernel.

    Its selections are `base`'s own tables (they depend on no launch): the first real call after
    a warm-up ranks nothing again. Nothing it binds outlives it: its memo keeps nothing, so no
    bound call with skipped stages can serve a real call. Under autotune it times nothing (a
    skipped stage has no time): it records every finalist, for the real call to time them built."""

    def __init__(self, base: Dispatcher) -> None:
        super().__init__(base.registry, base.arch, strategy=base.strategy, cache=base._cache, tuning=base._tuning,
                         models=base._models)
        self._selected, self._rankings, self._broken = base._selected, base._rankings, base._broken
        self._seen: dict[Any, Shape] = {}
        self._recording = threading.Lock()

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return tuple(self._seen.values())

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        return make()

    def load_for(self, problem, spec) -> dict[str, Any]:
        self._note(problem, spec)
        return super().load_for(problem, spec)

    def _note(self, problem, spec) -> None:
        with self._recording:
            self._seen.setdefault((problem.key(), spec.name), Shape(problem, spec.name))

    def _time_finalists(self, problem, finalists, device):
        for candidate in finalists:
            self._note(problem, candidate.spec)
        return None

    def _load(self, spec, specialization) -> dict[str, Any]:
        """Compiled stages skipped; the Python ones (the vendor library) run, as they compile nothing
        and the outputs they hand over give the model its shapes."""
        return {unit.stage: _skip if unit.kind.compiled else PythonLauncher(unit) for unit in units(spec, specialization)}


def record(fn: Callable[..., Any], *args, dispatcher: Dispatcher | None = None, **kwargs) -> tuple[Shape, ...]:
    """The problems `fn(*args, **kwargs)` poses to tiledispatch's ops, each with its pick, in
    first-seen order; no compiled kernel runs (see the module docstring). Without `dispatcher`,
    the default one of the first tensor's device among the arguments (the process's default
    where `fn` takes none: pass `dispatcher` when it closes over its tensors)."""
    recorder = Recorder(dispatcher if dispatcher is not None else _default_for((args, kwargs)))
    with using(recorder):
        fn(*args, **kwargs)
    return recorder.shapes


def _default_for(inputs: Any) -> Dispatcher:
    """The default dispatcher of the backend the first tensor in `inputs` runs on (nested lists,
    tuples and dicts searched), as the ops' own default follows their tensors' device."""
    import torch

    pending = [inputs]
    while pending:
        item = pending.pop(0)
        if isinstance(item, torch.Tensor):
            return dispatcher_or_default(None, item)
        if isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return default_dispatcher()


def _spec_of(dispatcher: Dispatcher, shape: Shape):
    """The shape's recorded kernel, or this dispatcher's pick where the file was recorded for
    another arch (its kernel names are that arch's): the problem is what a shapes file ships."""
    dispatcher.registry.candidates(shape.problem.op, shape.problem)  # a lazy registry makes the class only
    try:
        return dispatcher.registry.get(shape.kernel)
    except UnknownKernelError:
        return dispatcher.select(shape.problem)


def build_shapes(shapes: Iterable[Shape], *, dispatcher: Dispatcher | None = None,
                 jobs: int | None = None) -> list[BuildResult]:
    """Compiles the kernel of each shape for its problem's specialisation, `jobs` worker processes
    at once (default: the CPU count). On the interpreter nothing is compiled."""
    dispatcher = dispatcher if dispatcher is not None else default_dispatcher()
    if dispatcher.arch.is_interpreter:
        return []
    work: dict[tuple, tuple] = {}  # (specialisation, kernel name) -> (spec, (specialisation,))
    for shape in shapes:
        spec = _spec_of(dispatcher, shape)
        specialization = spec.definition.specialization_of(shape.problem)
        if compiles(spec, specialization):
            work[specialization, spec.name] = (spec, (specialization,))
    return build_each(work.values(), dispatcher.cache, jobs or os.cpu_count() or 1)


def _tensors_of(out: Any) -> list:
    """The tensors of a model's output: itself, or those of a tuple, a list or a mapping's values
    (transformers' ModelOutput is a mapping), recursively."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    items = out.values() if isinstance(out, Mapping) else out if isinstance(out, (tuple, list)) else ()
    return [t for item in items for t in _tensors_of(item)]


def warmup(model: Callable[..., Any], *example_inputs, backward: bool = False, shapes_file: str | Path | None = None,
           jobs: int | None = None, dispatcher: Dispatcher | None = None) -> tuple[Shape, ...]:
    """Records the problems `model(*example_inputs)` poses in inference (and, with `backward`, in a
    training step: a forward autograd records, then its backward), compiles their kernels in
    parallel, and writes the shapes to `shapes_file` if given.

    A model that trains is evaluated too, and its inference calls bind kernels of their own (an
    epilogue fused where autograd would need its input, a 1x1 conv as one GEMM), so `backward`
    records both. The model runs with no compiled kernel launched: its outputs are not meaningful,
    and a model whose control flow reads its activations' values records one path only.
    """
    def run() -> None:
        import torch

        with torch.no_grad():
            model(*example_inputs)
        if backward:
            with torch.enable_grad():
                out = model(*example_inputs)
                tensors = [t for t in _tensors_of(out) if t.requires_grad]
                if not tensors:
                    raise InvalidArgumentError("backward=True: the model's output does not require grad")
                torch.autograd.backward(tensors, [torch.zeros_like(t) for t in tensors])

    dispatcher = dispatcher if dispatcher is not None else _default_for(example_inputs)
    shapes = record(run, dispatcher=dispatcher)
    failed = [r for r in build_shapes(shapes, dispatcher=dispatcher, jobs=jobs) if not r.ok]
    if shapes_file is not None:
        save_shapes(shapes, shapes_file)
    for result in failed:  # the dispatcher takes its next candidate for these at the first real call
        log.warning("kernel %s failed to build: %s", result.name, result.error)
    broken = {result.name for result in failed}
    for shape in shapes:  # loaded now, so that the first real call loads nothing
        if shape.kernel not in broken:
            try:
                dispatcher.load_for(shape.problem, _spec_of(dispatcher, shape))
            except (BuildError, CacheError):
                log.warning("kernel %s failed to load after its build", shape.kernel, exc_info=True)
    return shapes


def save_shapes(shapes: Iterable[Shape], path: str | Path) -> Path:
    path = Path(path)
    items = [shape.to_dict() for shape in shapes]
    path.write_text(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "shapes": items}, indent=1) + "\n")
    return path


def load_shapes(path: str | Path) -> tuple[Shape, ...]:
    """The shapes `save_shapes` wrote; the file is untrusted input, read bounded (core.jsonio),
    and anything wrong with it raises ValueError naming the file and the entry."""
    data = read_json(Path(path))
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a tiledispatch shapes file (format {FORMAT!r}, version {FORMAT_VERSION})")
    items = data.get("shapes")
    if not isinstance(items, list):
        raise ValueError(f"{path}: \"shapes\" must be a list")
    shapes = []
    for i, item in enumerate(items):
        try:
            shapes.append(Shape.from_dict(item, f"shapes[{i}]"))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}: {e}") from None
        except Exception as e:  # an unknown op
            raise ValueError(f"{path}: shapes[{i}]: {e}") from None
    return tuple(shapes)
