"""What every problem set shares: its definition, the request it answers and the collector of problems.

A set's generator poses each problem as a real call would, through the op's own
`check_operands` on shape-only (meta) tensors, so a problem's `key()` is the one the
dispatcher builds from real tensors of that shape and layout. A combination the op refuses
(fp8 attention at head dim 80, say) is recorded in the collector with the op's reason,
never dropped unseen.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.errors import TiledispatchError, UnsupportedError


@dataclass(frozen=True)
class Request:
    """What a generator is asked for: one dtype (the op's spelling), one direction (the op's value), a seed."""

    dtype: str
    direction: str
    seed: int = 0


@dataclass(frozen=True)
class Refusal:
    """A combination the generator tried and the op refused: what it was and the op's reason."""

    what: str
    reason: str


@dataclass
class Collector:
    """The problems a generator poses, in order, and the combinations the op refused."""

    problems: list = field(default_factory=list)
    refused: list = field(default_factory=list)

    def pose(self, what: str, build: Callable[[], Any]) -> None:
        """Adds `build()`'s problem, or records the op's refusal of it under `what`."""
        try:
            self.problems.append(build())
        except TiledispatchError as e:
            self.refused.append(Refusal(what, str(e)))


@dataclass(frozen=True)
class ProblemSet:
    """A named set: its op, the directions and dtypes it is meant for, and its generator.

    `generate(request, collector)` poses the set's problems for one dtype and direction;
    the order it poses them in is the set's order.
    """

    name: str
    op: str
    directions: tuple[str, ...]
    dtypes: tuple[str, ...]
    description: str
    generate: Callable[[Request, Collector], None]
    forward_only: tuple[str, ...] = ()  # dtypes the op runs forward only (fp8 attention: inference)

    def directions_of(self, dtype: str, direction: str | None) -> tuple[str, ...]:
        """The directions a request of `dtype` covers: `direction` (checked), or every one the dtype has."""
        usable = self.directions[:1] if dtype in self.forward_only else self.directions
        if direction is None:
            return usable
        if direction not in usable:
            raise UnsupportedError(f"problem set {self.name!r} in {dtype} takes direction one of "
                                   f"{', '.join(usable)}; got {direction!r}")
        return (direction,)

    def check_dtype(self, dtype: str) -> str:
        if not isinstance(dtype, str) or dtype.lower() not in self.dtypes:
            raise UnsupportedError(f"problem set {self.name!r} takes dtype one of {', '.join(self.dtypes)}; "
                                   f"got {dtype!r}")
        return dtype.lower()


# A random set draws at most this many shapes per problem it keeps: shapes past its FLOP cap are
# drawn again, and a dtype the op refuses at every shape ends the set instead of looping.
ATTEMPTS = 50


def log_uniform_int(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high] whose logarithm is uniform: as many small sizes as large ones."""
    return min(high, max(low, int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))))


def rng_for(request: Request, name: str) -> random.Random:
    """The seeded generator of a random set: the same seed, name and dtype give the same shapes everywhere."""
    return random.Random(f"{name}:{request.dtype}:{request.direction}:{request.seed}")
