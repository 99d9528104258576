"""The kernel cache cannot be poisoned: a private Triton cache for builds, no symlinks inside,
checked parents, reads through checked descriptors, manifests that list what the loader reads,
bounded JSON, write failures that say what to do, a group-shared cache only by opt-in."""

from __future__ import annotations

import errno
import grp
import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tiledispatch.core import kernel
from tiledispatch.core.cache import (
    FORMAT_VERSION,
    GROUP_ENV,
    CacheEntry,
    InvalidEntry,
    KernelCache,
    StaleEntryError,
)
from tiledispatch.core.errors import CacheError, InsecureCacheError

CUBIN = b"\x7fELF" + bytes(range(256)) * 16  # the same in every process
FORGED = b"\x7fELF" + b"forged" * 500
TOOLCHAIN = {"triton": "3.6.0"}
KEY = KernelCache.make_key("gemm_integrity", "src", TOOLCHAIN)
REQUIRED = (kernel.METADATA_FILE, kernel.BINARY_FILE)
SPLIT = "gemm_fp16_rcr_tiled_32x16x32_w2_s2_g2_k3_none_sm90"
am_root = os.getuid() == 0
needs_root = pytest.mark.skipif(not am_root, reason="chown to another user needs root")


def write_kernel(staging: Path, payload: bytes = CUBIN) -> dict:
    (staging / kernel.BINARY_FILE).write_bytes(payload)
    (staging / kernel.METADATA_FILE).write_text(json.dumps({"num_warps": 4}))
    (staging / "sub").mkdir()
    (staging / "sub" / kernel.PTX_FILE).write_text("// ptx")
    return {"stage": "main"}


@pytest.fixture
def private(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o700)
    return tmp_path


@pytest.fixture
def cache(private: Path) -> KernelCache:
    return KernelCache(private / "cache")


def versioned(cache: KernelCache) -> Path:
    return cache.root / f"v{FORMAT_VERSION}"


def forged_entry(where: Path) -> Path:
    """A valid entry of KEY holding FORGED, in a cache of its own: what an attacker plants."""
    other = KernelCache(where)
    return other.get_or_build(KEY, lambda s: write_kernel(s, FORGED)).path


# --- 1. builds use a Triton cache of their own ---------------------------------------------


def poisoned_build(triton_cache: str, out: str) -> dict:
    """In a spawned worker (TRITON_INTERPRET=0, TRITON_CACHE_DIR=triton_cache): fill Triton's
    cache with a compile of the unit, poison its cubin, check Triton now serves the poison,
    then build the unit with compile_unit."""
    import triton
    from triton import knobs

    from tiledispatch import arch
    from tiledispatch.core.op import OpKind, RuleSet
    from tiledispatch.core.registry import Registry

    spec = Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, arch.load("sm_90")).get(SPLIT)
    unit = kernel.units(spec)[1]  # the split-K reduction: no dot, quick to compile
    target = arch.load("sm_90").triton_target()
    triton.compile(kernel._source(unit), target=target, options=kernel._options(unit))
    planted = list(Path(triton_cache).rglob("*.cubin"))
    for p in planted:
        p.write_bytes(FORGED)
    served = triton.compile(kernel._source(unit), target=target, options=kernel._options(unit)).asm["cubin"]
    before = sorted(str(p) for p in Path(triton_cache).rglob("*"))
    metadata = kernel.compile_unit(unit, "sm_90", Path(out))
    return {"planted": len(planted), "served_forged": served == FORGED, "metadata": metadata,
            "env": os.environ.get("TRITON_CACHE_DIR"), "knob": knobs.cache.dir,
            "always_compile": knobs.compilation.always_compile,
            "triton_cache_untouched": before == sorted(str(p) for p in Path(triton_cache).rglob("*")),
            "left": sorted(p.name for p in Path(out).iterdir())}


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    base = tmp_path_factory.mktemp("poison")
    triton_cache, out = base / "triton", base / "out"
    out.mkdir()
    with kernel.environment(TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(triton_cache)):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            report = pool.submit(poisoned_build, str(triton_cache), str(out)).result(timeout=300)
    return report, triton_cache, out


