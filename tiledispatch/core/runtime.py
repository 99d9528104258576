"""Where kernels run: compiled on a CUDA GPU, or on the CPU under Triton's interpreter.

Each call's tensors decide: CPU tensors run under the interpreter, CUDA tensors run compiled
kernels. Importing tiledispatch sets nothing: the kernels are Triton's ordinary JITFunctions,
and `interpreter_session` runs them under the interpreter on demand, so one process may run
both and may import Triton before tiledispatch.

``TILEDISPATCH_BACKEND`` forces one backend for the process: ``interpreter`` or ``cuda``; a
tensor on the other device is then refused. ``auto`` (or unset) lets the tensors decide. It is
read as a call selects its kernel (`check_device`): every call on the CPU, a GPU call's first
(one seen before replays its bound plan, which reads no environment). ``TRITON_INTERPRET=1`` set before the kernels are imported makes Triton decorate them for
the interpreter only, so it forces the interpreter too.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import threading
from typing import Any

from .errors import InvalidProblemError, TiledispatchError, UnsupportedError

ENV_BACKEND = "TILEDISPATCH_BACKEND"
ENV_TRITON_INTERPRET = "TRITON_INTERPRET"


class Backend(enum.Enum):
    CUDA = "cuda"
    INTERPRETER = "cpu-interpreter"

    @property
    def device(self) -> str:
        return "cuda" if self is Backend.CUDA else "cpu"


# TILEDISPATCH_BACKEND's spellings; None lets each call's tensors decide.
_SPELLINGS: dict[str, Backend | None] = {
    "": None, "auto": None, "cuda": Backend.CUDA, "gpu": Backend.CUDA,
    "interpreter": Backend.INTERPRETER, "cpu-interpreter": Backend.INTERPRETER, "cpu": Backend.INTERPRETER,
}


class BackendError(TiledispatchError, ValueError):
    """TILEDISPATCH_BACKEND names no backend."""


def installed_version(name: str) -> str | None:
    """Package `name`'s installed version from its metadata (nothing is imported), None where it is
    not installed: what results record of the software they ran on."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def triton_interprets() -> bool:
    """Whether TRITON_INTERPRET asks Triton to decorate kernels for its interpreter only."""
    return os.environ.get(ENV_TRITON_INTERPRET, "").strip().lower() in ("1", "true", "on", "yes")


def forced_backend() -> Backend | None:
    """The backend TILEDISPATCH_BACKEND (or TRITON_INTERPRET=1) forces, None where the tensors decide."""
    raw = os.environ.get(ENV_BACKEND, "")
    try:
        forced = _SPELLINGS[raw.strip().lower()]
    except KeyError:
        raise BackendError(f"{ENV_BACKEND}={raw!r} names no backend; use 'interpreter' (the CPU), 'cuda' "
                           "or 'auto' (each call's tensors decide)") from None
    if forced is None and triton_interprets():
        return Backend.INTERPRETER
    return forced


def default_backend() -> Backend:
    """The backend where no tensor decides (the CLI's operands, `current_arch`): the forced one,
    else the GPU where there is one, else the interpreter."""
    forced = forced_backend()
    if forced is not None:
        return forced
    return Backend.CUDA if _gpu_present() else Backend.INTERPRETER


@functools.lru_cache(maxsize=1)
def _gpu_present() -> bool:
    """Whether torch sees a GPU: asked once, as `default_backend` runs on calls without a tensor."""
    import torch

    return torch.cuda.is_available()


# The process's default, under the name the CLI and the ops read.
current_backend = default_backend


