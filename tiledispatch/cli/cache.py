"""`tiledispatch cache ls | info | clear | prune`."""

from __future__ import annotations

from typing import Optional

import typer

from ..core.cache import CacheEntry, KernelCache
from .common import JsonGroup, emit, finite_non_negative

cache_app = typer.Typer(help="Inspect and tidy the on-disk kernel cache.", cls=JsonGroup)


@cache_app.command("ls")
def ls_command() -> None:
    """Every entry: key, size, and whether it verifies."""
    rows = []
    for entry in KernelCache().entries():
        if isinstance(entry, CacheEntry):
            rows.append({"key": entry.key, "bytes": entry.size_bytes, "valid": True,
                         "stage": entry.metadata.get("stage"), "arch": entry.metadata.get("arch")})
        else:
            rows.append({"key": entry.key, "valid": False, "reason": entry.reason})
    emit(rows)


@cache_app.command("info")
def info_command() -> None:
    """Where the cache is, how many entries it holds and how large it is."""
    info = KernelCache().info()
    emit({"root": str(info.root), "entries": info.entries, "invalid": info.invalid, "bytes": info.size_bytes})


@cache_app.command("clear")
def clear_command() -> None:
    """Remove every entry."""
    emit({"removed": KernelCache().clear()})


@cache_app.command("prune")
def prune_command(older_than_days: Optional[float] = typer.Option(
        None, "--older-than-days", callback=finite_non_negative,
        help="also remove entries unused for this many days (a finite number >= 0)")) -> None:
    """Remove corrupted entries, leftovers of dead builds and, optionally, entries unused for long."""
    seconds = older_than_days * 86400 if older_than_days is not None else None
    emit({"removed": KernelCache().prune(older_than_s=seconds)})
