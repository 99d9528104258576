"""Integer helpers the plans and rankings use, without importing Triton (whose import costs a
fifth of a second, and which `import tiledispatch` leaves to the first kernel launch or build)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b: the number of b-sized blocks covering a."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two at least n, for n >= 1."""
    return 1 << (n - 1).bit_length()


def rank_bucket(n: int, exact: int = 64, per_octave: int = 8) -> int:
    """The largest size of n's ranking bucket: sizes up to `exact` are their own; above, each octave
    [2**j, 2**(j+1)) is cut into `per_octave` equal buckets (`OpDefinition.ranking_problem`)."""
    if n <= exact:
        return n
    step = (1 << (n.bit_length() - 1)) // per_octave
    return cdiv(n, step) * step
