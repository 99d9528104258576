"""Integer helpers the plans and rankings use, without importing Triton (whose import costs a
fifth of a second, and which `import tiledispatch` leaves to the first kernel launch or build)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b: the number of b-sized blocks covering a."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two at least n, for n >= 1."""
    return 1 << (n - 1).bit_length()
