"""The kernel family: the unit of extension inside an op.

An op keeps what all its kernels share (the problem, the operands, the reference, the rule-set
registry, the public function). Everything particular to one family of kernels lives in one
module under ``ops/<op>/families/``, which builds one `KernelFamily` and registers it in its op's
`FamilyTable`: the config type, the validity rules and the support check, the ranking terms, the
units it compiles and its launch plan. The op's shared code asks the table for a config's family
and calls it; it holds no switch over families, so adding one is a family module, its kernel file
and a rule-set entry.

`nearest_valid` is the auto-corrector's search, written once for every op and family: the family
only says which fields it may move and to what (`CorrectionSpace`).
"""

from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import InvalidConfigError
from .validation import Correction, Finding

# Configs whose family a table remembers (the gemm `full` rule set holds some 31k); past it, it
# starts afresh rather than grow with configs made anew for each call (read from JSON, say).
FOUND_KEPT = 1 << 16


@dataclass(frozen=True)
class CorrectionSpace:
    """What auto-correction may change in a config: `base` is the config with its non-tunable
    fields already put right, `choices` the values each tunable field may take (in the order that
    breaks ties), `weights` how much moving each field by a power of two costs (1 where absent)."""

    base: Any
    choices: Mapping[str, Sequence[int]]
    weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelFamily:
    """One family of kernels of one op, as the op's shared code sees it.

    Every callable takes the family's own config type. `validate` yields the family's findings
    (the op's shared rules run before it); `correction` gives the space auto-correction searches,
    or None where nothing can be tuned (the vendor); `supports` says why a config cannot compute a
    problem, or None; `score` is the ranking (a `core.op.Score`); `kernel_units` what to compile
    for a specialisation on an arch; `plan` the launches over checked operands.
    """

    op: str  # the op's name, e.g. "conv"
    name: str  # the family's name as configs spell it, e.g. "igemm"
    config_type: type
    validate: Callable[[Any, Any], Iterable[Finding]]  # (config, arch)
    supports: Callable[[Any, Any], str | None]  # (config, problem)
    score: Callable[..., Any]  # (config, problem, arch) -> Score
    kernel_units: Callable[..., tuple]  # (config, specialization, arch) -> tuple[KernelUnit, ...]
    plan: Callable[[Any, Any], Any]  # (config, operands) -> core.launch.Plan
    correction: Callable[[Any], CorrectionSpace | None] = lambda config: None  # (config) -> space


class FamilyTable:
    """An op's registered families, found by the name `key(config)` gives (a config's family)."""

    def __init__(self, op: str, key: Callable[[Any], str]) -> None:
        self.op = op
        self._key = key
        self._families: dict[str, KernelFamily] = {}
        self._found: dict[int, tuple[Any, KernelFamily]] = {}  # id(config) -> (config, its family)
        self._lock = threading.Lock()

    def register(self, family: KernelFamily) -> KernelFamily:
        """Makes `family` known; registering one name twice with another definition is a bug."""
        if family.op != self.op:
            raise ValueError(f"family {family.name!r} is of op {family.op!r}, not {self.op!r}")
        with self._lock:
            known = self._families.get(family.name)
            if known is not None and known is not family:
                raise ValueError(f"{self.op} family {family.name!r} is registered already")
            self._families[family.name] = family
        return family

    def of(self, config: Any) -> KernelFamily:
        """The family that owns `config`; a config of an unregistered family is refused by name.

        Found once per config object: a problem's ranking asks for each candidate's family a few
        times (its refusals, scores and host cost), and a registry's configs live as long as it."""
        entry = self._found.get(id(config))
        if entry is not None and entry[0] is config:
            return entry[1]
        family = self._lookup(config)
        if len(self._found) >= FOUND_KEPT:
            self._found.clear()
        self._found[id(config)] = (config, family)
        return family

    def _lookup(self, config: Any) -> KernelFamily:
        name = self._key(config)
        family = self._families.get(name)
        if family is None or not isinstance(config, family.config_type):
            known = ", ".join(sorted(self._families)) or "none"
            raise InvalidConfigError(f"no {self.op} kernel family {name!r} takes a {type(config).__name__} "
                                     f"(registered: {known})")
        return family

    def names(self) -> tuple[str, ...]:
        return tuple(self._families)

    def __iter__(self):
        return iter(tuple(self._families.values()))


def _distance(config: Any, candidate: Any, space: CorrectionSpace) -> float:
    total = 0.0
    for name in space.choices:
        moved = abs(math.log2(getattr(candidate, name)) - math.log2(max(getattr(config, name), 1)))
        total += space.weights.get(name, 1) * moved
    return total


def nearest_valid(config: Any, space: CorrectionSpace, is_valid: Callable[[Any], bool]) -> Any | None:
    """The valid config of `space` fewest (weighted) powers of two from `config`; ties go to the
    first in the product of `space.choices`. None where no choice is valid."""
    best, best_distance = None, math.inf
    names = tuple(space.choices)
    for values in itertools.product(*space.choices.values()):
        candidate = replace(space.base, **dict(zip(names, values)))
        distance = _distance(config, candidate, space)
        if distance < best_distance and is_valid(candidate):
            best, best_distance = candidate, distance
    return best


def auto_correct(config: Any, arch: Any, *, validate: Callable[[Any, Any], Any], semantic: frozenset,
                 space: CorrectionSpace | None, fields: Sequence[str]) -> tuple[Any, tuple[Correction, ...]]:
    """The valid config nearest to `config`, and what changed in `fields`.

    Rules in `semantic` are about what is computed (dtypes, accumulation, direction): no tile
    change mends them, so breaking one raises InvalidConfigError naming it, as does a config with
    nothing to tune (`space` None) or no valid config in its space.
    """
    result = validate(config, arch)
    if result.ok:
        return config, ()
    broken = result.broken_rules() & semantic
    if broken or space is None:
        broken = broken or result.broken_rules()
        raise InvalidConfigError(f"{config.name} cannot be corrected on {arch.name}: "
                                 + "; ".join(str(f) for f in result.errors if f.rule in broken))
    best = nearest_valid(config, space, lambda candidate: validate(candidate, arch).ok)
    if best is None:
        raise InvalidConfigError(f"no valid config near {config.name} on {arch.name}: {result.errors[0]}")
    rules = tuple(sorted(r.value for r in result.broken_rules()))
    return best, tuple(Correction(name, getattr(config, name), getattr(best, name), rules)
                       for name in fields if getattr(config, name) != getattr(best, name))
