"""The key of a Triton function's compiled code: Triton's own `cache_key`, the same in any process.

A JITFunction's `cache_key` hashes its source, its first line, the cache keys of every jit
function it calls (transitively, through its module's globals) and the constexpr globals
they read: a helper edited anywhere changes the key of every kernel that calls it, with no
list of modules to keep by hand.

Two things keep the live functions' own keys from serving as they are:
- Triton merges a callee's constexpr globals into its caller's key only where the callee's
  key was computed before the caller's, so the live key depends on what the process hashed
  first (a kernel launched directly, another unit's key). Here every callee's key is computed
  before its caller's, always: the key is the complete one, in every process.
- Under TRITON_INTERPRET=1, `triton.jit` makes InterpretedFunctions, which have no key (and a
  Gluon kernel's key fails on the interpreted helpers it calls). A process that imported the
  kernels so (a test reading what spawned builders cached) must find the key a compiling one
  computes.
So the key is computed on shadows: fresh JITFunctions over the same Python code, whose globals
are the module's with every jit function replaced by its shadow.
"""

from __future__ import annotations

import threading
import types
from typing import Any

_LOCK = threading.Lock()  # shadows are made and hashed one function at a time
_KEYS: dict[int, tuple[Any, str]] = {}  # id(function) -> (function, key): the function kept, so its id stays its own


def cache_key(fn: Any) -> str:
    """Triton's cache key of jit function `fn` (compiled or interpreted), callees hashed first.

    Hashing walks the source's references to `triton.language`, which an interpreted kernel
    patches while it runs: the walk holds the interpreter's lock."""
    from . import runtime

    with runtime.INTERPRETER_LOCK, _LOCK:
        known = _KEYS.get(id(fn))
        if known is not None and known[0] is fn:
            return known[1]
        shadow = _shadow(fn, {}, {})
        for callee in _callees_first(shadow, set()):
            callee.cache_key  # noqa: B018  (memoized on the shadow, with its globals, for its callers)
        _KEYS[id(fn)] = (fn, shadow.cache_key)
        return shadow.cache_key


def _is_jit(value: Any) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return isinstance(value, (InterpretedFunction, JITFunction))


def _shadow(fn: Any, made: dict[int, Any], scopes: dict[int, dict[str, Any]]) -> Any:
    """A JITFunction over `fn`'s Python code whose globals are `fn`'s, with every jit function
    among them replaced by its shadow (`made` holds those made so far: recursion ends there).

    The functions of one module share one shadow scope (`scopes`, by the module's globals), as
    they share one namespace: Triton's key lists a constexpr global once per namespace read."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    shadow = made.get(id(fn))
    if shadow is not None:
        return shadow
    raw = fn.fn
    # Triton adds a callee's `noinline` to its caller's key: the shadow keeps the decorator's value.
    noinline = fn.kwargs.get("noinline") if isinstance(fn, InterpretedFunction) else fn.noinline
    scope = scopes.get(id(raw.__globals__))
    fill = scope is None
    if fill:
        scope = scopes[id(raw.__globals__)] = {}
    clone = types.FunctionType(raw.__code__, scope, raw.__name__, raw.__defaults__, raw.__closure__)
    clone.__qualname__, clone.__module__ = raw.__qualname__, raw.__module__
    clone.__kwdefaults__, clone.__doc__ = raw.__kwdefaults__, raw.__doc__
    shadow = made[id(fn)] = JITFunction(clone, noinline=noinline)
    if fill:
        scope.update({name: _shadow(value, made, scopes) if _is_jit(value) else value
                      for name, value in raw.__globals__.items()})
    return shadow


def _callees_first(shadow: Any, seen: set[int]) -> list[Any]:
    """The jit functions `shadow` calls, transitively, each after those it calls (itself excluded)."""
    order = []
    for callee in _callees(shadow):
        if id(callee) not in seen:
            seen.add(id(callee))
            order += _callees_first(callee, seen)
            order.append(callee)
    return order


def _callees(shadow: Any) -> list[Any]:
    """The jit functions `shadow`'s source references, as Triton's dependency walk finds them."""
    import inspect

    from triton.runtime.jit import DependenciesFinder

    found: list[Any] = []

    class Recorder(DependenciesFinder):
        def _update_hash(self, func):  # records the callee instead of hashing it
            found.append(func)

    nonlocals = inspect.getclosurevars(shadow.fn).nonlocals
    recorder = Recorder(name=shadow._fn_name, globals=shadow.__globals__, nonlocals=nonlocals, src=shadow.src)
    recorder.visit(shadow.parse())
    return found
