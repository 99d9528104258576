"""Who may write the kernel cache, and opening its directories so that nobody else can swap them.

Artifacts of the cache are loaded into the GPU and run, so whoever can write the cache
directory, or rename it or one of its parents, can run code as you. ``Access`` is the
rule: by default the root and everything in it belong to you and are writable by you
alone; with ``TILEDISPATCH_CACHE_GROUP=<group>`` they belong to that group, may be
group-writable and are never writable by others. Every parent of the root must belong to
you or to root (or, for a group cache, to the group) and be writable by others only with
the sticky bit (``/tmp``), else its owner or anyone could replace the root with theirs.

``open_root`` walks down from ``/`` one component at a time with ``O_NOFOLLOW``,
checking each directory on the descriptor it opened (``fstat``), and returns the root's
descriptor: what is read through it afterwards comes from the directory that was checked,
whatever happens to the paths meanwhile. Symlinks in the root's path itself are resolved
first (a root reached through ``~/cache -> /scratch/me/cache`` is the real directory, and
its real parents are checked); below the root, nothing may be a symlink.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import CacheError, InsecureCacheError

GROUP_ENV = "TILEDISPATCH_CACHE_GROUP"
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC


@dataclass(frozen=True)
class Access:
    """Who may write the cache: its owner alone (``gid`` None), or the members of one group."""

    uid: int
    gid: int | None = None
    group: str | None = None

    @classmethod
    def from_env(cls, group: str | None = None) -> "Access":
        """`group`, else ``$TILEDISPATCH_CACHE_GROUP``; unset or empty means owner-only."""
        name = group if group is not None else os.environ.get(GROUP_ENV, "")
        if not name:
            return cls(os.getuid())
        try:
            gid = grp.getgrnam(name).gr_gid
        except KeyError:
            raise CacheError(f"{GROUP_ENV}={name!r} names no group of this machine; give the name of a group "
                             "you belong to, or unset it for a cache only you can write") from None
        if gid != os.getgid() and gid not in os.getgroups():
            raise CacheError(f"{GROUP_ENV}={name!r}: you are not a member of group {name}; join it, or unset "
                             f"{GROUP_ENV} for a cache only you can write")
        return cls(os.getuid(), gid, name)

    @property
    def dir_mode(self) -> int:
        return 0o700 if self.gid is None else 0o2770  # setgid: what members create stays in the group

    @property
    def file_mode(self) -> int:
        return 0o600 if self.gid is None else 0o660

    def problem(self, st: os.stat_result) -> str | None:
        """Why a directory or file inside the cache (the root included) cannot be trusted, or None."""
        mode = stat.S_IMODE(st.st_mode)
        if self.gid is None:
            if st.st_uid != self.uid:
                return f"is owned by uid {st.st_uid}, not by you (uid {self.uid})"
            if mode & 0o022:
                return f"is writable by group or others (mode {oct(mode)})"
        else:
            if st.st_gid != self.gid:
                return f"belongs to gid {st.st_gid}, not to group {self.group} (gid {self.gid})"
            if mode & 0o002:
                return f"is writable by others (mode {oct(mode)})"
        return None

    def parent_problem(self, st: os.stat_result) -> str | None:
        """Why a parent of the root lets someone else swap the cache, or None."""
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (self.uid, 0) and (self.gid is None or st.st_gid != self.gid):
            return f"is owned by uid {st.st_uid}, neither you nor root, who could replace the cache inside it"
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return (f"is writable by others without the sticky bit (mode {oct(mode)}), so anyone could "
                    "replace the cache inside it")
        return None

    def own(self, path: Path, *, directory: bool) -> None:
        """Gives a file or directory the build just wrote the cache's mode (and group)."""
        os.chmod(path, self.dir_mode if directory else self.file_mode)
        if self.gid is not None:
            os.chown(path, -1, self.gid)


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def root_advice(root: Path, st: os.stat_result | None, access: Access) -> str:
    """What to do about an insecure root: a private directory of your own, never a chmod of a
    directory others may use (the root may well be /tmp or a shared scratch space)."""
    if st is not None and access.parent_problem(st) is None:
        suggestion = root / f"tiledispatch-{_user()}"  # a private subdirectory of it is safe
    else:
        suggestion = Path.home() / ".cache" / "tiledispatch"
    group = (f"; for a cache shared by a group, set {GROUP_ENV} to its name" if access.gid is None
             else f"; or make it belong to group {access.group} with `chgrp {access.group}` and `chmod o-w`")
    return (f"set TILEDISPATCH_CACHE_DIR to a private directory instead, e.g. `mkdir -m 700 {suggestion}` "
            f"and TILEDISPATCH_CACHE_DIR={suggestion}{group}")