def test_a_cubin_poisoned_in_tritons_cache_never_reaches_an_entry(poisoned):
    report, triton_cache, out = poisoned
    assert report["planted"] >= 1 and report["served_forged"]  # Triton's own cache would serve it
    cubin = (out / kernel.BINARY_FILE).read_bytes()
    assert cubin.startswith(b"\x7fELF") and cubin != FORGED and FORGED not in cubin
    assert report["triton_cache_untouched"]  # the build neither read nor wrote it
    # The process's Triton settings are back as they were, and the private cache is gone.
    assert report["env"] == str(triton_cache) and report["knob"] == str(triton_cache)
    assert report["always_compile"] is False
    assert report["left"] == sorted([kernel.BINARY_FILE, kernel.METADATA_FILE, kernel.PTX_FILE])


def test_private_triton_cache_restores_the_environment(tmp_path, monkeypatch):
    from triton import knobs

    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    with kernel.private_triton_cache(tmp_path / "t") as d:
        assert knobs.cache.dir == str(d) and os.environ["TRITON_CACHE_DIR"] == str(d)
        assert knobs.compilation.always_compile and not knobs.compilation.override
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere/else" and knobs.cache.dir == "/somewhere/else"
    assert not (tmp_path / "t").exists()


# --- the loader checks what Triton read against the verified bytes ----------------------------


@pytest.fixture
def real_entry(poisoned, cache):
    """An entry holding the files compile_unit wrote."""
    _, _, out = poisoned

    def copy(staging: Path) -> None:
        for name in os.listdir(out):
            shutil.copy(out / name, staging / name)

    return cache.get_or_build(KEY, copy, required=REQUIRED)


def test_loaded_kernel_holds_the_verified_cubin(real_entry):
    compiled = kernel.loaded_kernel(None, real_entry)
    assert compiled.kernel == real_entry.read_bytes(kernel.BINARY_FILE)


@pytest.mark.parametrize("swap", ["cubin", "metadata", "remove"])
def test_a_file_swapped_after_verification_is_never_loaded(real_entry, swap):
    if swap == "cubin":
        real_entry.files[kernel.BINARY_FILE].write_bytes(FORGED)
    elif swap == "metadata":
        meta = json.loads(real_entry.files[kernel.METADATA_FILE].read_text())
        meta["num_warps"] = meta["num_warps"] * 2
        real_entry.files[kernel.METADATA_FILE].write_text(json.dumps(meta))
    else:
        real_entry.files[kernel.BINARY_FILE].unlink()
    with pytest.raises(StaleEntryError, match="look it up again"):
        kernel.loaded_kernel(None, real_entry)


def test_a_stale_entry_is_looked_up_again(monkeypatch):
    calls, failures = [], [kernel.LOAD_ATTEMPTS - 1]

    class Flaky:
        def __init__(self, unit, entry):
            calls.append(entry)
            if len(calls) <= failures[0]:
                raise StaleEntryError("pruned meanwhile")

    monkeypatch.setattr(kernel, "CudaLauncher", Flaky)
    monkeypatch.setattr(kernel, "build", lambda spec, cache, specialization: {"main": len(calls)})
    unit, spec = type("Unit", (), {"stage": "main"})(), type("Spec", (), {"name": "k"})()
    assert set(kernel._cuda_launchers(spec, [unit], None, None)) == {"main"}
    assert calls == list(range(kernel.LOAD_ATTEMPTS))  # looked up (built) again before each attempt
    calls.clear()
    failures[0] = 100
    with pytest.raises(StaleEntryError):  # a CacheError: the dispatcher moves to its next candidate
        kernel._cuda_launchers(spec, [unit], None, None)
    assert len(calls) == kernel.LOAD_ATTEMPTS


