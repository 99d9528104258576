"""Checked reading of the scalar arguments of the public functions.

Each reader names the argument in its error and says what would work. Python and NumPy
scalars of the right kind are accepted (``np.int64(2)`` is an integer); anything that
would be silently converted with a loss (a float where an int is meant, ``'no'`` where a
bool is meant, a complex number) is refused.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

INT64_MAX = 2**63 - 1


def _is_integral(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def as_int(value: Any, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """`value` as a Python int in [low, high]; bools, floats and strings are refused."""
    if hasattr(value, "__index__") and not isinstance(value, bool) and not _is_integral(value):
        try:  # a 0-d integer tensor or another integer-like object
            value = value.__index__()
        except (TypeError, ValueError, RuntimeError):
            pass
    if not _is_integral(value):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if low is not None and value < low:
        raise InvalidArgumentError(f"{name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise InvalidArgumentError(f"{name} must be at most {high}, got {value}")
    return value


def as_bool(value: Any, name: str) -> bool:
    """True or False (a NumPy bool too); 'no', 0 and None are refused rather than guessed at."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidArgumentError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def as_float(value: Any, name: str, *, low: float | None = None, high: float | None = None,
             low_open: bool = False) -> float:
    """A finite real number in [low, high] (or (low, high] with `low_open`); strings, complex
    numbers and bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise InvalidArgumentError(f"{name} must be {'above' if low_open else 'at least'} {low}, got {value}")
    if high is not None and value > high:
        raise InvalidArgumentError(f"{name} must be at most {high}, got {value}")
    return value


def as_int_tuple(value: Any, name: str, length: int, *, low: int | None = None,
                 high: int | None = None) -> tuple[int, ...]:
    """One integer for every dim, or a sequence of exactly `length` integers."""
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(
            f"{name} must be an integer or {length} integers, got the string {value!r}")
    if isinstance(value, Sequence) or (hasattr(value, "__len__") and hasattr(value, "__iter__")
                                       and not hasattr(value, "__index__")):
        items = list(value)
        if len(items) != length:
            raise InvalidArgumentError(f"{name} has {len(items)} values; give one integer or {length}")
        return tuple(as_int(v, f"{name}[{i}]", low=low, high=high) for i, v in enumerate(items))
    return (as_int(value, name, low=low, high=high),) * length


def as_kernel_name(value: Any, name: str = "kernel") -> str | None:
    """A kernel given by name (or a KernelSpec, by its name); None means 'select one'."""
    if value is None or isinstance(value, str):
        return value
    spec_name = getattr(value, "name", None)
    if isinstance(spec_name, str) and hasattr(value, "config"):
        return spec_name
    raise InvalidArgumentError(
        f"{name} must be a kernel name (a str, see `tiledispatch registry list`) or a KernelSpec, "
        f"got {value!r} ({type(value).__name__})")
