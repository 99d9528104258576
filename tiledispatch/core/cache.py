"""The on-disk cache of compiled kernel artifacts.

An entry is a directory of files written by a build callback, plus a ``manifest.json``
holding the sha256 of every file. Entries are verified on every load, so a truncated
or tampered entry is rebuilt, never handed to the GPU. Builds happen under a per-key
file lock in a private staging directory that is published with one atomic
``os.rename``, so readers see a whole entry or none and concurrent processes build a
key once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, Callable, Mapping

from filelock import FileLock, Timeout

from .errors import CacheError, InsecureCacheError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STAGING_MAX_AGE_S = 3600.0  # a staging dir this old belongs to a build that died

log = logging.getLogger("tiledispatch.cache")

# Keys become file names: no separators, no leading dot (reserved for .locks, .staging-*),
# and short enough that ".staging-<key>-<pid>-<uuid>" stays under 255 bytes.
_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,159}")
_KEY_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


def default_cache_dir() -> Path:
    """$TILEDISPATCH_CACHE_DIR, else $XDG_CACHE_HOME/tiledispatch, else ~/.cache/tiledispatch."""
    if explicit := os.environ.get("TILEDISPATCH_CACHE_DIR"):
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return Path(xdg) / "tiledispatch"
    return Path.home() / ".cache" / "tiledispatch"


@dataclass(frozen=True)
class CacheEntry:
    """A verified entry: every file matched its checksum when it was loaded."""

    key: str
    path: Path
    files: Mapping[str, Path]
    metadata: Mapping[str, Any]
    size_bytes: int
    created: float

    def read_bytes(self, name: str) -> bytes:
        return self.files[name].read_bytes()


@dataclass(frozen=True)
class InvalidEntry:
    """An entry that fails verification; ``reason`` says why, for ``tiledispatch cache`` listings."""

    key: str
    path: Path
    reason: str


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    entries: int
    invalid: int
    size_bytes: int


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _ensure_private_dir(path: Path) -> None:
    """Artifacts are loaded into the GPU and run, so a directory others can write to is refused."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        for p in reversed(missing):
            try:
                p.mkdir(mode=0o700)
                os.chmod(p, 0o700)  # mkdir's mode is filtered by the umask
            except FileExistsError:
                pass  # another process created it first; checked below like any existing dir
        st = path.stat()
    except OSError as e:
        raise CacheError(f"cannot create cache directory {path}: {e}; "
                         "set TILEDISPATCH_CACHE_DIR to a writable directory") from e
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"cache path {path} is not a directory; set TILEDISPATCH_CACHE_DIR to a directory")
    mode = oct(stat.S_IMODE(st.st_mode))
    if st.st_mode & 0o022:
        raise InsecureCacheError(
            f"cache directory {path} is writable by group or others (mode {mode}); "
            f"run `chmod 700 {path}` or set TILEDISPATCH_CACHE_DIR to a private directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise InsecureCacheError(
            f"cache directory {path} (mode {mode}) is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
            f"set TILEDISPATCH_CACHE_DIR to a directory you own and `chmod 700` it")


