"""What the dispatchers select while a piece of code runs: the studies' view of a call's picks."""

from __future__ import annotations

from typing import Any, Callable


def selections(fn: Callable[[], Any]) -> list[str]:
    """The kernels every dispatcher selects while `fn` runs once, in order (a first sight of a
    problem selects; a call replayed from a memo does not). Not thread-safe: it wraps
    `Dispatcher.select` for the process while `fn` runs."""
    from ..core import dispatcher as dispatcher_module

    picked, select = [], dispatcher_module.Dispatcher.select

    def spy(self, problem, *, device=None):
        spec = select(self, problem, device=device)
        picked.append(spec.name)
        return spec
    dispatcher_module.Dispatcher.select = spy
    try:
        fn()
    finally:
        dispatcher_module.Dispatcher.select = select
    return picked
