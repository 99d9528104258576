"""The registry: priorities, look-ups, views, merge, order, threads, and its JSON file format."""

import copy
import datetime as dt
import json
import threading
from dataclasses import replace

import pytest

from tiledispatch import arch
from tiledispatch.core.errors import RegistryFormatError, UnknownKernelError
from tiledispatch.core.op import OpKind, RuleSet
from tiledispatch.core.registry import FORMAT, FORMAT_VERSION, Registry
from tiledispatch.core.spec import KernelSpec

INTERP, SM90 = arch.load("interpreter"), arch.load("sm_90")


@pytest.fixture(scope="module")
def tiny() -> Registry:
    return Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, INTERP)


@pytest.fixture(scope="module")
def specs(tiny) -> list[KernelSpec]:
    return list(tiny)


def twin(spec: KernelSpec) -> KernelSpec:
    """An equal spec that is another object, to see which one a registry keeps."""
    other = KernelSpec(spec.op, replace(spec.config), spec.arch)
    assert other == spec and other is not spec
    return other


# --- add and priority ----------------------------------------------------------------


def test_add_and_read(specs):
    registry = Registry()
    assert len(registry) == 0 and list(registry) == []
    assert registry.add(specs[0]) is True
    assert len(registry) == 1 and specs[0].name in registry and "nope" not in registry
    assert registry.get(specs[0].name) is specs[0]
    assert registry.priority(specs[0].name) == 0


def test_reregistration_needs_strictly_higher_priority(specs):
    spec = specs[0]
    registry = Registry([spec], priority=1)
    assert registry.priority(spec.name) == 1
    same = twin(spec)
    assert registry.add(same, 1) is False  # equal priority keeps the old entry
    assert registry.get(spec.name) is spec
    assert registry.add(same, 0) is False  # lower keeps it too
    assert registry.get(spec.name) is spec and registry.priority(spec.name) == 1
    assert registry.add(same, 2) is True  # strictly higher replaces
    assert registry.get(spec.name) is same and registry.priority(spec.name) == 2
    assert len(registry) == 1


def test_replacement_keeps_the_position(specs):
    registry = Registry(specs[:3])
    registry.add(twin(specs[1]), 5)
    assert [s.name for s in registry] == [s.name for s in specs[:3]]


def test_negative_priorities(specs):
    registry = Registry()
    assert registry.add(specs[0], -5)
    assert registry.add(twin(specs[0]), -1)
    assert registry.priority(specs[0].name) == -1


# --- look-ups ------------------------------------------------------------------------


def test_get_unknown_suggests_close_names(tiny, specs):
    name = specs[0].name
    typo = name.replace("_interp", "_intrp")
    with pytest.raises(UnknownKernelError) as info:
        tiny.get(typo)
    message = str(info.value)
    assert repr(typo) in message and "did you mean" in message and name in message
    assert f"({len(tiny)} kernels)" in message
    assert isinstance(info.value, KeyError)  # and still a KeyError for callers that catch that


def test_get_unknown_without_close_names(tiny):
    with pytest.raises(UnknownKernelError, match="registry list"):
        tiny.get("zzz")
    with pytest.raises(UnknownKernelError):
        tiny.priority("zzz")
    with pytest.raises(UnknownKernelError, match="0 kernels"):
        Registry().get("zzz")


# --- views ---------------------------------------------------------------------------


def test_filter_keeps_order_and_priorities(specs):
    registry = Registry()
    for i, spec in enumerate(specs[:20]):
        registry.add(spec, i)
    kept = registry.filter(lambda s: s.config.split_k > 1)
    want = [s for s in specs[:20] if s.config.split_k > 1]
    assert want and [s.name for s in kept] == [s.name for s in want]
    assert [kept.priority(s.name) for s in want] == [registry.priority(s.name) for s in want]
    assert len(registry) == 20  # the original is untouched
    assert len(registry.filter(lambda s: False)) == 0


