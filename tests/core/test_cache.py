"""The kernel cache: private directories, verified entries, one build per key across processes."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import multiprocessing
import os
import re
import stat
import time
from pathlib import Path

import pytest
from filelock import FileLock

from tiledispatch.core.cache import (
    FORMAT_VERSION,
    CacheEntry,
    InvalidEntry,
    KernelCache,
    default_cache_dir,
)
from tiledispatch.core.errors import CacheError, InsecureCacheError

CUBIN = bytes(range(256)) * 64
TOOLCHAIN = {"triton": "3.6.0", "cuda": "12.8", "arch": "sm_90a"}


def write_kernel(staging: Path, payload: bytes = CUBIN) -> dict:
    (staging / "kernel.cubin").write_bytes(payload)
    (staging / "kernel.json").write_text(json.dumps({"num_warps": 4}))
    return {"shared_mem": 65536, "name": "gemm_bf16"}


class CountingBuild:
    def __init__(self, payload: bytes = CUBIN):
        self.calls = 0
        self.payload = payload

    def __call__(self, staging: Path) -> dict:
        self.calls += 1
        return write_kernel(staging, self.payload)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o700)
    return tmp_path / "cache"


@pytest.fixture
def cache(root: Path) -> KernelCache:
    return KernelCache(root)


KEY = KernelCache.make_key("gemm_bf16_128x128x64_w4_s3", "srchash", TOOLCHAIN)


# --- directories and keys ------------------------------------------------------------


def test_root_and_parents_are_created_private(tmp_path: Path):
    os.chmod(tmp_path, 0o700)
    root = tmp_path / "a" / "b"
    old = os.umask(0o022)
    try:
        cache = KernelCache(root)
    finally:
        os.umask(old)
    assert cache.root == root
    assert mode(tmp_path / "a") == 0o700
    assert mode(root) == 0o700
    assert mode(root / f"v{FORMAT_VERSION}") == 0o700


def test_default_cache_dir_follows_environment(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("TILEDISPATCH_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("TILEDISPATCH_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "tiledispatch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "tiledispatch"


def test_make_key_is_stable_readable_and_complete():
    name = "gemm_bf16_bf16_fp32_tn_128x256x64_w8_s3_gm8_splitk1_persistent_tma_ws_sm90a_v2.1"
    assert len(name) >= 80
    key = KernelCache.make_key(name, "abc", TOOLCHAIN)
    assert key == KernelCache.make_key(name, "abc", dict(reversed(list(TOOLCHAIN.items()))))
    assert re.fullmatch(re.escape(name) + r"-[0-9a-f]{16}", key)
    others = {
        KernelCache.make_key(name, "abd", TOOLCHAIN),
        KernelCache.make_key(name, "abc", {**TOOLCHAIN, "triton": "3.5.1"}),
        KernelCache.make_key(name, "abc", {**TOOLCHAIN, "ptxas": "12.9"}),
        KernelCache.make_key(name + "x", "abc", TOOLCHAIN),
    }
    assert key not in others and len(others) == 4


@pytest.mark.parametrize("name", ["", "a/b", "../up", ".hidden", "has space", "gemm:1", "é", "x" * 161])
def test_make_key_rejects_unsafe_names(name):
    with pytest.raises(CacheError, match="cache key"):
        KernelCache.make_key(name, "abc", TOOLCHAIN)


@pytest.mark.parametrize("key", ["../escape", "a/b", ".locks", ""])
def test_lookup_rejects_unsafe_keys(cache: KernelCache, key):
    with pytest.raises(CacheError, match="invalid cache key"):
        cache.lookup(key)


# --- miss, build, hit ------------------------------------------------------------------


def test_miss_then_build_then_hit(cache: KernelCache):
    build = CountingBuild()
    assert cache.lookup(KEY) is None

    built = cache.get_or_build(KEY, build)
    again = cache.get_or_build(KEY, build)
    looked = cache.lookup(KEY)

    assert build.calls == 1
    assert isinstance(looked, CacheEntry)
    for entry in (built, again, looked):
        assert entry.key == KEY
        assert entry.path == cache.root / f"v{FORMAT_VERSION}" / KEY
        assert sorted(entry.files) == ["kernel.cubin", "kernel.json"]
        assert entry.read_bytes("kernel.cubin") == CUBIN
        assert json.loads(entry.read_bytes("kernel.json")) == {"num_warps": 4}
        assert dict(entry.metadata) == {"shared_mem": 65536, "name": "gemm_bf16"}
        assert entry.size_bytes == len(CUBIN) + len(json.dumps({"num_warps": 4}))
        assert abs(entry.created - time.time()) < 60
    assert (looked.path / "manifest.json").is_file()


def test_hit_refreshes_last_use(cache: KernelCache):
    entry = cache.get_or_build(KEY, CountingBuild())
    manifest = entry.path / "manifest.json"
    os.utime(manifest, (1_000_000, 1_000_000))
    assert cache.lookup(KEY) is not None
    assert time.time() - manifest.stat().st_mtime < 60


def test_nested_files_and_no_metadata(cache: KernelCache):
    def build(staging: Path):
        (staging / "sub").mkdir()
        (staging / "sub" / "kernel.ptx").write_text("// ptx")
        return None

    entry = cache.get_or_build(KEY, build)
    assert dict(entry.metadata) == {}
    assert entry.read_bytes("sub/kernel.ptx") == b"// ptx"
    assert cache.lookup(KEY).read_bytes("sub/kernel.ptx") == b"// ptx"


# --- concurrency -------------------------------------------------------------------------


def slow_counting_build(counter: str, staging: Path) -> dict:
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(0.5)
    return write_kernel(staging)


def race_worker(root: str, key: str, counter: str, out: str, barrier) -> None:
    cache = KernelCache(root)
    barrier.wait()
    entry = cache.get_or_build(key, functools.partial(slow_counting_build, counter), required=["kernel.cubin"])
    assert isinstance(entry, CacheEntry) and entry.digests["kernel.cubin"] == hashlib.sha256(CUBIN).hexdigest()
    Path(out).write_bytes(entry.read_bytes("kernel.cubin"))  # the bytes verified in this process


def test_processes_racing_on_one_key_build_it_once(root: Path, tmp_path: Path):
    KernelCache(root)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    counter = tmp_path / "builds.txt"
    outs = [tmp_path / f"out{i}.bin" for i in range(4)]
    procs = [ctx.Process(target=race_worker, args=(str(root), KEY, str(counter), str(out), barrier))
             for out in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(counter.read_text().splitlines()) == 1  # built exactly once
    assert all(out.read_bytes() == CUBIN for out in outs)  # every process saw the verified entry
    assert [type(e) for e in KernelCache(root).entries()] == [CacheEntry]


def test_lock_timeout_raises_cache_error(cache: KernelCache, root: Path):
    quick = KernelCache(root, lock_timeout_s=0.2)
    build = CountingBuild()
    with FileLock(root / f"v{FORMAT_VERSION}" / ".locks" / f"{KEY}.lock"):
        with pytest.raises(CacheError, match="timed out"):
            quick.get_or_build(KEY, build)
    assert build.calls == 0
    assert quick.get_or_build(KEY, build).read_bytes("kernel.cubin") == CUBIN


# --- corruption ------------------------------------------------------------------------


def truncate_cubin(path: Path):
    with open(path / "kernel.cubin", "r+b") as f:
        f.truncate(100)


def flip_byte(path: Path):
    data = bytearray((path / "kernel.cubin").read_bytes())
    data[7] ^= 0xFF
    (path / "kernel.cubin").write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated file": truncate_cubin,
    "flipped byte": flip_byte,
    "deleted file": lambda p: (p / "kernel.json").unlink(),
    "deleted manifest": lambda p: (p / "manifest.json").unlink(),
    "garbage manifest": lambda p: (p / "manifest.json").write_bytes(b"\x00{not json"),
    "wrong manifest shape": lambda p: (p / "manifest.json").write_text('{"format": 1, "key": 3, "files": []}'),
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_corrupted_entry_is_rebuilt_never_loaded(cache: KernelCache, corrupt, caplog):
    build = CountingBuild()
    entry = cache.get_or_build(KEY, build)
    corrupt(entry.path)

    assert cache.lookup(KEY) is None
    [listed] = cache.entries()
    assert isinstance(listed, InvalidEntry) and listed.key == KEY and listed.reason

    with caplog.at_level(logging.WARNING, logger="tiledispatch.cache"):
        rebuilt = cache.get_or_build(KEY, build)
    assert build.calls == 2
    assert rebuilt.read_bytes("kernel.cubin") == CUBIN
    assert cache.lookup(KEY).read_bytes("kernel.cubin") == CUBIN
    assert any(r.name == "tiledispatch.cache" and KEY in r.getMessage() for r in caplog.records)


def test_failed_build_publishes_nothing(cache: KernelCache):
    def broken(staging: Path):
        (staging / "kernel.cubin").write_bytes(b"half")
        raise RuntimeError("ptxas died")

    with pytest.raises(RuntimeError, match="ptxas died"):
        cache.get_or_build(KEY, broken)
    versioned = cache.root / f"v{FORMAT_VERSION}"
    assert cache.lookup(KEY) is None
    assert not (versioned / KEY).exists()
    assert [p.name for p in versioned.iterdir()] == [".locks"]
    assert cache.get_or_build(KEY, CountingBuild()).read_bytes("kernel.cubin") == CUBIN


@pytest.mark.parametrize("result", [{"bad": object()}, ["not", "a", "dict"]])
def test_bad_metadata_publishes_nothing(cache: KernelCache, result):
    def build(staging: Path):
        write_kernel(staging)
        return result

    with pytest.raises(CacheError):
        cache.get_or_build(KEY, build)
    assert cache.entries() == []
    assert [p.name for p in (cache.root / f"v{FORMAT_VERSION}").iterdir()] == [".locks"]


def test_empty_build_is_an_error(cache: KernelCache):
    with pytest.raises(CacheError, match="no files"):
        cache.get_or_build(KEY, lambda staging: None)
    assert cache.entries() == []


# --- permissions -----------------------------------------------------------------------


@pytest.mark.parametrize("bits", [0o777, 0o770, 0o720, 0o702])
@pytest.mark.parametrize("which", ["root", "versioned"])
def test_shared_writable_directory_is_refused(root: Path, bits, which):
    KernelCache(root)
    target = root if which == "root" else root / f"v{FORMAT_VERSION}"
    os.chmod(target, bits)
    try:
        with pytest.raises(InsecureCacheError) as err:
            KernelCache(root)
    finally:
        os.chmod(target, 0o700)
    message = str(err.value)
    assert str(target) in message
    assert oct(bits) in message
    assert "TILEDISPATCH_CACHE_DIR" in message
    if which == "versioned":  # tiledispatch's own directory: fixing its mode is safe
        assert f"chmod 700 {target}" in message
    else:  # the root may be a directory others use: a private directory instead, never a chmod
        assert "chmod" not in message and "mkdir -m 700" in message


def test_existing_private_directory_is_accepted(root: Path):
    root.mkdir(mode=0o700)
    os.chmod(root, 0o755)  # readable by others is fine, writable is not
    assert KernelCache(root).root == root


# --- listing and cleanup ---------------------------------------------------------------


def keys(n: int) -> list[str]:
    return [KernelCache.make_key(f"k{i}", "src", TOOLCHAIN) for i in range(n)]


def test_entries_info_and_clear(cache: KernelCache):
    ks = keys(3)
    for k in reversed(ks):
        cache.get_or_build(k, CountingBuild())
    (cache.root / f"v{FORMAT_VERSION}" / ks[1] / "kernel.cubin").write_bytes(b"tampered")

    listed = cache.entries()
    assert [e.key for e in listed] == sorted(ks)
    assert [type(e) for e in listed] == [CacheEntry, InvalidEntry, CacheEntry]

    info = cache.info()
    assert (info.root, info.entries, info.invalid) == (cache.root, 2, 1)
    assert info.size_bytes >= 2 * len(CUBIN)

    (cache.root / f"v{FORMAT_VERSION}" / f".staging-{ks[0]}-1-dead").mkdir()
    assert cache.clear() == 3
    assert cache.entries() == []
    assert cache.info().entries == 0 and cache.info().invalid == 0
    assert not any(p.name.startswith(".staging-") for p in (cache.root / f"v{FORMAT_VERSION}").iterdir())
    assert cache.get_or_build(ks[0], CountingBuild()).read_bytes("kernel.cubin") == CUBIN


def test_prune(cache: KernelCache):
    versioned = cache.root / f"v{FORMAT_VERSION}"
    old_key, fresh_key, bad_key = keys(3)
    for k in (old_key, fresh_key, bad_key):
        cache.get_or_build(k, CountingBuild())
    truncate_cubin(versioned / bad_key)
    long_ago = time.time() - 7200
    os.utime(versioned / old_key / "manifest.json", (long_ago, long_ago))

    dead_staging = versioned / f".staging-{fresh_key}-1-dead"
    dead_staging.mkdir()
    (dead_staging / "kernel.cubin").write_bytes(b"partial")
    os.utime(dead_staging, (long_ago, long_ago))
    live_staging = versioned / f".staging-{fresh_key}-2-live"
    live_staging.mkdir()
    stale_lock = versioned / ".locks" / "gone-0123456789abcdef.lock"
    stale_lock.touch()

    assert cache.prune() == 2  # the invalid entry and the dead staging dir
    assert not (versioned / bad_key).exists() and not dead_staging.exists()
    assert live_staging.exists() and not stale_lock.exists()
    assert [e.key for e in cache.entries()] == sorted([old_key, fresh_key])

    assert cache.prune(older_than_s=3600) == 1
    assert [e.key for e in cache.entries()] == [fresh_key]
    assert cache.prune(older_than_s=3600) == 0


def test_prune_leaves_a_key_being_built(cache: KernelCache):
    versioned = cache.root / f"v{FORMAT_VERSION}"
    cache.get_or_build(KEY, CountingBuild())
    truncate_cubin(versioned / KEY)
    with FileLock(versioned / ".locks" / f"{KEY}.lock"):
        assert cache.prune() == 0
    assert (versioned / KEY).exists()
    assert cache.prune() == 1
