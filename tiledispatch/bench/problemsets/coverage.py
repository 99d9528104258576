"""Which problems of a set only the vendor library takes: kept in the set, and said so.

A problem that no Triton or Gluon kernel of a rule set supports is still a problem users pose
(the dispatcher runs the vendor library on it), so sets keep it; a sweep of it times the
vendor alone. `vendor_only` names them, so that a sweep or a report can say how many.
"""

from __future__ import annotations

from typing import Any, Iterable

from ...core.op import RuleSet
from ...core.registry import Registry


def vendor_only(problems: Iterable[Any], arch, rule_set: RuleSet | str = RuleSet.FULL) -> tuple[Any, ...]:
    """The problems for which every candidate of `rule_set` on `arch` that supports them is the vendor's
    (or none does), in the order given. `arch` is an ArchInfo (`tiledispatch.arch.load("sm_90")`)."""
    problems = tuple(problems)
    registry = Registry.from_rule_sets(sorted({p.op.value for p in problems}), rule_set, arch)
    return tuple(p for p in problems
                 if all(spec.family == "vendor" for spec in registry.candidates(p.op, p)
                        if spec.definition.supports(spec.config, p) is None))