def test_for_arch_and_for_op():
    on_interp = Registry.from_rule_set("gemm", "tiny", INTERP)
    on_90 = Registry.from_rule_set("gemm", "tiny", SM90)
    both = on_interp.merge(on_90)
    assert len(both) == len(on_interp) + len(on_90)  # names differ by the arch tag
    assert [s.name for s in both.for_arch("sm_90")] == [s.name for s in on_90]
    assert [s.name for s in both.for_arch(INTERP)] == [s.name for s in on_interp]  # an ArchInfo works too
    assert len(both.for_arch("sm_80")) == 0
    assert len(both.for_op("gemm")) == len(both) == len(both.for_op(OpKind.GEMM))
    assert len(both.for_op(OpKind.CONV)) == 0
    assert both.counts()["by_arch"] == {"interpreter": len(on_interp), "sm_90": len(on_90)}


# --- merge ---------------------------------------------------------------------------


def test_merge_higher_priority_wins_ties_keep_ours(specs):
    a, b, c = specs[:3]
    ours = Registry()
    ours.add(a, 1)
    ours.add(b, 1)
    theirs = Registry()
    a2, b2 = twin(a), twin(b)
    theirs.add(a2, 2)  # higher: wins
    theirs.add(b2, 1)  # tie: ours stays
    theirs.add(c, 0)  # new
    merged = ours.merge(theirs)
    assert merged.get(a.name) is a2 and merged.priority(a.name) == 2
    assert merged.get(b.name) is b and merged.priority(b.name) == 1
    assert merged.get(c.name) is c
    assert [s.name for s in merged] == [a.name, b.name, c.name]
    # Neither input changed.
    assert ours.get(a.name) is a and len(ours) == 2 and len(theirs) == 3
    # The other way round, ties keep the receiver's entry: theirs.
    reverse = theirs.merge(ours)
    assert reverse.get(a.name) is a2 and reverse.get(b.name) is b2


# --- order ---------------------------------------------------------------------------


def test_iteration_is_insertion_order(specs):
    picked = [specs[7], specs[2], specs[11], specs[0]]
    assert [s.name for s in Registry(picked)] == [s.name for s in picked]
    assert [e.spec.name for e in Registry(picked).entries()] == [s.name for s in picked]


def test_same_order_across_generations():
    first = [s.name for s in Registry.from_rule_set("gemm", "tests", INTERP)]
    second = [s.name for s in Registry.from_rule_set("gemm", "tests", INTERP)]
    assert first == second and len(first) > 100
    assert first != sorted(first)  # really the generation order, not a sorted view


# --- threads -------------------------------------------------------------------------


def test_concurrent_adds(specs):
    registry = Registry()
    n_threads = 16
    barrier = threading.Barrier(n_threads)
    results = [[] for _ in range(n_threads)]
    errors = []

    def worker(i):
        try:
            barrier.wait()
            # Every thread adds every spec (contended names), each at its own priority.
            for spec in specs:
                results[i].append(registry.add(spec, i))
                assert spec.name in registry
                registry.get(spec.name)
                list(registry)  # iterating while others add must not fail
        except BaseException as e:  # an assert in a thread would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(registry) == len(specs) == len({s.name for s in specs})
    # The highest priority always ends up stored, whatever the interleaving.
    assert {registry.priority(s.name) for s in specs} == {n_threads - 1}
    # Per name, the first add and every strictly higher one succeeded: at most n_threads successes.
    successes = sum(sum(r) for r in results)
    assert len(specs) <= successes <= len(specs) * n_threads