def backend_for(device: Any) -> Backend:
    """The backend that runs kernels on tensors on `device` (a torch.device or its name)."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cpu":
        natural = Backend.INTERPRETER
    elif kind == "cuda":
        natural = Backend.CUDA
    else:
        raise InvalidProblemError(f"tensors are on {device}; tiledispatch runs kernels on CUDA tensors "
                                  "(compiled) or CPU tensors (Triton's interpreter): move them to the CPU or a GPU")
    forced = forced_backend()
    if forced is not None and forced is not natural:
        why = (f"{ENV_BACKEND}={os.environ.get(ENV_BACKEND)}" if os.environ.get(ENV_BACKEND, "").strip()
               else f"{ENV_TRITON_INTERPRET}=1")
        raise InvalidProblemError(f"tensors are on {device}, but {why} runs kernels on {forced.device} tensors only: "
                                  f"move them to {forced.device}, or unset {ENV_BACKEND} to let the tensors decide")
    return natural


def check_device(device: Any, arch) -> Backend:
    """The backend of a call on `device`, refused where the dispatcher selects for the other one."""
    backend = backend_for(device)
    if (backend is Backend.INTERPRETER) != arch.is_interpreter:
        want = "interpreter" if backend is Backend.INTERPRETER else "a GPU arch (sm_90, ...)"
        raise InvalidProblemError(
            f"tensors are on {device}, which runs kernels on {backend.value}, but the dispatcher selects kernels "
            f"for {arch.name}: pass dispatcher=None, or a Dispatcher made for {want}")
    return backend


def current_arch(backend: Backend | None = None):
    """The arch kernels are selected for on `backend` (default: `default_backend`): the
    interpreter target, or the GPU's (TILEDISPATCH_ARCH overrides it; the interpreter's where
    there is no GPU). A forced backend does not change CUDA's arch: it refuses CUDA tensors."""
    from .. import arch

    if (backend or default_backend()) is Backend.INTERPRETER:
        return arch.load(arch.INTERPRETER)
    named = os.environ.get(arch.ENV_ARCH, "").strip()
    if named:
        return arch.load(named)
    import torch

    return arch.detect() if torch.cuda.is_available() else arch.load(arch.INTERPRETER)


# Triton's interpreter swaps `triton.language`'s functions for its own while a kernel runs
# and puts them back after, module-wide: two kernels interpreted at once in one process see
# each other's swaps undone ("Did you forget to add @triton.jit"), and a kernel compiled
# meanwhile would be built from the interpreter's functions. Every interpreted launch, every
# compile and every hash of a kernel's source holds this lock; reentrant, so that a launch
# made while holding it (a debugging aid calling a kernel) does not deadlock. Read it as
# `runtime.INTERPRETER_LOCK` at each use: a forked child takes a fresh one.
INTERPRETER_LOCK = threading.RLock()


def interpreting(device: Any = None):
    """The context a Triton launch outside the dispatcher runs in (`kernel[grid](...)`): on the
    interpreter (for tensors on `device`, default: the default backend's), an `interpreter_session`;
    on a GPU the lock alone, since Triton's JIT may compile there."""
    backend = default_backend() if device is None else backend_for(device)
    if backend is Backend.INTERPRETER:
        return interpreter_session()
    return INTERPRETER_LOCK


def _fresh_interpreter_lock() -> None:
    """A child forked while another thread of its parent ran a kernel would inherit the lock
    held by a thread it does not have, and wait for it forever."""
    global INTERPRETER_LOCK
    INTERPRETER_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_fresh_interpreter_lock)


# -- running JITFunctions under the interpreter ------------------------------------------
# `triton.jit` makes a JITFunction unless TRITON_INTERPRET is set when it decorates, and
# Triton's InterpretedFunction runs a plain Python kernel but calls its callees as they are:
# a JITFunction callee (a helper, `tl.cdiv`, `tl.max`, `x.sum()`) refuses to be called outside
# a compiled kernel. A session makes those calls interpreted ones for the thread that holds
# it, patches `triton.language` and `triton.language.core` once for its whole length (Triton's
# own patching at each launch and each callee's call, which repeats it, is skipped for that
# thread), and puts everything back when its outermost level ends.
class _Session(threading.local):
    depth = 0


_SESSION = _Session()
_INTERPRETED: dict[int, tuple[Any, Any]] = {}  # id(JITFunction) -> (it, its InterpretedFunction)


