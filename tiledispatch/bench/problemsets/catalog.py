"""The named problem sets, and the one way to ask for one: `problem_set(name, dtype=..., ...)`.

A set's problems come in the order its generator poses them (model by model, layer by
layer, size by size), each problem once. `max_flops` keeps the problems at or below a
size, `limit` a seeded sample of them (kept in set order), so the same arguments give the
same problems on every machine.
"""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import dataclass

from ...core.errors import InvalidArgumentError, UnsupportedError
from . import attention, conv, gemm
from .base import Collector, ProblemSet, Refusal, Request

LOG = logging.getLogger(__name__)

SETS: dict[str, ProblemSet] = {s.name: s for s in (*gemm.SETS, *conv.SETS, *attention.SETS)}

# Direction spellings beside each op's own values: the words and the selection key's.
_DIRECTION_ALIASES = {
    "gemm": {"fwd": "forward"},
    "conv": {"fwd": "forward", "backward_data": "bwd_data", "backward_weight": "bwd_weight"},
    "attention": {"forward": "fwd", "backward": "bwd"},
}


@dataclass(frozen=True)
class Built:
    """A set's problems for one request, and the combinations its op refused (with the op's reasons)."""

    name: str
    problems: tuple
    refused: tuple[Refusal, ...]


def available() -> tuple[str, ...]:
    """The names of every problem set, sorted."""
    return tuple(sorted(SETS))


def get(name: str) -> ProblemSet:
    """The set called `name`; an unknown name lists the available ones."""
    if not isinstance(name, str) or name not in SETS:
        raise UnsupportedError(f"unknown problem set {name!r}; use one of: {', '.join(available())}")
    return SETS[name]


def canonical_direction(op: str, directions: tuple[str, ...], direction: str | None) -> str | None:
    """`direction` in the op's own spelling (the issue's words and the selection key's taken too)."""
    if direction is None:
        return None
    if not isinstance(direction, str):
        raise InvalidArgumentError(f"direction must be a string such as {directions[0]!r} or None (every "
                                   f"direction), got {direction!r}")
    text = direction.lower()
    return _DIRECTION_ALIASES[op].get(text, text)


def _checked_count(value, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative integer or None, got {value!r}")
    return value


@functools.lru_cache(maxsize=64)
def _generated(name: str, dtype: str, direction: str, seed: int) -> tuple[tuple, tuple[Refusal, ...]]:
    collector = Collector()
    SETS[name].generate(Request(dtype, direction, seed), collector)
    return tuple(dict.fromkeys(collector.problems)), tuple(collector.refused)


def build(name: str, *, dtype: str, direction: str | None = None, limit: int | None = None, seed: int = 0,
          max_flops: float | None = None) -> Built:
    """`problem_set`'s problems with the combinations the op refused beside them."""
    spec = get(name)
    dtype = spec.check_dtype(dtype)
    directions = spec.directions_of(dtype, canonical_direction(spec.op, spec.directions, direction))
    limit = _checked_count(limit, "limit")
    seed = _checked_count(seed, "seed")
    if max_flops is not None and (isinstance(max_flops, bool) or not isinstance(max_flops, (int, float))
                                  or not max_flops > 0):
        raise InvalidArgumentError(f"max_flops must be a positive number or None, got {max_flops!r}")
    problems, refused = [], []
    for d in directions:
        posed, refusals = _generated(name, dtype, d, seed)
        problems += posed
        refused += refusals
    problems = list(dict.fromkeys(problems))
    if max_flops is not None:
        problems = [p for p in problems if p.flops() <= max_flops]
    if limit is not None and limit < len(problems):
        keep = sorted(random.Random(f"{name}:limit:{seed}").sample(range(len(problems)), limit))
        problems = [problems[i] for i in keep]
    if refused:
        LOG.info("problem set %s (%s): the op refused %d combinations, e.g. %s: %s", name, dtype, len(refused),
                 refused[0].what, refused[0].reason)
    return Built(name, tuple(problems), tuple(refused))


def problem_set(name: str, *, dtype: str, direction: str | None = None, limit: int | None = None, seed: int = 0,
                max_flops: float | None = None) -> tuple:
    """The problems of set `name` in `dtype`, for one direction or (None) every direction of the set.

    Deterministic: the same arguments give the same problems in the same order on every
    machine (`seed` picks random sets' shapes and `limit`'s sample). `max_flops` drops
    problems above that many FLOPs before `limit` samples. Combinations the op itself
    refuses are left out; `build` lists them with the op's reasons.
    """
    return build(name, dtype=dtype, direction=direction, limit=limit, seed=seed, max_flops=max_flops).problems
