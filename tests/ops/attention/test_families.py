"""Every attention config belongs to a registered kernel family, and the op's shared code asks the
family rather than switching on it (issue 39: a kernel family is one module)."""

import importlib
from pathlib import Path

import pytest

from tiledispatch import arch
from tiledispatch.core.errors import InvalidConfigError
from tiledispatch.core.op import RuleSet
from tiledispatch.ops.attention import AttentionConfig, Family, VendorConfig, validate
from tiledispatch.ops.attention.config import FAMILIES, AttentionFamily
from tiledispatch.ops.attention.plan import kernel_units
from tiledispatch.ops.attention.rulesets import RULE_SETS

from ..family_switches import family_switches

OP_DIR = Path(importlib.import_module("tiledispatch.ops.attention").__file__).parent
# The op's shared modules: they look a config's family up in FAMILIES and call it.
SHARED = ("config.py", "rules.py", "ranking.py", "plan.py", "operands.py", "problem.py", "counting.py")


def test_every_family_name_is_registered_once():
    names = FAMILIES.names()
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(f.value for f in Family), "a Family member without a family module (or back)"
    for family in FAMILIES:
        assert isinstance(family, AttentionFamily) and family.op == "attention"
        assert FAMILIES.named(family.name) is family


def test_every_config_type_has_a_family():
    assert {family.config_type for family in FAMILIES} == {AttentionConfig, VendorConfig}


def test_every_config_of_the_full_rule_set_resolves_to_its_family():
    """The rule sets are arch-independent (the registry drops per arch what it cannot run), so one
    pass over `full` (a superset of the others) covers every arch."""
    seen = set()
    for config in RULE_SETS[RuleSet.FULL]():
        family = FAMILIES.of(config)
        assert family.name == config.family.value and isinstance(config, family.config_type)
        seen.add(family.name)
    assert seen == set(FAMILIES.names()), "a registered family without a rule-set entry"


def test_each_family_builds_a_default_config_into_real_kernels():
    """Each family's first default config is valid on sm_90 and compiles units whose functions exist."""
    sm90 = arch.load("sm_90")
    first = {}
    for config in RULE_SETS[RuleSet.DEFAULT]():
        if validate(config, sm90).ok:
            first.setdefault(config.family, config)
    assert set(first) == set(Family)
    for config in first.values():
        assert FAMILIES.of(config).direction is config.family.direction
        for unit in kernel_units(config, arch=sm90):
            assert callable(getattr(importlib.import_module(unit.module), unit.function)), (config.name, unit)


def test_a_config_of_the_wrong_type_for_its_family_is_refused_by_name():
    config = next(c for c in RULE_SETS[RuleSet.TINY]() if isinstance(c, AttentionConfig))
    wrong = AttentionConfig(Family.SDPA_CUDNN, config.dtype, config.head_dim_qk, config.head_dim_v, config.block_m,
                            config.block_n)
    with pytest.raises(InvalidConfigError, match="sdpa-cudnn"):
        FAMILIES.of(wrong)
    assert not validate(wrong, arch.load("sm_90")).ok


def test_the_shared_modules_hold_no_switch_over_families():
    assert [s for name in SHARED for s in family_switches(OP_DIR / name)] == []


def test_the_switch_finder_finds_switches(tmp_path):
    """The guard above can fail: it sees both spellings of a switch."""
    module = tmp_path / "m.py"
    module.write_text("def f(config):\n    if isinstance(config, VendorConfig):\n        return 1\n"
                      "    return config.family is Family.FWD\n")
    assert len(family_switches(module)) == 2
