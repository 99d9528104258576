"""Triton's key of a kernel function, kept in the kernel cache so that a fresh process need not compute it.

A compiled kernel's cache key contains its function's key (`core.jitkey`): its source and, transitively,
every jit function it calls and the constexpr globals they read. Computing it imports the kernel's
module and parses and walks those sources again: 60-100 ms for each kernel module a fresh process
meets, most of what a warm-cache first call pays beyond Triton's own import.

That key is a function of the package's sources and the toolchain alone, so it is stored in the
cache as an entry of its own, named by the function and a fingerprint of every source file of the
package and the Triton and PyTorch versions: an edit of any module, or another version, names
another entry. The entry goes through the cache's own checks (checksums, ownership, safe opens), as
a compiled kernel does. A process whose sources changed on disk after it started (a file modified
after `import tiledispatch`) may be running other code than the files say: it neither reads nor
writes these entries, and computes its keys.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from pathlib import Path
from typing import Callable

from .cache import FORMAT_VERSION, KernelCache
from .errors import CacheError

KEY_FILE = "function_key.txt"
STORE = ".function-keys"  # a dot name: the kernel cache lists, prunes and names no entry so
PACKAGE = Path(__file__).resolve().parents[1]

log = logging.getLogger("tiledispatch.kernel")
_LOCK = threading.Lock()
_KNOWN: dict[tuple[str, str], str] = {}  # (cache root, function) -> key: a process reads each entry once


def source_fingerprint(root: Path = PACKAGE, since: float | None = None) -> str | None:
    """The hash of every Python source under `root` (relative path and bytes) and of the Triton and
    PyTorch versions, since a kernel's globals may come from any module; None where a source was
    modified after `since` (default: when the package was imported). The modification times are
    read again on every call: a module imported after such an edit would run the edited code."""
    if since is None:
        from .. import _IMPORTED_AT as since
    sources = sorted(root.rglob("*.py"))
    if any(path.stat().st_mtime >= since for path in sources):
        return None
    return _digest(root, tuple(sources))


@functools.lru_cache(maxsize=4)
def _digest(root: Path, sources: tuple[Path, ...]) -> str:
    import torch
    import triton

    digest = hashlib.sha256(f"triton {triton.__version__}\0torch {torch.__version__}\0".encode())
    for path in sources:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def stored_key(cache: KernelCache, function: str, compute: Callable[[], str]) -> str:
    """`function`'s key (its dotted module.function name) from `cache`: computed by `compute` and stored
    the first time any process asks with these sources."""
    memo = (str(cache.root), function)
    with _LOCK:
        if memo in _KNOWN:
            return _KNOWN[memo]
    fingerprint = source_fingerprint()
    if fingerprint is None:
        return compute()
    entry_key = KernelCache.make_key(f"function-key.{function}"[:160], fingerprint, {"format": KEY_FILE})

    def write(out: Path) -> dict:
        (out / KEY_FILE).write_text(compute())
        return {"function": function}

    try:
        key = store(cache).get_or_build(entry_key, write, required=(KEY_FILE,)).read_bytes(KEY_FILE).decode()
    except (CacheError, OSError) as e:  # a full disk, say: the key is an optimisation, the kernel is not
        log.warning("the key of %s is computed, not stored: %s", function, e)
        key = compute()
    with _LOCK:
        _KNOWN[memo] = key
    return key


def store(cache: KernelCache) -> KernelCache:
    """The keys' own cache, inside `cache`'s versioned directory, with its lock timeout and group."""
    return KernelCache(cache.root / f"v{FORMAT_VERSION}" / STORE, lock_timeout_s=cache.lock_timeout_s,
                       group=cache.access.group or "")