def interpreted(fn: Any) -> Any:
    """`fn`'s InterpretedFunction: `fn` itself where Triton made one (TRITON_INTERPRET=1)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        return fn
    known = _INTERPRETED.get(id(fn))  # by id: a JITFunction's hash walks its source's globals
    if known is None or known[0] is not fn:
        known = _INTERPRETED[id(fn)] = (fn, InterpretedFunction(fn.fn))
    return known[1]


@functools.cache
def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run in this environment, or None: Triton 3.6's interpreter
    fails inside its kernels with numpy 2.3 or later ("only 0-dimensional arrays can be converted
    to Python scalars")."""
    import numpy
    import triton

    triton_version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    numpy_version = tuple(int(p) for p in numpy.__version__.split(".")[:2])
    if triton_version <= (3, 6) and numpy_version >= (2, 3):
        return (f"Triton {triton.__version__}'s CPU interpreter needs numpy < 2.3, and this environment has numpy "
                f"{numpy.__version__}: move the tensors to the GPU, or install 'numpy<2.3'")
    return None


@contextlib.contextmanager
def interpreter_session():
    """Holds INTERPRETER_LOCK; inside, the holding thread's JITFunctions run under the interpreter
    (refused, saying why, where the interpreter cannot run here)."""
    problem = interpreter_problem()
    if problem is not None:
        raise UnsupportedError(problem)
    with INTERPRETER_LOCK:
        if _SESSION.depth:
            _SESSION.depth += 1
            try:
                yield
            finally:
                _SESSION.depth -= 1
            return
        scopes = _enter_session()
        _SESSION.depth = 1
        try:
            yield
        finally:
            _SESSION.depth = 0
            for scope in reversed(scopes):
                scope.restore()


def _enter_session() -> tuple[Any, ...]:
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    calls = interpreter._LangPatchScope()
    owner = threading.get_ident()
    plain_call, plain_run = JITFunction.__call__, JITFunction.run

    def call(self, *args, **kwargs):  # a callee, inside an interpreted kernel
        if threading.get_ident() != owner:
            return plain_call(self, *args, **kwargs)
        return interpreted(self)(*args, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):  # `kernel[grid](...)`
        if threading.get_ident() != owner:
            return plain_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        return interpreted(self).run(*args, grid=grid, warmup=warmup, **kwargs)

    calls.set_attr(JITFunction, "__call__", call)
    calls.set_attr(JITFunction, "run", run)
    for name, member in list(vars(tl.core.tensor).items()):
        if isinstance(member, JITFunction):  # `x.sum()`: a method bound to the tensor
            calls.set_attr(tl.core.tensor, name, lambda self, *a, _member=member, **k: _member(self, *a, **k))

    def lang():  # both modules visible, so `_patch_lang` patches both
        pass

    both = type(lang)(lang.__code__, {"tl": tl, "core": tl.core})
    inherited = _Inherited(tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base)
    patched = interpreter._patch_lang(both)
    plain_patch = interpreter._patch_lang

    def patch_lang(fn):  # a launch's or a callee's patch: what the session's has done already
        if threading.get_ident() != owner:
            return plain_patch(fn)
        return interpreter._LangPatchScope()

    # Triton patches the language again at each call of a callee (inspect.getmembers of three
    # modules a call): half the interpreter's time on a conv kernel of many small helpers.
    calls.set_attr(interpreter, "_patch_lang", patch_lang)
    return inherited, calls, patched


class _Inherited:
    """Undoes what a patch scope's restore leaves: an attribute a class only inherited (tensor's
    `__str__`) is put back as one of its own; removed, the class is as it was."""

    def __init__(self, *classes: type) -> None:
        self._before = [(cls, set(vars(cls))) for cls in classes]

    def restore(self) -> None:
        for cls, names in self._before:
            for name in set(vars(cls)) - names:
                delattr(cls, name)
