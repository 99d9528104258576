"""Frozen dataclasses to JSON and back, driven by their type hints.

Configs and problems are nested frozen dataclasses of ints, bools, enums and tuples;
this module is the one place that turns them into JSON-able dicts and back, and it
refuses data that does not fit the type (a registry file is untrusted input).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(x) for x in obj]
    return obj


def _closest_dataclass(options: tuple, data: dict) -> type:
    """The option whose fields best match the keys of `data`, so that its error is the one reported.

    Options with the same fields (two configs of one signature, told apart by their family)
    are told apart by the enum defaults that `data` repeats.
    """

    def mismatch(option) -> tuple[int, int]:
        names = {f.name for f in dataclasses.fields(option) if f.init}
        differing = sum(1 for f in dataclasses.fields(option)
                        if f.name in data and isinstance(f.default, enum.Enum) and f.default.value != data[f.name])
        return len(set(data) ^ names), differing

    return min(options, key=mismatch)


def from_jsonable(tp: Any, data: Any, where: str = "value") -> Any:
    """Builds an instance of `tp` from JSON data; raises ValueError naming the bad field."""
    origin = typing.get_origin(tp)
    options = typing.get_args(tp) if origin in (typing.Union, types.UnionType) else ()
    if options and all(dataclasses.is_dataclass(o) for o in options):
        chosen = _closest_dataclass(options, data) if isinstance(data, dict) else options[0]
        return from_jsonable(chosen, data, where)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(tp):
            try:
                return from_jsonable(option, data, where)
            except (ValueError, TypeError) as e:
                errors.append(str(e))
        raise ValueError(f"{where}: {data!r} fits none of {tp}")
    if tp is type(None):
        if data is not None:
            raise ValueError(f"{where}: expected null, got {data!r}")
        return None
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object for {tp.__name__}, got {type(data).__name__}")
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)} for {tp.__name__}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ValueError(f"{where}: missing field {f.name!r} of {tp.__name__}")
                continue
            kwargs[f.name] = from_jsonable(hints[f.name], data[f.name], f"{where}.{f.name}")
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise ValueError(f"{where}: {data!r} is not one of {allowed}") from None
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list, got {type(data).__name__}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return tuple(from_jsonable(item, x, f"{where}[{i}]") for i, x in enumerate(data))
    if tp is bool:
        if not isinstance(data, bool):
            raise ValueError(f"{where}: expected true/false, got {data!r}")
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise ValueError(f"{where}: expected an integer, got {data!r}")
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"{where}: expected a number, got {data!r}")
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            raise ValueError(f"{where}: expected a string, got {data!r}")
        return data
    return data
