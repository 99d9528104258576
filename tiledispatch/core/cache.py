"""The on-disk cache of compiled kernel artifacts.

An entry is a directory of files written by a build callback, plus a ``manifest.json``
holding the sha256 of every file. Entries are verified on every load, so a truncated
or tampered entry is rebuilt, never handed to the GPU. Builds happen under a per-key
file lock in a private staging directory that is published with one atomic rename, so
readers see a whole entry or none and concurrent processes build a key once.

Who may write the cache (see :mod:`.cachedir`): by default you alone. The root must be
yours and not writable by group or others; every parent of it must belong to you or to
root and be writable by others only with the sticky bit (``/tmp`` is fine, a
world-writable ``/scratch`` is not), else another user could swap the cache for one of
theirs. ``TILEDISPATCH_CACHE_GROUP=<group>`` opts in to a cache shared by one group's
members: then the root, the versioned directory and every entry must belong to that
group, may be group-writable, and are never writable by others.

What a load guarantees: every operation opens the root afresh by walking down from
``/`` without following symlinks, checking each directory's owner and mode on the
descriptor it opened; the entry and each of its files are then opened relative to that
descriptor with ``O_NOFOLLOW`` and checked the same way, and their bytes are hashed as
they are read. A symlink inside the cache (entry, file, ``.locks``, the versioned
directory) is refused, and a directory swapped after the check cannot redirect a read,
because reads never go through the path again. The files a caller names as
``required`` must be listed by the manifest, and their verified bytes are kept in the
entry (``CacheEntry.read_bytes``); any other file is re-read through its path and its
hash checked again, so a file replaced after verification raises StaleEntryError
rather than being returned.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping


from . import jsonio
from .cachedir import (DIR_FLAGS, FILE_FLAGS, GROUP_ENV, Access, ensure_private_dir, open_child_dir, open_root,
                       read_below, read_fd)
from .errors import CacheError

__all__ = ["FORMAT_VERSION", "MANIFEST", "GROUP_ENV", "Access", "CacheEntry", "CacheInfo", "InvalidEntry",
           "KernelCache", "StaleEntryError", "default_cache_dir", "ensure_private_dir"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_MAX_BYTES = 1 << 20  # a manifest lists a handful of files and a flat metadata dict
MANIFEST_MAX_DEPTH = 8  # a manifest nests 3 levels
STAGING_MAX_AGE_S = 3600.0  # a staging dir this old belongs to a build that died

log = logging.getLogger("tiledispatch.cache")

# Keys become file names: no separators, no leading dot (reserved for .locks, .staging-*),
# and short enough that ".staging-<key>-<pid>-<uuid>" stays under 255 bytes.
_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,159}")
_KEY_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class StaleEntryError(CacheError):
    """An entry changed or vanished after it was verified; looking it up again rebuilds it."""


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
    """A verified entry: every file matched its checksum when it was loaded.

    ``data`` holds the verified bytes of the files the loader asked for (``required``);
    ``read_bytes`` returns those, and checks any other file's hash again as it reads it.
    """

    key: str
    path: Path
    files: Mapping[str, Path]
    metadata: Mapping[str, Any]
    size_bytes: int
    created: float
    digests: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    data: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}), repr=False, compare=False)
    last_used: float = field(default=0.0, compare=False)

    def read_bytes(self, name: str) -> bytes:
        if name in self.data:
            return self.data[name]
        if name not in self.digests:
            raise CacheError(f"cache entry {self.key} has no file {name!r}; it holds {sorted(self.files)}")
        try:
            fd = os.open(self.files[name], FILE_FLAGS)
            try:
                data = read_fd(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise StaleEntryError(f"{name} of cache entry {self.key} cannot be read since it was verified ({e}); "
                                  "look the entry up again") from e
        if hashlib.sha256(data).hexdigest() != self.digests[name]:
            raise StaleEntryError(f"{name} of cache entry {self.key} changed since it was verified; "
                                  "look the entry up again")
        return data


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


@dataclass(frozen=True)
class _Listed:
    """One file of a manifest: what its bytes must hash to."""

    name: str
    sha256: str
    size: int


def _parse_manifest(manifest: Any, key: str) -> tuple[list[_Listed], dict, float] | str:
    """The manifest's files, metadata and creation time, or why it cannot be trusted."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION or manifest.get("key") != key:
        return "manifest has another format or key"
    files, metadata, created = manifest.get("files"), manifest.get("metadata"), manifest.get("created")
    if (not isinstance(files, dict) or not files or not isinstance(metadata, dict)
            or not isinstance(created, (int, float)) or isinstance(created, bool)):
        return "manifest has the wrong shape"
    listed = []
    for name, want in files.items():
        parts = PurePosixPath(name).parts
        if (not name or name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/"))
                or name == MANIFEST or not parts):
            return f"manifest names an unsafe file {name!r}"
        if (not isinstance(want, dict) or not isinstance(want.get("sha256"), str)
                or not _SHA_RE.fullmatch(want["sha256"]) or type(want.get("size")) is not int or want["size"] < 0):
            return f"manifest has a malformed record for {name!r}"
        listed.append(_Listed(name, want["sha256"], want["size"]))
    return listed, metadata, float(created)


