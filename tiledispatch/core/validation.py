"""Validation results: what a config breaks, how badly, and how to fix it.

Every op validates its configs with one predicate (`validate(config, arch)`), used
alike by the rule sets, the registry, the dispatcher, the auto-corrector and the tests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .errors import InvalidConfigError


class Severity(enum.Enum):
    ERROR = "error"  # the kernel would not compile, not run, or compute a wrong answer
    WARNING = "warning"  # it runs and is right, but is likely slow


@dataclass(frozen=True)
class Finding:
    """One broken rule. `rule` is the op's rule enum member; `fix` says what would work."""

    rule: enum.Enum
    severity: Severity
    message: str
    fix: str | None = None

    def __str__(self) -> str:
        text = f"[{self.rule.value}] {self.message}"
        return f"{text} (fix: {self.fix})" if self.fix else text


@dataclass(frozen=True)
class ValidationResult:
    findings: tuple[Finding, ...] = ()

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.WARNING)

    @property
    def ok(self) -> bool:
        return not self.errors

    def broken_rules(self) -> frozenset[enum.Enum]:
        return frozenset(f.rule for f in self.errors)

    def raise_if_invalid(self, what: str) -> None:
        if not self.ok:
            lines = "\n  ".join(str(f) for f in self.errors)
            raise InvalidConfigError(f"{what} is invalid:\n  {lines}")


@dataclass(frozen=True)
class Correction:
    """One field that auto-correction changed, and the rules that made it change."""

    field: str
    old: Any
    new: Any
    rules: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.field}: {self.old} -> {self.new} ({', '.join(self.rules)})"
