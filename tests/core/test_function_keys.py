"""Kernel functions' keys kept in the cache (core/function_keys.py): a fresh process reads the key
another computed for the same sources, never one of other sources."""

import os
import time

import pytest

from tiledispatch import arch
from tiledispatch.core import function_keys, jitkey, kernel
from tiledispatch.core.cache import KernelCache
from tiledispatch.core.op import OpKind, RuleSet
from tiledispatch.core.registry import Registry

PLAIN = "gemm_fp16_rcr_tiled_32x32x32_w4_s2_g4_k1_none_sm90"


@pytest.fixture
def unit():
    spec = Registry.from_rule_set(OpKind.GEMM, RuleSet.TINY, arch.load("sm_90")).get(PLAIN)
    return kernel.units(spec)[0]


@pytest.fixture
def fresh_process(monkeypatch):
    """What a new process knows: no key in memory."""
    monkeypatch.setattr(function_keys, "_KNOWN", {})


def test_a_stored_key_is_the_computed_one_and_a_fresh_process_reads_it(tmp_path, unit, fresh_process, monkeypatch):
    cache = KernelCache(tmp_path / "cache")
    computed = kernel.function_key(unit)
    assert kernel.function_key(unit, cache) == computed
    (entry,) = function_keys.store(cache).entries()
    assert entry.read_bytes(function_keys.KEY_FILE).decode() == computed.split(":", 1)[1]
    assert cache.entries() == []  # the kernel cache's own listing has no such entry

    monkeypatch.setattr(function_keys, "_KNOWN", {})

    def no_computing(fn):
        raise AssertionError("the key was computed again")
    monkeypatch.setattr(jitkey, "cache_key", no_computing)
    assert kernel.function_key(unit, cache) == computed


def test_sources_modified_since_the_import_neither_read_nor_write_the_store(tmp_path, unit, fresh_process,
                                                                            monkeypatch):
    cache = KernelCache(tmp_path / "cache")
    monkeypatch.setattr(function_keys, "source_fingerprint", lambda: None)
    calls = []
    assert function_keys.stored_key(cache, "m.f", lambda: calls.append(1) or "k1") == "k1"
    assert function_keys.stored_key(cache, "m.f", lambda: calls.append(1) or "k2") == "k2"
    assert calls == [1, 1] and function_keys.store(cache).entries() == []


def test_the_fingerprint_follows_every_source_and_refuses_a_file_newer_than_the_import(tmp_path):
    roots = [tmp_path / name for name in ("a", "b", "c")]
    for root, body in zip(roots, ("X = 1\n", "X = 2\n", "X = 1\n")):
        (root / "sub").mkdir(parents=True)
        (root / "sub" / "m.py").write_text(body)
        (root / "n.py").write_text("pass\n")
    later = time.time() + 60
    a, b, c = (function_keys.source_fingerprint(root, since=later) for root in roots)
    assert a == c and a != b and len(a) == 64
    os.utime(roots[0] / "sub" / "m.py", (later, later))
    assert function_keys.source_fingerprint(roots[0], since=later) is None


def test_clearing_the_kernel_cache_clears_the_keys(tmp_path, unit, fresh_process):
    cache = KernelCache(tmp_path / "cache")
    kernel.function_key(unit, cache)
    assert len(function_keys.store(cache).entries()) == 1
    cache.clear()
    assert function_keys.store(cache).entries() == []


def test_a_store_that_cannot_be_written_costs_the_computing_not_the_call(tmp_path, fresh_process, monkeypatch, caplog):
    from tiledispatch.core.errors import CacheError

    def full(cache):
        raise CacheError("no space left on the device")
    monkeypatch.setattr(function_keys, "store", full)
    cache = KernelCache(tmp_path / "cache")
    assert function_keys.stored_key(cache, "m.f", lambda: "k1") == "k1"
    assert "computed, not stored" in caplog.text and "no space left" in caplog.text