def test_build_asks_the_cache_for_the_files_the_loader_reads(monkeypatch):
    seen = {}
    # the stand-in cache records requests only: the functions' keys are computed, not stored in it
    monkeypatch.setattr(kernel.function_keys, "stored_key", lambda cache, function, compute: compute())

    class Recorder:
        def get_or_build(self, key, build, *, required=()):
            seen[key] = tuple(required)
            return "entry"

    from tiledispatch import arch
    from tiledispatch.core.op import OpKind, RuleSet
    from tiledispatch.core.registry import Registry

    spec = Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, arch.load("sm_90")).get(SPLIT)
    assert set(kernel.build(spec, Recorder())) == {"main", "reduce"}
    assert set(seen.values()) == {(kernel.METADATA_FILE, kernel.BINARY_FILE)}


# --- 2. symlinks, parents, swaps --------------------------------------------------------------


def test_an_entry_that_is_a_symlink_to_a_forged_entry_is_rebuilt(cache, private):
    target = forged_entry(private / "attacker")
    (versioned(cache) / KEY).symlink_to(target, target_is_directory=True)
    assert cache.lookup(KEY) is None
    [listed] = cache.entries()
    assert isinstance(listed, InvalidEntry) and "symlink" in listed.reason
    entry = cache.get_or_build(KEY, write_kernel)
    assert entry.read_bytes(kernel.BINARY_FILE) == CUBIN
    assert not (versioned(cache) / KEY).is_symlink()
    assert (target / kernel.BINARY_FILE).read_bytes() == FORGED  # the target is left alone


def test_a_symlinked_directory_inside_an_entry_is_refused(cache, private):
    entry = cache.get_or_build(KEY, write_kernel)
    elsewhere = private / "elsewhere"
    shutil.copytree(entry.path / "sub", elsewhere)
    shutil.rmtree(entry.path / "sub")
    (entry.path / "sub").symlink_to(elsewhere, target_is_directory=True)
    assert cache.lookup(KEY) is None
    assert "symlink" in cache.entries()[0].reason


@pytest.mark.parametrize("name", [".locks", f"v{FORMAT_VERSION}"])
def test_a_symlinked_locks_or_versioned_directory_is_refused(cache, private, name):
    path = cache.root / f"v{FORMAT_VERSION}" / ".locks" if name == ".locks" else cache.root / name
    moved = private / "moved"
    path.rename(moved)
    path.symlink_to(moved, target_is_directory=True)
    with pytest.raises(InsecureCacheError, match="symlink"):
        KernelCache(cache.root)
    with pytest.raises(InsecureCacheError, match="symlink"):
        cache.get_or_build(KEY, write_kernel)


@pytest.mark.parametrize("bits, ok", [(0o777, False), (0o1777, True), (0o775, True)])
def test_parents_writable_by_others_need_the_sticky_bit(private, bits, ok):
    parent = private / "shared"
    parent.mkdir()
    os.chmod(parent, bits)
    if ok:
        assert KernelCache(parent / "cache").lookup(KEY) is None
    else:
        with pytest.raises(InsecureCacheError, match="sticky") as err:
            KernelCache(parent / "cache")
        assert str(parent) in str(err.value) and "chmod" not in str(err.value)


@needs_root
def test_a_parent_owned_by_another_user_is_refused(private):
    parent = private / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, 12345, 12345)
    with pytest.raises(InsecureCacheError, match="uid 12345"):
        KernelCache(parent / "cache")


def test_a_root_swapped_after_the_check_is_refused(cache, private):
    cache.get_or_build(KEY, write_kernel)
    lair = private / "open"  # a directory anyone can write, holding a forged cache
    lair.mkdir()
    os.chmod(lair, 0o777)
    forged_entry(private / "staged")
    shutil.move(str(private / "staged"), lair / "cache")
    os.chmod(lair, 0o777)
    cache.root.rename(private / "real")
    cache.root.symlink_to(lair / "cache", target_is_directory=True)
    with pytest.raises(InsecureCacheError, match="sticky"):
        cache.lookup(KEY)