class KernelCache:
    """Compiled artifacts under ``root/v{FORMAT_VERSION}``; safe to share between processes."""

    def __init__(self, root: Path | str | None = None, *, lock_timeout_s: float = 900.0):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.lock_timeout_s = lock_timeout_s
        self._dir = self.root / f"v{FORMAT_VERSION}"
        _ensure_private_dir(self.root)
        _ensure_private_dir(self._dir)
        self._locks = self._dir / ".locks"
        self._locks.mkdir(mode=0o700, exist_ok=True)

    @staticmethod
    def make_key(name: str, source_hash: str, toolchain: Mapping[str, str]) -> str:
        """The name keeps keys readable in listings; the hash makes them change with source or toolchain."""
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise CacheError(
                f"kernel name {name!r} cannot be used in a cache key; use 1-160 characters "
                "from A-Z a-z 0-9 . _ - that do not start with '.'")
        blob = json.dumps([name, source_hash, sorted((str(k), str(v)) for k, v in toolchain.items())])
        return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    def _path(self, key: str) -> Path:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise CacheError(f"invalid cache key {key!r}; build keys with KernelCache.make_key")
        return self._dir / key

    def _load(self, key: str, path: Path) -> CacheEntry | InvalidEntry:
        """Verifies an entry; every failure becomes an InvalidEntry so corruption never raises."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            if manifest.get("format") != FORMAT_VERSION or manifest.get("key") != key:
                return InvalidEntry(key, path, "manifest has another format or key")
            files, size = {}, 0
            for name, want in manifest["files"].items():
                parts = PurePosixPath(name).parts
                if PurePosixPath(name).is_absolute() or ".." in parts or name == MANIFEST:
                    return InvalidEntry(key, path, f"manifest names an unsafe file {name!r}")
                file = path.joinpath(*parts)
                if file.is_symlink() or not file.is_file():
                    return InvalidEntry(key, path, f"missing file {name}")
                if file.stat().st_size != want["size"] or _sha256(file) != want["sha256"]:
                    return InvalidEntry(key, path, f"checksum mismatch in {name}")
                files[name], size = file, size + want["size"]
            return CacheEntry(key, path, MappingProxyType(files), MappingProxyType(dict(manifest["metadata"])),
                              size, float(manifest["created"]))
        except FileNotFoundError:
            return InvalidEntry(key, path, "missing manifest.json")
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            return InvalidEntry(key, path, f"unreadable manifest: {e}")

    def lookup(self, key: str) -> CacheEntry | None:
        path = self._path(key)
        if not path.exists():
            return None
        entry = self._load(key, path)
        if isinstance(entry, InvalidEntry):
            return None
        try:
            os.utime(path / MANIFEST)  # last use, for prune(older_than_s=...)
        except OSError:
            pass
        return entry

    def get_or_build(self, key: str, build: Callable[[Path], Mapping[str, Any] | None]) -> CacheEntry:
        """``build(staging_dir)`` writes the artifacts and returns JSON-able metadata (or None)."""
        final = self._path(key)
        if (entry := self.lookup(key)) is not None:
            return entry
        lock = FileLock(self._locks / f"{key}.lock")
        try:
            lock.acquire(timeout=self.lock_timeout_s)
        except Timeout as e:
            raise CacheError(
                f"timed out after {self.lock_timeout_s}s waiting for the build lock of {key} "
                f"({lock.lock_file}); another process may be stuck compiling it") from e
        try:
            if (entry := self.lookup(key)) is not None:
                return entry  # another process built it while we waited
            if final.exists() or final.is_symlink():
                old = self._load(key, final)
                log.warning("rebuilding invalid cache entry %s: %s", key, getattr(old, "reason", "?"))
                self._discard(final)
            staging = self._dir / f".staging-{key}-{os.getpid()}-{uuid.uuid4().hex}"
            try:
                staging.mkdir(mode=0o700)
                self._write_manifest(staging, key, build(staging))
                try:
                    os.rename(staging, final)
                except OSError as e:
                    if isinstance(entry := self._load(key, final), CacheEntry):
                        return entry  # lost a publish race (a lock file was pruned under us); theirs is as good
                    raise CacheError(f"could not publish cache entry {key} to {final}: {e}") from e
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # a no-op once published
            entry = self._load(key, final)
            if isinstance(entry, InvalidEntry):
                raise CacheError(f"cache entry {key} failed verification right after its build: {entry.reason}")
            return entry
        finally:
            lock.release()

    @staticmethod
    def _write_manifest(staging: Path, key: str, metadata: Mapping[str, Any] | None) -> None:
        if metadata is not None and not isinstance(metadata, Mapping):
            raise CacheError(f"the build of {key} returned {type(metadata).__name__}; return a dict or None")
        files = {}
        for p in sorted(staging.rglob("*")):
            name = p.relative_to(staging).as_posix()
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                raise CacheError(f"the build of {key} wrote {name}, which is not a regular file")
            if name == MANIFEST:
                raise CacheError(f"the build of {key} wrote {MANIFEST}, a name the cache reserves")
            if p.is_file():
                files[name] = {"sha256": _sha256(p), "size": p.stat().st_size}
        if not files:
            raise CacheError(f"the build of {key} wrote no files into {staging}")
        manifest = {"format": FORMAT_VERSION, "key": key, "created": time.time(),
                    "metadata": dict(metadata or {}), "files": files}
        try:
            text = json.dumps(manifest, indent=1, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise CacheError(f"the metadata of {key} is not JSON-able: {e}") from e
        (staging / MANIFEST).write_text(text)

    def _discard(self, path: Path) -> None:
        """Renames first so readers never see a half-deleted entry, then deletes at leisure."""
        trash = self._dir / f".trash-{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        if trash.is_dir() and not trash.is_symlink():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)

    def _children(self) -> list[Path]:
        return sorted(p for p in self._dir.iterdir() if p.name != ".locks")

    def entries(self) -> list[CacheEntry | InvalidEntry]:
        return [self._load(p.name, p) for p in self._children() if not p.name.startswith(".")]

    def info(self) -> CacheInfo:
        """``size_bytes`` is everything under the versioned dir, what ``clear`` would free."""
        found = self.entries()
        size = 0
        for dirpath, _, names in os.walk(self._dir):
            for name in names:
                try:
                    size += os.lstat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass  # removed by another process meanwhile
        valid = sum(isinstance(e, CacheEntry) for e in found)
        return CacheInfo(self.root, valid, len(found) - valid, size)

    def clear(self) -> int:
        """Also removes in-flight staging dirs: a build racing a clear fails rather than publishes."""
        removed = 0
        for p in self._children():
            removed += not p.name.startswith(".")
            self._discard(p)
        return removed

    def prune(self, *, older_than_s: float | None = None) -> int:
        """Returns entries plus dead staging dirs removed; lock files are bookkeeping and not counted."""
        now, removed = time.time(), 0
        for p in self._children():
            try:
                age = now - p.lstat().st_mtime
            except FileNotFoundError:
                continue  # removed by another process meanwhile
            if p.name.startswith(".trash-") or (p.name.startswith(".staging-") and age > STAGING_MAX_AGE_S):
                removed += p.name.startswith(".staging-")
                self._discard(p)
            elif not p.name.startswith("."):
                removed += self._prune_entry(p, now, older_than_s)
        for lock_file in self._locks.glob("*.lock"):
            self._under_lock(lock_file, lambda lf=lock_file: self._drop_stale_lock(lf))
        return removed

    def _drop_stale_lock(self, lock_file: Path) -> None:
        # Unlinking while holding it is safe with filelock: a waiter that then wins the
        # unlinked inode sees st_nlink == 0 and retries on the path.
        if not (self._dir / lock_file.name[: -len(".lock")]).exists():
            lock_file.unlink(missing_ok=True)

    def _prune_entry(self, path: Path, now: float, older_than_s: float | None) -> int:
        def stale() -> bool:
            entry = self._load(path.name, path) if path.exists() else None
            if entry is None:
                return False
            if isinstance(entry, CacheEntry) and (
                    older_than_s is None or now - (path / MANIFEST).stat().st_mtime <= older_than_s):
                return False
            self._discard(path)
            return True
        return int(bool(self._under_lock(self._locks / f"{path.name}.lock", stale)))

    @staticmethod
    def _under_lock(lock_file: Path, action: Callable[[], Any]) -> Any:
        """Runs action only if nobody holds the key's lock: a key being rebuilt is left alone."""
        lock = FileLock(lock_file)
        try:
            lock.acquire(blocking=False)
        except Timeout:
            return None
        try:
            return action()
        finally:
            lock.release()