def test_concurrent_adds_of_disjoint_specs(specs):
    registry = Registry()
    chunks = [specs[i::8] for i in range(8)]
    threads = [threading.Thread(target=lambda c=c: [registry.add(s) for s in c]) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(registry) == len(specs) and {s.name for s in registry} == {s.name for s in specs}


# --- JSON ----------------------------------------------------------------------------


def test_to_json_metadata(tiny):
    data = tiny.to_json()
    assert data["format"] == FORMAT == "tiledispatch-registry"
    assert data["format_version"] == FORMAT_VERSION == 1
    assert data["arch"] == "interpreter"
    created = dt.datetime.fromisoformat(data["created"])
    assert created.tzinfo is not None
    assert abs((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) < 60
    assert data["total"] == len(tiny) == len(data["kernels"])
    counts = data["counts"]
    assert counts["by_op"] == {"gemm": len(tiny)}
    by_family = counts["by_family"]
    assert set(by_family) == {"tiled", "tma-persistent", "gemv"} and sum(by_family.values()) == len(tiny)
    assert by_family["tma-persistent"] == sum(1 for s in tiny if s.family == "tma-persistent") > 0
    by_dtype = counts["by_dtype"]
    assert sum(by_dtype.values()) == len(tiny)
    assert by_dtype["fp16"] == sum(1 for s in tiny if s.config.types.name == "fp16") > 0
    assert "bf16" not in by_dtype  # the interpreter has no bf16 tl.dot
    assert set(by_dtype) == {s.dtype for s in tiny}
    kernel = data["kernels"][0]
    assert set(kernel) == {"name", "op", "arch", "config", "priority"}
    assert kernel["op"] == "gemm" and kernel["arch"] == "interpreter" and kernel["priority"] == 0
    assert kernel["config"]["block_m"] == next(iter(tiny)).config.block_m
    json.dumps(data)  # JSON-able as is


def test_to_json_of_several_arches_lists_them():
    both = Registry.from_rule_set("gemm", "tiny", SM90).merge(Registry.from_rule_set("gemm", "tiny", INTERP))
    assert both.to_json()["arch"] == ["interpreter", "sm_90"]


def test_json_round_trip_is_unchanged(tiny, tmp_path):
    registry = Registry()
    for i, spec in enumerate(tiny):
        registry.add(spec, i % 3 - 1)  # priorities -1, 0, 1
    path = registry.save(tmp_path / "r.json")
    loaded = Registry.load(path)
    assert [s.name for s in loaded] == [s.name for s in registry]
    assert list(loaded) == list(registry)  # configs, ops and arches equal, in order
    assert [loaded.priority(s.name) for s in loaded] == [registry.priority(s.name) for s in registry]
    again = loaded.to_json()
    first = json.loads(path.read_text())
    assert again["kernels"] == first["kernels"]
    assert {k: v for k, v in again.items() if k != "created"} == {k: v for k, v in first.items() if k != "created"}


def test_round_trip_of_sm90_specs_with_every_dtype(tmp_path):
    registry = Registry.from_rule_set("gemm", "tiny", SM90)
    loaded = Registry.from_json(json.loads(json.dumps(registry.to_json())))
    assert list(loaded) == list(registry)
    assert {s.dtype for s in loaded} >= {"bf16", "fp8e4m3xfp8e5m2-bf16", "tf32", "fp16-fp32"}


# --- bad files -----------------------------------------------------------------------


@pytest.fixture
def good(specs) -> dict:
    registry = Registry(specs[:4])
    return registry.to_json()


def load_text(tmp_path, text: str) -> Registry:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return Registry.load(path)


def expect_bad(data, *words):
    with pytest.raises(RegistryFormatError) as info:
        Registry.from_json(data, "my.json")
    message = str(info.value)
    assert message.startswith("my.json is not a valid tiledispatch registry: "), message
    for word in words:
        assert word in message, (word, message)
    return message


def test_not_json(tmp_path):
    with pytest.raises(RegistryFormatError, match="is not valid JSON"):
        load_text(tmp_path, "this is not json\n")


def test_truncated_json(tmp_path, good):
    text = json.dumps(good, indent=1)
    with pytest.raises(RegistryFormatError, match="is not valid JSON.*truncated"):
        load_text(tmp_path, text[: len(text) // 2])


def test_binary_file(tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(RegistryFormatError, match="not valid JSON"):
        Registry.load(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(RegistryFormatError, match="does not exist"):
        Registry.load(tmp_path / "nope.json")
    with pytest.raises(RegistryFormatError, match="cannot read registry file"):
        Registry.load(tmp_path)


@pytest.mark.parametrize("data", [[], "x", None, {"format": "something-else"}, {}])
def test_wrong_format(data):
    expect_bad(data, '"format": "tiledispatch-registry"')


def test_wrong_version(good):
    expect_bad({**good, "format_version": 2}, "format_version 2 is not 1", "re-export")
    expect_bad({k: v for k, v in good.items() if k != "format_version"}, "format_version None")


def test_kernels_not_a_list(good):
    expect_bad({**good, "kernels": {"a": 1}}, '"kernels" must be a list')


def test_total_mismatch(good):
    expect_bad({**good, "total": 5}, '"total" says 5', "holds 4 kernels", "truncated")
    expect_bad({**good, "kernels": good["kernels"][:3]}, '"total" says 4', "holds 3")


def with_kernel(good, i, edit):
    data = copy.deepcopy(good)
    edit(data["kernels"][i])
    return data


@pytest.mark.parametrize("edit, words", [
    (lambda k: k["config"].update(block_m="64"), ["kernels[1]", "config.block_m", "expected an integer", "'64'"]),
    (lambda k: k["config"].update(block_m=True), ["config.block_m", "expected an integer", "True"]),
    (lambda k: k["config"].update(num_warps=4.0), ["config.num_warps", "expected an integer"]),
    (lambda k: k["config"]["types"].update(allow_tf32="yes"), ["config.types.allow_tf32", "true/false"]),
    (lambda k: k["config"].update(family="warp"), ["config.family", "'warp' is not one of 'tiled'"]),
    (lambda k: k["config"]["types"].update(a="fp4"), ["config.types.a", "'fp4'", "'fp16'"]),
    (lambda k: k["config"]["layout"].update(b="x"), ["config.layout.b", "'x'", "'r', 'c', 's'"]),
    (lambda k: k["config"]["epilogue"].update(activation="tanh"), ["config.epilogue.activation", "'tanh'"]),
    (lambda k: k["config"].update(tile=1), ["unknown field(s) ['tile']"]),
    (lambda k: k["config"].pop("block_k"), ["missing field 'block_k'"]),
    (lambda k: k["config"].update(types="fp16"), ["config.types", "expected an object"]),
    (lambda k: k.update(config=[]), ["config", "expected an object"]),
    (lambda k: k.update(priority="high"), ["priority must be an integer", "'high'"]),
    (lambda k: k.update(op="conv"), ["kernels[1]", "conv"]),
    (lambda k: k.update(op="nope"), ["kernels[1]", "nope"]),
    (lambda k: k.pop("op"), ["kernels[1]", "op"]),
    (lambda k: k.update(arch="sm_99"), ["kernels[1]", "sm_99"]),
    (lambda k: k.update(arch="sm90"), ["kernels[1]", "'sm90'", "'sm_90'"]),
])
def test_bad_kernel_fields(good, edit, words):
    expect_bad(with_kernel(good, 1, edit), *words)


def test_a_kernel_that_is_not_an_object(good):
    data = copy.deepcopy(good)
    data["kernels"][2] = "gemm_fp16"
    expect_bad(data, "kernels[2]")


def test_name_that_does_not_match_its_config(good):
    def edit(k):
        k["config"]["block_m"] = 128  # still a valid config, but not the one the name says
    data = with_kernel(good, 0, edit)
    name = data["kernels"][0]["name"]
    message = expect_bad(data, "kernels[0]", "does not match its config", name)
    assert "128x" in message


def test_duplicate_kernel(good):
    data = copy.deepcopy(good)
    data["kernels"][3] = copy.deepcopy(data["kernels"][1])
    expect_bad(data, "kernels[3]", data["kernels"][1]["name"], "appears twice")


def test_bad_file_on_disk_names_the_path(tmp_path, good):
    data = with_kernel(good, 0, lambda k: k["config"].update(block_m="x"))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RegistryFormatError, match=f"^{path} is not a valid tiledispatch registry: kernels\\[0\\]"):
        Registry.load(path)
