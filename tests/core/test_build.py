"""Ahead-of-time builds for sm_90 on this (GPU-less) machine: artifacts, cache hits, keys, PTX.

Compiling is real (Triton's CUDA backend and its bundled ptxas in spawned workers), so
only two small specs are built, once for the module.
"""

import os

import pytest

from tiledispatch import arch
from tiledispatch.core import kernel
from tiledispatch.core.cache import CacheEntry, KernelCache
from tiledispatch.core.errors import BuildError
from tiledispatch.core.op import OpKind, RuleSet
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm import Alignment

from ..conftest import interpreter_only, requires_gpu

SM90 = arch.load("sm_90")
PLAIN = "gemm_fp16_rcr_tiled_32x32x32_w4_s2_g4_k1_none_sm90"
SPLIT = "gemm_fp16_rcr_tiled_32x16x32_w2_s2_g2_k3_none_sm90"  # split-K: a main and a reduce stage
FILES = {kernel.BINARY_FILE, kernel.METADATA_FILE, kernel.PTX_FILE}


@pytest.fixture(scope="module")
def tiny90() -> Registry:
    return Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, SM90)


@pytest.fixture(scope="module")
def built(tiny90, private_cache):
    cache = private_cache("build")
    specs = [tiny90.get(PLAIN), tiny90.get(SPLIT)]
    interp = Registry.from_rule_set("gemm", "tiny", arch.load("interpreter")).get(PLAIN.replace("sm90", "interp"))
    done = []
    results = kernel.build_all([*specs, interp], cache, jobs=1, on_done=done.append)
    return cache, specs, interp, results, done


def entries_by_key(cache: KernelCache) -> dict[str, CacheEntry]:
    found = cache.entries()
    assert all(isinstance(e, CacheEntry) for e in found), found
    return {e.key: e for e in found}


def expected_keys(spec) -> dict[str, tuple]:
    """Every (unit, specialisation) the build compiles, by cache key."""
    out = {}
    for specialization in spec.definition.specializations:
        for unit in kernel.units(spec, specialization):
            out[kernel.unit_key(spec, unit, specialization)] = (unit, specialization)
    return out


def test_build_results(built):
    cache, specs, interp, results, done = built
    assert sorted(r.name for r in results) == sorted([PLAIN, SPLIT, interp.name])
    assert sorted(done, key=lambda r: r.name) == results  # on_done saw each one
    by_name = {r.name: r for r in results}
    for name in (PLAIN, SPLIT):
        assert by_name[name].ok and by_name[name].error is None and by_name[name].seconds > 0
    # One bad spec is reported, and does not stop the others.
    failed = by_name[interp.name]
    assert not failed.ok and "interpreter has no compile target" in failed.error


def test_cache_holds_every_stage_and_specialization(built):
    cache, specs, *_ = built
    entries = entries_by_key(cache)
    want = {**expected_keys(specs[0]), **expected_keys(specs[1])}
    assert set(entries) == set(want)
    specializations = specs[0].definition.specializations
    assert len(specializations) == 2 and len(entries) == (1 + 2) * 2
    for key, entry in entries.items():
        unit, specialization = want[key]
        assert set(entry.files) == FILES
        assert entry.read_bytes(kernel.BINARY_FILE)[:4] == b"\x7fELF"  # a real cubin
        meta = entry.metadata
        assert meta["stage"] == unit.stage and meta["arch"] == "sm_90"
        assert meta["function"] == unit.function
        assert meta["num_warps"] == unit.num_warps and meta["num_stages"] == unit.num_stages
        assert meta["hash"] and meta["shared_bytes"] >= 0
        assert key.startswith(f"{specs[0].name if key.startswith(PLAIN) else SPLIT}.{specialization.tag}.{unit.stage}-")
    stages = sorted(e.metadata["stage"] for e in entries.values() if e.key.startswith(SPLIT))
    assert stages == ["main", "main", "reduce", "reduce"]