def _fail(path: Path, why: str, advice: str) -> InsecureCacheError:
    return InsecureCacheError(f"cache directory {path} {why}; {advice}")


def _make_missing(root: Path, access: Access) -> None:
    """Creates the root and its missing parents: the root with the cache's mode, parents
    owner-only (group-traversable for a group cache)."""
    missing = [p for p in (root, *root.parents) if not os.path.lexists(p)]
    for p in reversed(missing):
        mode = access.dir_mode if p == root else (0o700 if access.gid is None else 0o2750)
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            continue  # another process created it first; checked below like any existing dir
        fd = os.open(p, DIR_FLAGS)
        try:
            os.fchmod(fd, mode)  # mkdir's mode is filtered by the umask
            if access.gid is not None:
                os.fchown(fd, -1, access.gid)
        finally:
            os.close(fd)


def open_root(root: Path, access: Access) -> int:
    """The root's descriptor, created if missing, reached through checked parents only."""
    try:
        _make_missing(root, access)
        real = Path(os.path.realpath(root))
        fd = os.open("/", DIR_FLAGS)
    except OSError as e:
        raise CacheError(f"cannot create cache directory {root}: {e}; "
                         "set TILEDISPATCH_CACHE_DIR to a writable directory") from e
    here = at = Path("/")
    try:
        for part in real.parts[1:]:
            if (why := access.parent_problem(os.fstat(fd))) is not None:
                raise InsecureCacheError(f"{here}, a parent of cache directory {root}, {why}; "
                                         + root_advice(root, None, access))
            at = here / part
            fd, old = os.open(part, DIR_FLAGS, dir_fd=fd), fd
            os.close(old)
            here = at
        st = os.fstat(fd)
        if (why := access.problem(st)) is not None:
            raise _fail(root, why, root_advice(root, st, access))
        return fd
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InsecureCacheError(f"{at} in the path of cache directory {root} was replaced while it "
                                     "was being opened (a symlink or not a directory); "
                                     + root_advice(root, None, access)) from e
        raise CacheError(f"cannot open cache directory {root}: {e}; "
                         "set TILEDISPATCH_CACHE_DIR to a private directory") from e
    except BaseException:
        os.close(fd)
        raise


def open_child_dir(parent_fd: int, path: Path, access: Access) -> int:
    """The descriptor of directory `path.name` below `parent_fd`, created if missing; it must be
    a real directory (not a symlink) that passes ``access``."""
    try:
        try:
            os.mkdir(path.name, access.dir_mode, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            created = False
        fd = os.open(path.name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InsecureCacheError(f"cache directory {path} is a symlink or not a directory; the cache never "
                                     f"follows one: remove it (`rm {path}`) and run again") from e
        raise CacheError(f"cannot create cache directory {path}: {e}; "
                         "set TILEDISPATCH_CACHE_DIR to a writable private directory") from e
    try:
        if created:
            os.fchmod(fd, access.dir_mode)
            if access.gid is not None:
                os.fchown(fd, -1, access.gid)
        st = os.fstat(fd)
        if (why := access.problem(st)) is not None:
            fix = (f"it holds only tiledispatch's files: run `chmod {oct(access.dir_mode)[2:]} {path}`"
                   if st.st_uid == access.uid else f"remove it (`rm -r {path}`)")
            raise _fail(path, why, f"{fix}, or set TILEDISPATCH_CACHE_DIR to a private directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def read_below(dir_fd: int, name: str, access: Access) -> tuple[os.stat_result, bytes] | str:
    """The bytes of regular file `name` ("a/b" allowed) below `dir_fd`, every component opened
    without following symlinks and checked by ``access``; or why it cannot be read."""
    *dirs, leaf = name.split("/")
    fds = [dir_fd]
    try:
        for part in dirs:
            fds.append(os.open(part, DIR_FLAGS, dir_fd=fds[-1]))
            if (why := access.problem(os.fstat(fds[-1]))) is not None:
                return f"directory of {name} {why}"
        fd = os.open(leaf, FILE_FLAGS, dir_fd=fds[-1])
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return f"{name} is not a regular file"
            if (why := access.problem(st)) is not None:
                return f"{name} {why}"
            return st, read_fd(fd)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return f"missing file {name}"
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return f"{name} is a symlink or lies below one"
        return f"cannot read {name}: {e}"
    finally:
        for fd in fds[1:]:
            os.close(fd)


def ensure_private_dir(path: Path, access: Access | None = None) -> None:
    """Creates `path` if missing and checks it as a cache root (the tuning store's directory)."""
    os.close(open_root(Path(path), access if access is not None else Access.from_env()))
