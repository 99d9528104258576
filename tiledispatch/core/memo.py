"""Thread-safe memo tables: bounded by least recent use, each value made once per key.

A serving process sees an open-ended stream of shapes, so every per-problem memo of the
dispatcher is an `LruTable` of a fixed capacity: its memory is bounded however many
shapes go by, and the shapes in use stay in it. `get_or_make` is single flight: threads
that ask for one missing key at once wait for the one thread that makes its value,
while a thread asking for another key goes on, so a slow build of one kernel holds up
no call of another.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator

_MISSING = object()


@dataclass(eq=False)
class _Flight:
    """One value being made: who makes it, and what came of it once `done` is set."""

    maker: int  # the making thread's ident
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = _MISSING
    error: BaseException | None = None


class LruTable:
    """At most `capacity` entries (None: no bound), the least recently used dropped first.

    Every method takes one short lock, never held while a value is made. A read moves its
    entry to the most recent end, so a table keeps what is re-used rather than what came
    first.
    """

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"an LruTable holds at least one entry; capacity={capacity}")
        self.capacity = capacity
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._flights: dict[Hashable, _Flight] = {}
        self._lock = threading.Lock()
        _TABLES.add(self)

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                return default
            self._data.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._put(key, value)

    def _put(self, key: Hashable, value: Any) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if self.capacity is not None:
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)  # the least recently used

    def pop(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            return self._data.pop(key, default)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def get_or_make(self, key: Hashable, make: Callable[[], Any], *, share_errors: bool = False) -> Any:
        """The value of `key`, made by `make()` once however many threads ask at once.

        Where the maker fails, the threads waiting on it re-raise its error if `share_errors`
        (the failure belongs to the key: a kernel that does not build), or else each tries
        in turn (the failure may belong to the maker's own call: its tensors). A maker that
        asks for its own key again makes a second value rather than wait on itself.
        """
        # A hit needs no lock: each OrderedDict call is one step that no other thread's interleaves
        # (the GIL, or the dict's own lock without it), and a key dropped between the two is kept out.
        value = self._data.get(key, _MISSING)
        if value is not _MISSING:
            try:
                self._data.move_to_end(key)
            except KeyError:
                pass
            return value
        me = threading.get_ident()
        while True:
            with self._lock:
                value = self._data.get(key, _MISSING)
                if value is not _MISSING:
                    self._data.move_to_end(key)
                    return value
                flight = self._flights.get(key)
                if flight is None:
                    flight = self._flights[key] = _Flight(me)
                    break
            if flight.maker == me:
                return make()
            flight.done.wait()
            if flight.error is None:
                return flight.value  # whether or not the table still holds it
            if share_errors:
                raise flight.error
        return self._make(key, make, flight)

    def _make(self, key: Hashable, make: Callable[[], Any], flight: _Flight) -> Any:
        try:
            flight.value = make()
        except BaseException as e:
            flight.error = e
            raise
        finally:
            with self._lock:
                if flight.error is None:
                    self._put(key, flight.value)
                if self._flights.get(key) is flight:  # a child forked in `make` has none
                    del self._flights[key]
            flight.done.set()
        return flight.value

    # -- views (snapshots; they do not count as uses) -----------------------------------
    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._data.keys())

    def values(self) -> list[Any]:
        with self._lock:
            return list(self._data.values())

    def items(self) -> list[tuple[Hashable, Any]]:
        with self._lock:
            return list(self._data.items())

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys())

    def _after_fork(self) -> None:
        """A forked child has its parent's tables but only the forking thread: a lock or a
        flight of another thread would never be released there. Its values stay."""
        self._lock = threading.Lock()
        self._flights = {}


_TABLES: "weakref.WeakSet[LruTable]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for table in list(_TABLES):
        table._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