def test_ptx_uses_tensor_cores_for_sm90(built):
    cache, *_ = built
    for entry in cache.entries():
        ptx = entry.files[kernel.PTX_FILE].read_text()
        assert ".target sm_90" in ptx
        if entry.metadata["stage"] == "main":
            assert "mma" in ptx  # tl.dot became tensor-core instructions
        else:
            assert "mma" not in ptx  # the split-K reduction has no dot


def test_alignment_specialisation_vectorises(built):
    cache, specs, *_ = built
    aligned, unaligned = specs[0].definition.specializations
    assert all(vars(aligned).values()) and not any(vars(unaligned).values())
    seen = set()
    for entry in cache.entries():
        ptx = entry.files[kernel.PTX_FILE].read_text()
        if f".{aligned.tag}." in entry.key:
            assert ".v4." in ptx  # 16-byte vector accesses
            seen.add("aligned")
        else:
            assert f".{unaligned.tag}." in entry.key
            assert ".v4." not in ptx and "cp.async" not in ptx  # element by element
            seen.add("unaligned")
    assert seen == {"aligned", "unaligned"}


def test_second_build_all_is_a_hit(built):
    cache, specs, *_ = built
    before = {k: (e.created, os.stat(e.files[kernel.BINARY_FILE]).st_mtime_ns) for k, e in entries_by_key(cache).items()}
    results = kernel.build_all(specs, cache, jobs=1)
    assert all(r.ok for r in results)
    after = {k: (e.created, os.stat(e.files[kernel.BINARY_FILE]).st_mtime_ns) for k, e in entries_by_key(cache).items()}
    assert after == before  # nothing recompiled, nothing rewritten


def test_in_process_build_is_a_hit_without_compiling(built, tiny90, monkeypatch):
    cache, specs, *_ = built
    calls = []

    def refuse(unit, arch_name, out_dir):
        calls.append(unit.stage)
        raise BuildError("compile_unit must not be called on a cache hit")

    monkeypatch.setattr(kernel, "compile_unit", refuse)
    entries = entries_by_key(cache)
    for spec in specs:
        for specialization in (None, *spec.definition.specializations):
            got = kernel.build(spec, cache, specialization)
            assert set(got) == {u.stage for u in kernel.units(spec, specialization)}
            for stage, entry in got.items():
                assert entries[entry.key].created == entry.created
    assert calls == []
    # The stand-in is really in the path: a spec never built does call it.
    other = next(s for s in tiny90 if s.family == "tiled" and s.name not in (PLAIN, SPLIT))
    with pytest.raises(BuildError, match="must not be called"):
        kernel.build(other, cache)
    assert calls == ["main"]


@interpreter_only
def test_compiling_in_an_interpreter_process_is_refused(tiny90, tmp_path):
    unit = kernel.units(tiny90.get(PLAIN))[0]
    with pytest.raises(BuildError, match="TRITON_INTERPRET=1.*worker processes"):
        kernel.compile_unit(unit, "sm_90", tmp_path)


# --- keys ------------------------------------------------------------------------------


def test_unit_key_depends_on_name_stage_and_specialization(tiny90):
    plain, split = tiny90.get(PLAIN), tiny90.get(SPLIT)
    main, reduce = kernel.units(split)
    keys = {
        kernel.unit_key(plain, kernel.units(plain)[0]),
        kernel.unit_key(split, main),
        kernel.unit_key(split, reduce),
        kernel.unit_key(split, main, Alignment(False, False, False)),
    }
    assert len(keys) == 4
    assert kernel.unit_key(split, main) == kernel.unit_key(split, main, Alignment())  # the default
    assert kernel.unit_key(split, main) == kernel.unit_key(split, main)  # stable


def test_unit_key_changes_with_the_toolchain(tiny90, monkeypatch):
    spec = tiny90.get(PLAIN)
    unit = kernel.units(spec)[0]
    before = kernel.unit_key(spec, unit)
    real = kernel.toolchain()
    assert real["triton"] and real["format"] == kernel.CACHE_FORMAT
    monkeypatch.setattr(kernel, "toolchain", lambda: {**real, "triton": real["triton"] + "+other"})
    changed = kernel.unit_key(spec, unit)
    assert changed != before
    assert changed.split("-")[0] == before.split("-")[0]  # same readable name, other hash