def _read_listed(entry_fd: int, item: _Listed, access: Access) -> bytes | str:
    """The verified bytes of one listed file, or why it fails."""
    got = read_below(entry_fd, item.name, access)
    if isinstance(got, str):
        return got
    st, data = got
    if st.st_size != item.size or len(data) != item.size:
        return f"checksum mismatch in {item.name} (size {len(data)}, listed {item.size})"
    if hashlib.sha256(data).hexdigest() != item.sha256:
        return f"checksum mismatch in {item.name}"
    return data


def _write_error(key: str, where: Path, e: OSError) -> CacheError:
    if e.errno in _NO_SPACE:
        return CacheError(
            f"no space left to write cache entry {key} under {where} ({e.strerror}); free disk space "
            "(`tiledispatch cache prune` removes stale entries) or set TILEDISPATCH_CACHE_DIR to a private "
            "directory on a file system with room")
    if isinstance(e, FileNotFoundError):
        return CacheError(
            f"cache entry {key} could not be written under {where}: {e}; its directory was removed meanwhile "
            "(a concurrent `tiledispatch cache clear`?): run again")
    return CacheError(f"cache entry {key} could not be written under {where}: {e}; make that directory "
                      "writable, or set TILEDISPATCH_CACHE_DIR to another private directory")


