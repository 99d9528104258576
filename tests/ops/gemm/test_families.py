"""Every GEMM kernel family is registered: one family module each (ops/gemm/families/), found by its
configs' `family`, so the op's shared rules, ranking, plan and rule sets reach every kernel the rule
sets name."""

from __future__ import annotations

import importlib
import typing
from dataclasses import replace
from pathlib import Path

import pytest

from tiledispatch import arch
from tiledispatch.core.errors import InvalidConfigError
from tiledispatch.core.op import RuleSet
from tiledispatch.ops.gemm import Alignment, Family, GemmConfig, validate
from tiledispatch.ops.gemm.config import AnyGemmConfig
from tiledispatch.ops.gemm.family import FAMILIES, GemmFamily
from tiledispatch.ops.gemm.plan import kernel_units
from tiledispatch.ops.gemm.rulesets import RULE_SETS

from ..family_switches import family_switches

SM90 = arch.load("sm_90")


@pytest.fixture(scope="module")
def full():
    return list(RULE_SETS[RuleSet.FULL]())


def test_every_family_member_has_a_registered_family():
    assert sorted(FAMILIES.names()) == sorted(f.value for f in Family)


def test_family_names_are_unique_and_of_this_op():
    families = list(FAMILIES)
    assert len({f.name for f in families}) == len(families) == len(FAMILIES.names())
    assert all(f.op == "gemm" and isinstance(f, GemmFamily) for f in families)


def test_every_config_type_has_a_registered_family():
    assert set(typing.get_args(AnyGemmConfig)) == {f.config_type for f in FAMILIES}


def test_every_config_of_the_full_rule_set_resolves_to_its_family(full):
    """Rule sets are arch-independent (the registry drops what an arch cannot run), so one pass
    over `full` covers every arch."""
    seen = set()
    for config in full:
        family = FAMILIES.of(config)
        assert family.name == config.family.value and isinstance(config, family.config_type), config.name
        seen.add(family.name)
    assert seen == set(FAMILIES.names())


def test_the_family_facts_that_family_members_report_are_the_registered_ones():
    for member in Family:
        family = next(f for f in FAMILIES if f.name == member.value)
        assert (member.uses_tma, member.warp_specialised) == (family.uses_tma, family.warp_specialised)
    assert Family.STREAM_K.uses_tma and not Family.STREAM_K.warp_specialised
    assert Family.WS_PINGPONG.warp_specialised and not Family.TILED.uses_tma


def test_each_family_compiles_from_a_kernel_file_that_defines_its_functions(full):
    """One valid config of each family on sm_90 (aligned and not, for the realign variants): every
    unit it compiles names a module under ops/gemm/ and a function that module defines."""
    for name in FAMILIES.names():
        config = next(c for c in full if c.family.value == name and validate(c, SM90).ok)
        cases = [(config, Alignment())]
        if isinstance(config, GemmConfig):
            cases.append((replace(config, realign=True), Alignment(*[False] * 6)))
        for candidate, alignment in cases:
            for unit in kernel_units(candidate, alignment, SM90):
                assert unit.module.startswith("tiledispatch.ops.gemm."), unit
                assert hasattr(importlib.import_module(unit.module), unit.function), unit


def test_a_config_of_an_unregistered_family_is_refused_by_name(full):
    config = next(c for c in full if c.family is Family.GEMV)

    class Unknown:  # a config of no registered family, under a registered family's name
        family = Family.GEMV
        name = "unknown"

    with pytest.raises(InvalidConfigError, match="registered: .*gemv"):
        FAMILIES.of(Unknown())
    with pytest.raises(InvalidConfigError, match="no gemm kernel family 'vendor' takes a GemmConfig"):
        FAMILIES.of(replace(config, family=Family.VENDOR))
    assert FAMILIES.of(config).name == "gemv"


def test_registering_another_family_under_a_taken_name_fails():
    tiled = next(f for f in FAMILIES if f.name == "tiled")
    with pytest.raises(ValueError, match="registered already"):
        FAMILIES.register(replace(tiled, validate=lambda config, arch: ()))


def test_the_shared_modules_hold_no_switch_over_families():
    """rules, ranking, plan, rule sets and config ask FAMILIES instead of switching on a family."""
    import tiledispatch.ops.gemm as gemm

    shared = Path(gemm.__file__).parent
    assert [s for name in ("rules.py", "ranking.py", "plan.py", "rulesets.py", "config.py", "family.py")
            for s in family_switches(shared / name)] == []