def test_unit_key_changes_with_the_function_key(tiny90, monkeypatch):
    spec = tiny90.get(PLAIN)
    unit = kernel.units(spec)[0]
    before = kernel.unit_key(spec, unit)
    monkeypatch.setattr(kernel, "function_key", lambda unit, cache=None: "0" * 64)
    assert kernel.unit_key(spec, unit) != before


def test_unit_key_changes_with_what_the_compiler_is_handed(tiny90):
    """Two units of one kernel name that differ in a constexpr or a compile option never share an
    artifact: a plan module's constant (not in the kernel's sources) reaches the key through the unit."""
    from dataclasses import replace

    spec = tiny90.get(SPLIT)
    reduce = kernel.units(spec)[1]
    constexprs = dict(reduce.constexprs)
    other_block = replace(reduce, constexprs=tuple(sorted({**constexprs,
                                                            "BLOCK_N": constexprs["BLOCK_N"] // 2}.items())))
    keys = {kernel.unit_key(spec, reduce), kernel.unit_key(spec, other_block),
            kernel.unit_key(spec, replace(reduce, num_warps=reduce.num_warps * 2)),
            kernel.unit_key(spec, replace(reduce, divisibility=reduce.divisibility + (("N", 8),)))}
    assert len(keys) == 4
    assert kernel.unit_key(spec, replace(reduce)) == kernel.unit_key(spec, reduce)  # equal units, one key


def test_function_key_names_the_function_and_follows_its_code(tiny90):
    main, reduce = kernel.units(tiny90.get(SPLIT))
    assert kernel.function_key(main).startswith("tiledispatch.ops.gemm.kernels.tiled.")
    assert kernel.function_key(reduce).startswith("tiledispatch.ops.gemm.kernels.splitk_reduce.splitk_reduce:")
    assert kernel.function_key(main) != kernel.function_key(reduce)
    assert kernel.function_key(main) == kernel.function_key(main)  # stable


def test_tma_persistent_compiles_to_bulk_tensor_copies_and_wgmma(tmp_path):
    """The Hopper family is compiled here for sm_90 (it runs on the H200 only), so a compile
    error shows up in CI; its PTX must use TMA and warpgroup MMA, the features it exists for."""
    os.chmod(tmp_path, 0o700)
    cache = KernelCache(tmp_path / "cache")
    spec = Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, SM90).get(
        "gemm_bf16_rcr_tma-persistent_128x128x64_w4_s4_g8_k1_e1_none_sm90")
    (result,) = kernel.build_all([spec], cache, jobs=1, specializations=(Alignment(),))
    assert result.ok, result.error
    (entry,) = cache.entries()
    ptx = entry.files[kernel.PTX_FILE].read_text()
    assert "cp.async.bulk.tensor" in ptx and "wgmma" in ptx


def test_a_unit_past_the_shared_memory_limit_fails_its_build(tmp_path):
    """Triton compiles a kernel that takes more shared memory than a block may have, and only its
    launch fails; the build refuses it instead, so nothing is cached and the dispatcher can move on.
    Five stages of 128x128 and 128x128 fp16 tiles take 320 KiB (validation refuses the config; the
    spec is made by hand to get past it)."""
    from dataclasses import replace

    from tiledispatch.core.spec import KernelSpec
    from tiledispatch.ops.gemm import validate

    os.chmod(tmp_path, 0o700)
    cache = KernelCache(tmp_path / "cache")
    small = Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, SM90).get(PLAIN).config
    config = replace(small, block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=5)
    assert not validate(config, SM90).ok
    spec = KernelSpec(OpKind.GEMM, config, SM90.name)
    (result,) = kernel.build_all([spec], cache, jobs=1, specializations=(Alignment(),))
    assert not result.ok
    assert "shared memory" in result.error and str(SM90.shared_memory_per_block_optin) in result.error
    assert cache.entries() == []


def test_shared_memory_check_names_the_unit_and_the_limit():
    unit = kernel.units(Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, SM90).get(PLAIN))[0]
    kernel.check_shared_memory(unit, SM90.shared_memory_per_block_optin, SM90)  # at the limit: fine
    with pytest.raises(BuildError, match=rf"{unit.function} \(main\) .* 232449 B .* allows 232448 B"):
        kernel.check_shared_memory(unit, SM90.shared_memory_per_block_optin + 1, SM90)


def test_a_register_cap_is_a_compile_option_and_part_of_the_key(tiny90):
    """A unit's cap reaches ptxas (maxnreg) and its cache key: two caps never share an artifact."""
    from dataclasses import replace

    spec = tiny90.get(PLAIN)
    unit = kernel.units(spec)[0]
    capped = replace(unit, max_registers=168)
    assert "maxnreg" not in kernel._options(unit) and kernel._options(capped)["maxnreg"] == 168
    keys = {kernel.unit_key(spec, unit), kernel.unit_key(spec, capped),
            kernel.unit_key(spec, replace(unit, max_registers=128))}
    assert len(keys) == 3


@interpreter_only
def test_a_gluon_unit_is_refused_by_the_interpreter(tiny90):
    """Triton's interpreter cannot run Gluon: loading one there fails with that reason, not later."""
    from dataclasses import replace

    from tiledispatch.core.op import UnitKind

    unit = replace(kernel.units(tiny90.get(PLAIN))[0], kind=UnitKind.GLUON)
    with pytest.raises(BuildError, match="Gluon kernel: Triton's interpreter cannot run it"):
        kernel.InterpretedLauncher(unit)
    assert UnitKind.GLUON.compiled and UnitKind.TRITON.compiled and not UnitKind.PYTHON.compiled


def test_a_unit_must_list_its_kernels_parameters_in_order(tiny90):
    """The interpreter binds a launch's arguments by position, constexprs included: a unit whose
    signature swaps two of them would hand the kernel one's value for the other, so it is refused."""
    from dataclasses import replace

    unit = kernel.units(tiny90.get(PLAIN))[0]
    assert kernel._function(unit)  # the rule set's own units are in order
    signature = list(unit.signature)
    signature[-1], signature[-2] = signature[-2], signature[-1]
    with pytest.raises(BuildError, match="list them in the kernel's order"):
        kernel._function(replace(unit, signature=tuple(signature)))


@requires_gpu
def test_a_build_worker_builds_tritons_launcher_too(tiny90, tmp_path, monkeypatch):
    """Triton compiles a C launcher per kernel signature the first time a process on the host loads
    such a kernel (about a second): the build workers make it, into Triton's cache."""
    triton_cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_cache))  # the spawned workers' Triton cache
    cache = KernelCache(tmp_path / "kernels")
    (result,) = kernel.build_all([tiny90.get(PLAIN)], cache, jobs=1, specializations=(Alignment(),))
    assert result.ok, result.error
    assert list(triton_cache.rglob("__triton_launcher*.so"))


def test_past_its_deadline_a_build_drops_the_compiles_not_started(tiny90, tmp_path):
    """A sweep's prebuild on a machine lent for a fixed time stops at the budget: the compiles
    queued are dropped (they compile where first needed), those finished are returned and cached."""
    import time

    os.chmod(tmp_path, 0o700)
    cache = KernelCache(tmp_path / "cache")
    specs = [s for s in tiny90 if not s.is_vendor][:6]  # each compiles at least one unit
    results = kernel.build_each(((s, (Alignment(),)) for s in specs), cache, jobs=1, deadline=time.perf_counter())
    assert len(results) < len(specs) and all(r.ok for r in results), results
    assert len(cache.entries()) >= len(results)  # what finished is cached
    again = kernel.build_each(((s, (Alignment(),)) for s in specs), cache, jobs=2)  # no deadline: every one
    assert sorted(r.name for r in again) == sorted(s.name for s in specs) and all(r.ok for r in again)
