"""Where kernels run: on a CUDA GPU, or on the CPU under Triton's interpreter.

The choice is made once per process, before any kernel module is imported, because
``@triton.jit`` reads TRITON_INTERPRET when a kernel is decorated.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import sys
import threading


class Backend(enum.Enum):
    CUDA = "cuda"
    INTERPRETER = "cpu-interpreter"

    @property
    def device(self) -> str:
        return "cuda" if self is Backend.CUDA else "cpu"


def choose_backend() -> None:
    """Runs at ``import tiledispatch``, before Triton is imported: with no GPU, the interpreter.

    Triton decorates its own library (``tl.cdiv`` and friends) at import time too, so the
    choice cannot wait until the first kernel runs.
    """
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        if "triton.language" in sys.modules:
            raise RuntimeError(
                "tiledispatch must be imported before triton on a machine without a GPU "
                "(or set TRITON_INTERPRET=1), so that Triton's interpreter is used"
            )
        os.environ["TRITON_INTERPRET"] = "1"


@functools.lru_cache(maxsize=1)
def current_backend() -> Backend:
    """TRITON_INTERPRET=1 (set by `choose_backend` when there is no GPU) means the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return Backend.INTERPRETER
    return Backend.CUDA


# Triton's interpreter swaps `triton.language`'s functions for its own while a kernel runs
# and puts them back after, module-wide: two kernels interpreted at once in one process see
# each other's swaps undone ("Did you forget to add @triton.jit"). Every interpreted launch
# holds this lock; reentrant, so that a launch made while holding it (a debugging aid
# calling a kernel) does not deadlock. Read it as `runtime.INTERPRETER_LOCK` at each use:
# a forked child takes a fresh one.
INTERPRETER_LOCK = threading.RLock()


def interpreting():
    """The context every launch of a kernel under Triton's interpreter runs in: one at a time.

    On a GPU there is nothing to serialise, and the lock is not taken.
    """
    if current_backend() is Backend.INTERPRETER:
        return INTERPRETER_LOCK
    return contextlib.nullcontext()


def _fresh_interpreter_lock() -> None:
    """A child forked while another thread of its parent ran a kernel would inherit the lock
    held by a thread it does not have, and wait for it forever."""
    global INTERPRETER_LOCK
    INTERPRETER_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_fresh_interpreter_lock)


def current_arch():
    """The arch kernels are selected for: the interpreter target unless a GPU runs them."""
    from .. import arch

    if current_backend() is Backend.INTERPRETER:
        return arch.load(arch.INTERPRETER)
    return arch.current()