def test_reads_go_through_the_checked_descriptor(cache, private, monkeypatch):
    """An entry directory swapped between being opened and being read: what is read and
    returned is the directory that was opened and checked, never the swapped-in one."""
    cache.get_or_build(KEY, write_kernel)
    target = forged_entry(private / "attacker")
    real_verify = KernelCache._verify

    def swap_then_verify(self, entry_fd, key, path, required, touch):
        path.rename(private / "aside")
        shutil.copytree(target, path)
        return real_verify(self, entry_fd, key, path, required, touch)

    monkeypatch.setattr(KernelCache, "_verify", swap_then_verify)
    entry = cache.lookup(KEY, required=REQUIRED)
    assert entry.read_bytes(kernel.BINARY_FILE) == CUBIN


# --- 3. what the manifest lists, and how deep it nests ----------------------------------------


def rewrite_manifest(entry: CacheEntry, change) -> None:
    path = entry.path / "manifest.json"
    path.write_text(change(json.loads(path.read_text())))


def test_a_manifest_that_leaves_out_the_cubin_is_invalid_and_rebuilt(cache):
    entry = cache.get_or_build(KEY, write_kernel, required=REQUIRED)

    def drop(m):
        del m["files"][kernel.BINARY_FILE]
        return json.dumps(m)

    rewrite_manifest(entry, drop)
    (entry.path / kernel.BINARY_FILE).write_bytes(FORGED)
    assert cache.lookup(KEY) is not None  # every listed file verifies...
    assert cache.lookup(KEY, required=REQUIRED) is None  # ...but the loader's file is not listed
    calls = []
    rebuilt = cache.get_or_build(KEY, lambda s: calls.append(1) or write_kernel(s), required=REQUIRED)
    assert calls == [1] and rebuilt.read_bytes(kernel.BINARY_FILE) == CUBIN


def test_a_build_that_writes_no_required_file_publishes_nothing(cache):
    with pytest.raises(CacheError, match="kernel.cubin"):
        cache.get_or_build(KEY, lambda s: (s / kernel.METADATA_FILE).write_text("{}") and None, required=REQUIRED)
    assert cache.entries() == []


def test_a_deeply_nested_manifest_is_invalid_not_a_crash(cache):
    entry = cache.get_or_build(KEY, write_kernel)
    (entry.path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert cache.lookup(KEY) is None
    [listed] = cache.entries()
    assert isinstance(listed, InvalidEntry) and "deeper" in listed.reason
    assert cache.info().invalid == 1
    assert cache.prune() == 1
    assert cache.get_or_build(KEY, write_kernel).read_bytes(kernel.BINARY_FILE) == CUBIN


# --- 4. full disks and vanishing files ------------------------------------------------------


def test_a_full_disk_during_a_build_is_a_cache_error_that_says_what_to_do(cache):
    def full(staging):
        (staging / kernel.BINARY_FILE).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CacheError, match="free disk space.*TILEDISPATCH_CACHE_DIR"):
        cache.get_or_build(KEY, full)
    assert cache.entries() == [] and [p.name for p in versioned(cache).iterdir()] == [".locks"]


def test_a_file_removed_after_verification_is_a_stale_entry_not_an_oserror(cache):
    entry = cache.get_or_build(KEY, write_kernel, required=REQUIRED)
    for name in os.listdir(entry.path):
        if os.path.isfile(entry.path / name):
            os.unlink(entry.path / name)
    shutil.rmtree(entry.path / "sub")
    assert entry.read_bytes(kernel.BINARY_FILE) == CUBIN  # the verified bytes are kept
    with pytest.raises(StaleEntryError, match="look the entry up again"):
        entry.read_bytes(f"sub/{kernel.PTX_FILE}")
    with pytest.raises(CacheError, match="no file"):
        entry.read_bytes("other.bin")
    assert cache.get_or_build(KEY, write_kernel).read_bytes(f"sub/{kernel.PTX_FILE}") == b"// ptx"