class KernelCache:
    """Compiled artifacts under ``root/v{FORMAT_VERSION}``; safe to share between processes.

    ``group`` (default ``$TILEDISPATCH_CACHE_GROUP``) opts in to a cache shared by the
    members of that group; see the module docstring.
    """

    def __init__(self, root: Path | str | None = None, *, lock_timeout_s: float = 900.0,
                 group: str | None = None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.lock_timeout_s = lock_timeout_s
        self.access = Access.from_env(group)
        self._dir = self.root / f"v{FORMAT_VERSION}"
        self._locks = self._dir / ".locks"
        with self._versioned():
            pass  # creates and checks the directories now, so a bad root fails early

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

    @contextlib.contextmanager
    def _versioned(self) -> Iterator[int]:
        """A descriptor of the versioned directory, reached through checked directories only."""
        root_fd = open_root(self.root, self.access)
        try:
            fd = open_child_dir(root_fd, self._dir, self.access)
        finally:
            os.close(root_fd)
        try:
            os.close(open_child_dir(fd, self._locks, self.access))
            yield fd
        finally:
            os.close(fd)

    # -- loading -------------------------------------------------------------------------
    def _load(self, fd: int, key: str, required: Iterable[str] = (), touch: bool = False
              ) -> CacheEntry | InvalidEntry | None:
        """Verifies an entry (None if there is none); every failure becomes an InvalidEntry."""
        path = self._dir / key
        try:
            entry_fd = os.open(key, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            reason = "is a symlink or not a directory" if e.errno in (errno.ELOOP, errno.ENOTDIR) else str(e)
            return InvalidEntry(key, path, f"entry {reason}")
        try:
            if (why := self.access.problem(os.fstat(entry_fd))) is not None:
                return InvalidEntry(key, path, f"entry directory {why}")
            return self._verify(entry_fd, key, path, frozenset(required), touch)
        finally:
            os.close(entry_fd)

    def _verify(self, entry_fd: int, key: str, path: Path, required: frozenset[str], touch: bool
                ) -> CacheEntry | InvalidEntry:
        try:
            manifest = jsonio.read_json(MANIFEST, dir_fd=entry_fd, follow_symlinks=False,
                                        max_bytes=MANIFEST_MAX_BYTES, max_depth=MANIFEST_MAX_DEPTH)
            last_used = os.stat(MANIFEST, dir_fd=entry_fd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return InvalidEntry(key, path, "missing manifest.json")
        except (OSError, jsonio.JsonFileError) as e:
            return InvalidEntry(key, path, f"unreadable manifest: {e}")
        parsed = _parse_manifest(manifest, key)
        if isinstance(parsed, str):
            return InvalidEntry(key, path, parsed)
        listed, metadata, created = parsed
        names = {item.name for item in listed}
        if unlisted := sorted(required - names):
            return InvalidEntry(key, path, f"manifest does not list {', '.join(unlisted)}, which the loader reads")
        data = {}
        for item in listed:
            got = _read_listed(entry_fd, item, self.access)
            if isinstance(got, str):
                return InvalidEntry(key, path, got)
            if item.name in required:
                data[item.name] = got
        if touch:
            with contextlib.suppress(OSError):  # last use, for prune(older_than_s=...)
                os.utime(MANIFEST, dir_fd=entry_fd, follow_symlinks=False)
        return CacheEntry(key, path, MappingProxyType({i.name: path.joinpath(*i.name.split("/")) for i in listed}),
                          MappingProxyType(dict(metadata)), sum(i.size for i in listed), created,
                          MappingProxyType({i.name: i.sha256 for i in listed}), MappingProxyType(data), last_used)

    def lookup(self, key: str, *, required: Iterable[str] = ()) -> CacheEntry | None:
        """The verified entry of `key`, or None; an entry whose manifest leaves out a file of
        `required` is invalid."""
        self._path(key)
        with self._versioned() as fd:
            found = self._load(fd, key, required, touch=True)
        return found if isinstance(found, CacheEntry) else None

    # -- building ------------------------------------------------------------------------
    def get_or_build(self, key: str, build: Callable[[Path], Mapping[str, Any] | None], *,
                     required: Iterable[str] = ()) -> CacheEntry:
        """``build(staging_dir)`` writes the artifacts and returns JSON-able metadata (or None).

        An OSError of the build or of publishing (a full disk, a directory removed by a
        concurrent ``clear``) is raised as a CacheError that says what to do.
        """
        self._path(key)
        required = tuple(required)
        with self._versioned() as fd:
            if isinstance(entry := self._load(fd, key, required, touch=True), CacheEntry):
                return entry
            with self._key_lock(key):
                found = self._load(fd, key, required, touch=True)
                if isinstance(found, CacheEntry):
                    return found  # another process built it while we waited
                if found is not None:
                    log.warning("rebuilding invalid cache entry %s: %s", key, found.reason)
                    self._discard(fd, key)
                return self._build(fd, key, build, required)

    @contextlib.contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        from filelock import FileLock, Timeout  # here: its import costs 60 ms, a build far more

        lock = FileLock(self._locks / f"{key}.lock", mode=self.access.file_mode)
        try:
            lock.acquire(timeout=self.lock_timeout_s)
        except Timeout as e:
            raise CacheError(
                f"timed out after {self.lock_timeout_s}s waiting for the build lock of {key} "
                f"({lock.lock_file}); another process may be stuck compiling it") from e
        except OSError as e:
            raise _write_error(key, self._locks, e) from e
        try:
            yield
        finally:
            lock.release()

    def _build(self, fd: int, key: str, build: Callable, required: tuple[str, ...]) -> CacheEntry:
        name = f".staging-{key}-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            try:
                os.close(open_child_dir(fd, self._dir / name, self.access))
                self._write_manifest(self._dir / name, key, build(self._dir / name), required)
                os.rename(name, key, src_dir_fd=fd, dst_dir_fd=fd)
            except OSError as e:
                if isinstance(entry := self._load(fd, key, required), CacheEntry):
                    return entry  # lost a publish race (a lock file was pruned under us); theirs is as good
                raise _write_error(key, self._dir, e) from e
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(name, dir_fd=fd, ignore_errors=True)  # a no-op once published
        entry = self._load(fd, key, required)
        if entry is None:
            raise CacheError(f"cache entry {key} vanished right after its build (a concurrent "
                             "`tiledispatch cache clear`?); run again")
        if isinstance(entry, InvalidEntry):
            raise CacheError(f"cache entry {key} failed verification right after its build: {entry.reason}")
        return entry

    def _write_manifest(self, staging: Path, key: str, metadata: Mapping[str, Any] | None,
                        required: tuple[str, ...]) -> None:
        if metadata is not None and not isinstance(metadata, Mapping):
            raise CacheError(f"the build of {key} returned {type(metadata).__name__}; return a dict or None")
        files = {}
        for p in sorted(staging.rglob("*")):
            name = p.relative_to(staging).as_posix()
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                raise CacheError(f"the build of {key} wrote {name}, which is not a regular file")
            if name == MANIFEST:
                raise CacheError(f"the build of {key} wrote {MANIFEST}, a name the cache reserves")
            self.access.own(p, directory=p.is_dir())
            if p.is_file():
                files[name] = {"sha256": _sha256(p), "size": p.stat().st_size}
        if not files:
            raise CacheError(f"the build of {key} wrote no files into {staging}")
        if missing := sorted(set(required) - set(files)):
            raise CacheError(f"the build of {key} wrote no {', '.join(missing)}, which its loader reads")
        manifest = {"format": FORMAT_VERSION, "key": key, "created": time.time(),
                    "metadata": dict(metadata or {}), "files": files}
        try:
            text = json.dumps(manifest, indent=1, sort_keys=True)
            jsonio.check_depth(text, MANIFEST_MAX_DEPTH)
        except (TypeError, ValueError) as e:
            raise CacheError(f"the metadata of {key} is not JSON-able within {MANIFEST_MAX_DEPTH} levels: {e}") from e
        (staging / MANIFEST).write_text(text)
        self.access.own(staging / MANIFEST, directory=False)

    # -- listing and cleanup ---------------------------------------------------------------
    def _discard(self, fd: int, name: str) -> None:
        """Renames first so readers never see a half-deleted entry, then deletes at leisure."""
        trash = f".trash-{uuid.uuid4().hex}"
        try:
            os.rename(name, trash, src_dir_fd=fd, dst_dir_fd=fd)
        except FileNotFoundError:
            return
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.stat(trash, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(trash, dir_fd=fd, ignore_errors=True)
            else:
                os.unlink(trash, dir_fd=fd)

    @staticmethod
    def _children(fd: int) -> list[str]:
        return sorted(name for name in os.listdir(fd) if name != ".locks")

    def entries(self) -> list[CacheEntry | InvalidEntry]:
        with self._versioned() as fd:
            found = [self._load(fd, name) for name in self._children(fd) if not name.startswith(".")]
        return [e for e in found if e is not None]  # None: removed by another process meanwhile

    def info(self) -> CacheInfo:
        """``size_bytes`` is everything under the versioned dir, what ``clear`` would free."""
        found = self.entries()
        size = 0
        with self._versioned() as fd:
            for _, _, names, dir_fd in os.fwalk(".", dir_fd=fd):
                for name in names:
                    with contextlib.suppress(FileNotFoundError):  # removed by another process meanwhile
                        size += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
        valid = sum(isinstance(e, CacheEntry) for e in found)
        return CacheInfo(self.root, valid, len(found) - valid, size)

    def clear(self) -> int:
        """Also removes in-flight staging dirs: a build racing a clear fails rather than publishes."""
        removed = 0
        with self._versioned() as fd:
            for name in self._children(fd):
                removed += not name.startswith(".")
                self._discard(fd, name)
        return removed

    def prune(self, *, older_than_s: float | None = None) -> int:
        """Returns entries plus dead staging dirs removed; lock files are bookkeeping and not counted."""
        now, removed = time.time(), 0
        with self._versioned() as fd:
            for name in self._children(fd):
                try:
                    age = now - os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
                except FileNotFoundError:
                    continue  # removed by another process meanwhile
                if name.startswith(".trash-") or (name.startswith(".staging-") and age > STAGING_MAX_AGE_S):
                    removed += name.startswith(".staging-")
                    self._discard(fd, name)
                elif not name.startswith("."):
                    removed += self._prune_entry(fd, name, now, older_than_s)
            for lock_file in self._locks.glob("*.lock"):
                self._under_lock(lock_file, lambda lf=lock_file: self._drop_stale_lock(fd, lf))
        return removed

    @staticmethod
    def _drop_stale_lock(fd: int, lock_file: Path) -> None:
        # Unlinking while holding it is safe with filelock: a waiter that then wins the
        # unlinked inode sees st_nlink == 0 and retries on the path.
        with contextlib.suppress(FileNotFoundError):
            os.stat(lock_file.name[: -len(".lock")], dir_fd=fd, follow_symlinks=False)
            return
        lock_file.unlink(missing_ok=True)

    def _prune_entry(self, fd: int, name: str, now: float, older_than_s: float | None) -> int:
        def stale() -> bool:
            entry = self._load(fd, name)
            if entry is None:
                return False
            if isinstance(entry, CacheEntry) and (older_than_s is None or now - entry.last_used <= older_than_s):
                return False
            self._discard(fd, name)
            return True
        return int(bool(self._under_lock(self._locks / f"{name}.lock", stale)))

    def _under_lock(self, lock_file: Path, action: Callable[[], Any]) -> Any:
        """Runs action only if nobody holds the key's lock: a key being rebuilt is left alone."""
        from filelock import FileLock, Timeout

        lock = FileLock(lock_file, mode=self.access.file_mode)
        try:
            lock.acquire(blocking=False)
        except Timeout:
            return None
        try:
            return action()
        finally:
            lock.release()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

