"""GEMM rule sets: nesting by name, unique names, validity per arch, duplicates refused."""

import itertools
import time
from collections import Counter

import pytest

from tiledispatch import arch
from tiledispatch.core.dtypes import DType
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm import GemmLayout, rulesets
from tiledispatch.ops.gemm.rules import GemmRule, validate
from tiledispatch.ops.gemm.rulesets import RULE_SETS

SM80, SM90, INTERP = arch.load("sm_80"), arch.load("sm_90"), arch.load("interpreter")


def names(rule_set: RuleSet) -> list[str]:
    return [c.name for c in RULE_SETS[rule_set]()]


@pytest.fixture(scope="module")
def full_names() -> list[str]:
    return names(RuleSet.FULL)


def test_every_rule_set_is_registered_with_the_op():
    assert set(RULE_SETS) == set(RuleSet)
    assert get_op(OpKind.GEMM).rule_sets is RULE_SETS


def test_tiny_in_tests_in_default_in_full(full_names):
    tiny, tests, default = (set(names(r)) for r in (RuleSet.TINY, RuleSet.TESTS, RuleSet.DEFAULT))
    full = set(full_names)
    assert tiny and tiny < tests
    assert tests < full
    assert default < full
    assert tests <= default  # the module docstring promises tiny ⊂ tests ⊂ default ⊂ full
    assert len(tiny) < len(tests) < len(default) < len(full)


@pytest.mark.parametrize("rule_set", [RuleSet.TINY, RuleSet.TESTS, RuleSet.DEFAULT])
def test_no_two_configs_share_a_name(rule_set):
    counts = Counter(names(rule_set))
    assert [n for n, c in counts.items() if c > 1] == []


def test_full_has_no_repeated_name_and_is_quick():
    start = time.perf_counter()
    configs = list(RULE_SETS[RuleSet.FULL]())
    counts = Counter(c.name for c in configs)
    elapsed = time.perf_counter() - start
    assert [n for n, c in counts.items() if c > 1] == []
    assert len(configs) > 100_000  # the whole tile space for every signature
    assert len(set(configs)) == len(configs)
    assert elapsed < 30, f"enumerating `full` took {elapsed:.1f} s"


def test_full_contains_the_whole_tile_space_for_plain_epilogues(full_names):
    full = set(full_names)
    tile = rulesets.full_tiles()[0]
    for types, layout in itertools.product(rulesets.TYPES, rulesets.LAYOUTS):
        name = (f"gemm_{types.name}_{layout.name}_tiled_{tile.block_m}x{tile.block_n}x{tile.block_k}"
                f"_w{tile.num_warps}_s{tile.num_stages}_g{tile.group_m}_k{tile.split_k}_none")
        assert name in full
    expected = len(rulesets.full_tiles()) * len(rulesets.TYPES) * len(rulesets.LAYOUTS)
    plain = [n for n in full_names if n.endswith("_none")]
    assert len(plain) >= expected


def test_rule_sets_generate_the_same_order_every_time():
    assert names(RuleSet.TESTS) == names(RuleSet.TESTS)


@pytest.mark.parametrize("rule_set", list(RuleSet), ids=lambda r: r.value)
def test_rule_sets_mostly_validate_on_sm90(rule_set):
    configs = list(RULE_SETS[rule_set]())
    results = [validate(c, SM90) for c in configs]
    valid = sum(r.ok for r in results)
    assert valid / len(configs) > 0.5, f"{rule_set.value}: only {valid} of {len(configs)} valid on sm_90"
    if rule_set in (RuleSet.TINY, RuleSet.TESTS):
        assert valid == len(configs)  # small tiles, every dtype: all of them fit an H100
    # What does not validate breaks a resource rule, never a dtype rule: sm_90 runs every dtype.
    broken = set().union(*(r.broken_rules() for r in results))
    assert broken <= {GemmRule.SHARED_MEMORY, GemmRule.REGISTER_BUDGET}


@pytest.mark.parametrize("rule_set", [RuleSet.TINY, RuleSet.TESTS, RuleSet.DEFAULT], ids=lambda r: r.value)
def test_registry_from_rule_set_keeps_exactly_the_valid_configs(rule_set):
    # `default` on the two targets that differ most (sm_90 and the interpreter); the small sets on all three
    for target in (SM90, INTERP) if rule_set is RuleSet.DEFAULT else (SM90, SM80, INTERP):
        registry = Registry.from_rule_set(OpKind.GEMM, rule_set, target)
        want = [c for c in RULE_SETS[rule_set]() if validate(c, target).ok]
        assert [s.config for s in registry] == want  # same configs, same order
        assert all(s.arch == target.name and s.op is OpKind.GEMM for s in registry)
        assert all(s.name.endswith("_" + target.tag) for s in registry)