# --- 5. advice for shared directories, and the group opt-in --------------------------------


def test_a_shared_sticky_root_gets_a_private_subdirectory_as_advice(private):
    shared = private / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    with pytest.raises(InsecureCacheError) as err:
        KernelCache(shared)
    message = str(err.value)
    assert "chmod" not in message
    assert f"mkdir -m 700 {shared}/tiledispatch-" in message and "TILEDISPATCH_CACHE_DIR" in message


def my_group() -> str:
    return grp.getgrgid(os.getgid()).gr_name


def test_a_group_cache_is_opt_in(private, monkeypatch):
    root = private / "team"
    root.mkdir()
    os.chmod(root, 0o2770)
    with pytest.raises(InsecureCacheError, match="writable by group"):
        KernelCache(root)
    monkeypatch.setenv(GROUP_ENV, my_group())
    cache = KernelCache(root)
    entry = cache.get_or_build(KEY, write_kernel)
    assert entry.read_bytes(kernel.BINARY_FILE) == CUBIN
    assert os.stat(entry.path).st_mode & 0o7777 == 0o2770
    assert os.stat(entry.files[kernel.BINARY_FILE]).st_mode & 0o777 == 0o660
    assert os.stat(entry.path).st_gid == os.getgid()
    os.chmod(root, 0o2777)  # writable by others: never, not even for a group
    with pytest.raises(InsecureCacheError, match="writable by others"):
        KernelCache(root)


@needs_root
def test_a_group_cache_refuses_entries_of_another_group(private, monkeypatch):
    monkeypatch.setenv(GROUP_ENV, my_group())
    cache = KernelCache(private / "team")
    entry = cache.get_or_build(KEY, write_kernel)
    os.chown(entry.files[kernel.BINARY_FILE], -1, 12345)
    assert cache.lookup(KEY) is None and "not to group" in cache.entries()[0].reason


def test_an_unknown_group_or_one_you_are_not_in_is_an_error(private, monkeypatch):
    monkeypatch.setenv(GROUP_ENV, "td-no-such-group")
    with pytest.raises(CacheError, match="names no group"):
        KernelCache(private / "c")
    others = [g.gr_name for g in grp.getgrall() if g.gr_gid not in (os.getgid(), *os.getgroups())]
    if others:
        monkeypatch.setenv(GROUP_ENV, others[0])
        with pytest.raises(CacheError, match="not a member"):
            KernelCache(private / "c")


# --- 7. processes racing: one build per key, prune racing loads ------------------------------


def load_loop(root: str, key: str, stop, barrier) -> str:
    cache = KernelCache(root)
    barrier.wait()
    loads = 0
    while not stop.is_set():
        entry = cache.get_or_build(key, write_kernel, required=REQUIRED)
        if entry.read_bytes(kernel.BINARY_FILE) != CUBIN:
            return "wrong bytes"
        try:
            entry.read_bytes(f"sub/{kernel.PTX_FILE}")
        except StaleEntryError:
            pass  # pruned meanwhile: the caller looks it up again, as kernel.load does
        loads += 1
    return f"ok {loads}"


def prune_loop(root: str, seconds: float, stop, barrier) -> str:
    """Prunes for `seconds`, and on until a prune has won the race (a slow machine's loaders may
    keep the entry fresh for a while), then stops the loaders."""
    cache = KernelCache(root)
    barrier.wait()
    start, removed = time.monotonic(), 0
    try:
        while time.monotonic() - start < seconds or (not removed and time.monotonic() - start < 60):
            removed += cache.prune(older_than_s=0.0)
    finally:
        stop.set()
    return f"ok {removed}"


