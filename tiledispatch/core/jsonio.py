"""Reading JSON that tiledispatch did not just write: registries, cache manifests, tuning records.

Every such file is untrusted input. It is read through one open file descriptor (so a
FIFO, a device or a symlink swapped in after a check is refused, never waited on or
followed), with its size bounded before it is read and its nesting bounded before it is
parsed: Python's json module recurses once per level, and a file of 100,000 ``[`` would
otherwise end in a RecursionError deep inside the parser.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 64 << 20  # a `full` registry export is about 30 MB
MAX_DEPTH = 32  # a registry entry nests 5 levels; a manifest 3


class JsonFileError(ValueError):
    """A JSON file that cannot be read as asked; the message names the file and says why."""


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuses text whose brackets nest deeper than `max_depth` (strings are skipped)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise JsonFileError(f"nests deeper than {max_depth} levels")
        elif ch in "]}":
            depth -= 1


def loads(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads with nesting bounded; raises JsonFileError."""
    check_depth(text, max_depth)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise JsonFileError(f"is not valid JSON: {e}") from None


def read_json(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
              dir_fd: int | None = None, follow_symlinks: bool = True) -> Any:
    """The JSON document in a regular file of at most `max_bytes`; JsonFileError for anything else.

    `dir_fd` opens `path` relative to an already checked directory; `follow_symlinks=False`
    refuses a symlink in the last component. OSError (missing file, permissions) passes
    through, so callers can tell a missing file from a bad one.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JsonFileError(f"{path} is not a regular file")
        if st.st_size > max_bytes:
            raise JsonFileError(f"{path} has {st.st_size} bytes; at most {max_bytes} are read")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > max_bytes:  # grew while being read
                raise JsonFileError(f"{path} has more than {max_bytes} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonFileError(f"{path} is not UTF-8 text: {e}") from None
    try:
        return loads(text, max_depth=max_depth)
    except JsonFileError as e:
        raise JsonFileError(f"{Path(path)} {e}") from None
