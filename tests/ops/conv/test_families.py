"""Every conv kernel family is registered: one family module each (ops/conv/families/), found by its
configs' `family`, so the op's shared rules, ranking and plan reach every kernel the rule sets name."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path

import pytest

from tiledispatch.core.errors import InvalidConfigError
from tiledispatch.core.op import RuleSet
from tiledispatch.ops.conv import Direction, Family
from tiledispatch.ops.conv.config import AnyConvConfig
from tiledispatch.ops.conv.plan import kernel_units
from tiledispatch.ops.conv.rulesets import RULE_SETS
from tiledispatch.ops.conv.signature import FAMILIES

from ..family_switches import family_switches


@pytest.fixture(scope="module")
def full():
    return list(RULE_SETS[RuleSet.FULL]())


def test_every_family_member_has_a_registered_family():
    assert sorted(FAMILIES.names()) == sorted(f.value for f in Family)


def test_family_names_are_unique_and_the_tables_keys():
    families = list(FAMILIES)
    assert len({f.name for f in families}) == len(families)
    assert all(f.op == "conv" for f in families)


def test_every_config_type_has_a_registered_family():
    types = set(typing.get_args(AnyConvConfig))
    assert types == {f.config_type for f in FAMILIES}


def test_every_config_of_the_full_rule_set_resolves_to_its_family(full):
    """Rule sets are arch-independent (the registry drops what an arch cannot run), so one pass
    over `full` covers every arch."""
    seen = set()
    for config in full:
        family = FAMILIES.of(config)
        assert family.name == config.family.value and isinstance(config, family.config_type), config.name
        seen.add(family.name)
    assert seen == set(FAMILIES.names())


def test_an_unregistered_family_is_refused_by_name(full):
    config = next(c for c in full if c.family is Family.DIRECT)

    class Unknown:  # a config of no registered family, under a registered family's name
        family = Family.DIRECT
        name = "unknown"

    with pytest.raises(InvalidConfigError, match="registered: .*direct"):
        FAMILIES.of(Unknown())
    assert FAMILIES.of(config).name == "direct"


def test_every_kernel_unit_names_a_function_that_exists():
    """One default config of each family and direction: its units' module and function import."""
    firsts = {}
    for config in RULE_SETS[RuleSet.DEFAULT]():
        firsts.setdefault((config.family, config.signature.direction), config)
    assert {family for family, _ in firsts} == set(Family)
    assert {direction for _, direction in firsts} == set(Direction)
    for config in firsts.values():
        for unit in kernel_units(config):
            assert callable(getattr(importlib.import_module(unit.module), unit.function)), (config.name, unit)


def test_the_shared_modules_hold_no_family_switch():
    """rules, ranking and plan ask FAMILIES: no isinstance at all, no comparison of a family."""
    import tiledispatch.ops.conv as conv

    shared = Path(conv.__file__).parent
    assert [s for name in ("rules.py", "ranking.py", "plan.py", "rulesets.py")
            for s in family_switches(shared / name, any_isinstance=True)] == []