def test_prune_racing_loads(cache):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(3, mp_context=ctx) as pool:
        barrier, stop = manager.Barrier(3), manager.Event()
        loaders = [pool.submit(load_loop, str(cache.root), KEY, stop, barrier) for _ in range(2)]
        pruner = pool.submit(prune_loop, str(cache.root), 1.5, stop, barrier)
        results = [f.result(timeout=120) for f in loaders] + [pruner.result(timeout=120)]
    assert all(r.startswith("ok ") for r in results), results
    assert all(int(r.split()[1]) > 0 for r in results), results  # loads happened, and prunes removed entries


# --- 6. tuning records ----------------------------------------------------------------------


def tuning_record(store, key: str, text: str) -> None:
    (store.dir / f"{key}.json").write_text(text)


def test_a_tuning_record_whose_winner_is_not_a_finalist_is_missing(private):
    from tiledispatch.heuristics import autotune

    store = autotune.TuningStore(private / "c")
    good = autotune.TuningRecord("a", {"a": 1.0, "b": 2.0}, {"m": 8})
    store.put("k", good)
    assert store.get("k", finalists=["a", "b"]) == good
    store.put("k", autotune.TuningRecord("x", {"x": 1.0}, {}))
    assert store.get("k", finalists=["a", "b"]) is None  # tuned again, then overwritten by put
    tuning_record(store, "k", json.dumps({"format": 1, "winner": "x", "times_ms": {"a": 1.0}}))
    assert store.get("k") is None  # the winner is not among the record's own finalists
    for bad in ('{"format": 1, "winner": "a", "times_ms": {"a": NaN}}', '{"format": 1, "winner": "a", '
                '"times_ms": {"a": true}}', "[" * 100_000, '{"format": 1, "winner": ["a"], "times_ms": {}}'):
        tuning_record(store, "k", bad)
        assert store.get("k", finalists=["a"]) is None  # never a RecursionError or a TypeError
    store.put("k", good)
    assert store.get("k", finalists=["a", "b"]) == good


def test_a_tuning_record_reached_through_a_symlink_is_missing(private):
    from tiledispatch.heuristics import autotune

    store = autotune.TuningStore(private / "c")
    store.put("real", autotune.TuningRecord("a", {"a": 1.0}, {}))
    (store.dir / "k.json").symlink_to(store.dir / "real.json")
    assert store.get("real") is not None and store.get("k") is None


def test_a_dispatcher_tunes_again_over_a_record_whose_winner_was_not_timed(private, monkeypatch):
    import torch

    import tiledispatch
    from tiledispatch.core.dispatcher import Dispatcher, Strategy
    from tiledispatch.core.op import OpKind, RuleSet
    from tiledispatch.core.registry import Registry
    from tiledispatch.core.runtime import current_arch
    from tiledispatch.heuristics import autotune
    from tiledispatch.ops.gemm import check_operands

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("times on the CPU interpreter")
    timed = []
    monkeypatch.setattr(autotune, "measure", lambda runs, on_gpu: timed.append(list(runs)) or
                        {name: float(i + 1) for i, name in enumerate(runs)})
    registry = Registry.from_rule_set(OpKind.GEMM, RuleSet.TESTS, current_arch())

    def make() -> Dispatcher:
        return Dispatcher(registry, current_arch(), strategy=Strategy.AUTOTUNE, cache=KernelCache(private / "c"))

    a, b = torch.randn(24, 16).half(), torch.randn(16, 32).half()
    problem = check_operands(a, b).problem
    first = make()
    first.select(problem, device=a.device)
    (path,) = first.tuning.dir.glob("*.json")
    names = timed[0]
    path.write_text(json.dumps({"format": 1, "winner": names[-1], "times_ms": {names[0]: 1.0}}))
    later = make()
    got = later.select(problem, device=a.device)
    assert len(timed) == 2 and got.name == names[0]  # tuned again...
    assert json.loads(path.read_text())["winner"] == names[0]  # ...and the record overwritten
    out = tiledispatch.gemm(a, b, dispatcher=later)
    ref = a.double() @ b.double()
    assert float((out.double() - ref).norm() / ref.norm()) < 4e-3