def test_registry_drops_what_an_arch_cannot_run():
    fp8 = (DType.FP8E4M3, DType.FP8E5M2)
    on_80 = Registry.from_rule_set("gemm", "tiny", SM80)
    on_90 = Registry.from_rule_set("gemm", "tiny", SM90)
    on_interp = Registry.from_rule_set("gemm", "tiny", INTERP)
    assert not [s for s in on_80 if s.config.types.a in fp8]
    assert [s for s in on_90 if s.config.types.a in fp8]
    assert [s for s in on_80 if s.config.types.a is DType.BF16]
    assert not [s for s in on_interp if s.config.types.a is DType.BF16]
    assert [s for s in on_interp if s.config.types.a in fp8]
    assert len(on_80) < len(on_90) and len(on_interp) < len(on_90)
    assert len(on_90) == len(list(RULE_SETS[RuleSet.TINY]()))


def test_registry_from_rule_set_accepts_names():
    assert [s.name for s in Registry.from_rule_set("GEMM", "Tiny", SM90)] == \
        [s.name for s in Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, SM90)]


def _twice(first):
    def generate():
        configs = list(first())
        yield from configs[:3]
        yield configs[1]  # a bug in a rule set: the same config again
        yield from configs[3:6]
    return generate


def test_duplicate_names_in_a_rule_set_raise(monkeypatch):
    monkeypatch.setitem(RULE_SETS, RuleSet.TINY, _twice(rulesets.tiny))
    duplicate = list(rulesets.tiny())[1]
    with pytest.raises(ValueError, match="twice") as info:
        Registry.from_rule_set("gemm", "tiny", SM90)
    assert duplicate.name in str(info.value) and "'tiny'" in str(info.value)


def test_duplicates_raise_even_when_the_arch_drops_the_config(monkeypatch):
    # A rule set is arch-independent: a repeated name is a bug whether or not this arch keeps it.
    bf16 = [c for c in rulesets.tiny() if c.types.a is DType.BF16]
    monkeypatch.setitem(RULE_SETS, RuleSet.TINY, lambda: iter([bf16[0], bf16[1], bf16[0]]))
    with pytest.raises(ValueError, match="twice"):
        Registry.from_rule_set("gemm", "tiny", INTERP)  # bf16 is invalid on the interpreter


def test_full_dedup_keeps_default_first():
    first = list(itertools.islice(RULE_SETS[RuleSet.FULL](), 5))
    assert first == list(itertools.islice(RULE_SETS[RuleSet.DEFAULT](), 5))


@pytest.mark.parametrize("rule_set", [RuleSet.TINY, RuleSet.TESTS, RuleSet.DEFAULT, RuleSet.FULL])
def test_a_class_generates_exactly_its_configs_in_the_whole_set_s_order(rule_set):
    """The lazy registry's premise: `within=(types, epilogue, layout)` yields the whole set's configs
    of those types and epilogue whose layout is the problem's or the strided one, in the same order;
    a layout no config has (mixed strided) gets the strided configs alone. `full`, generated by the
    same code as `default` and several times its size, is checked on every third class."""
    by_class: dict = {}  # the whole set's configs by (types, epilogue), each list in the whole set's order
    for c in RULE_SETS[rule_set]():
        by_class.setdefault((c.types, c.epilogue), []).append(c)
    strided = GemmLayout.parse("sss")
    layouts = (*rulesets.LAYOUTS, GemmLayout.parse("rrs"))
    classes = list(itertools.product(layouts, rulesets.TYPES, rulesets.EPILOGUES))
    for layout, types, epilogue in classes[::3] if rule_set is RuleSet.FULL else classes:
        part = list(RULE_SETS[rule_set](within=(types, epilogue, layout)))
        assert part == [c for c in by_class.get((types, epilogue), ()) if c.layout in (layout, strided)]


@pytest.mark.parametrize("target", [SM90, INTERP], ids=lambda a: a.name)
def test_the_lazy_registry_ranks_what_the_eager_one_ranks(target):
    """Candidates of a lazy registry are the eager registry's that take the problem, same order."""
    from tiledispatch.ops.gemm import Epilogue, GemmProblem, GemmTypes

    eager = Registry.from_rule_set("gemm", "default", target)
    lazy = Registry.from_rule_sets(["gemm"], "default", target)
    definition = get_op("gemm")
    for types, epilogue, layout in [(GemmTypes(DType.FP16, DType.FP16, DType.FP16), Epilogue(), "rrr"),
                                    (GemmTypes(DType.FP32, DType.FP32, DType.FP32), Epilogue(bias=True), "rcr"),
                                    (GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16), Epilogue(), "rcr"),
                                    (GemmTypes(DType.FP16, DType.FP16, DType.FP16), Epilogue(), "srr")]:
        problem = GemmProblem(128, 96, 256, types=types, epilogue=epilogue, layout=GemmLayout.parse(layout))
        takes = lambda specs: [s.name for s in specs if definition.supports(s.config, problem) is None]  # noqa: E731
        assert takes(lazy.candidates(definition.kind, problem)) == takes(eager)
        assert lazy.lazy  # nothing read the whole registry
    assert [s.name for s in lazy] == [s.name for s in eager] and not lazy.lazy
