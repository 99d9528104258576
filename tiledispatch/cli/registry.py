"""`tiledispatch registry list | export | import` and `tiledispatch build`."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import arch as arch_facts
from ..core.cache import KernelCache
from ..core.errors import UnsupportedError
from ..core.kernel import build_all
from ..core.op import OpKind, RuleSet
from ..core.registry import Registry
from ..core.runtime import current_arch
from .common import JOBS_MAX, ExitCode, JsonGroup, check_dtype_name, emit, limit_option, parse_option

registry_app = typer.Typer(help="Generate, inspect, export and import kernel registries.", cls=JsonGroup)

OP = typer.Option("gemm", "--op", help="gemm, conv or attention")
RULE_SET = typer.Option("default", "--rule-set", help="tiny, tests, default, full")
ARCH = typer.Option(None, "--arch", help="sm_80 ... sm_120 or interpreter (default: this machine)")
DTYPE = typer.Option(None, "--dtype", help="keep kernels of this dtype name, e.g. bf16")
FAMILY = typer.Option(None, "--family", help="keep kernels of this family")
NAME = typer.Option(None, "--name-contains", help="keep kernels whose name contains this text")


def _output(path: Path) -> Path:
    """A file to write a registry to: new, or a regular file. Writing to a FIFO would wait for a
    reader, forever if none comes; a device or a directory cannot hold the registry."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing (it is created), or unusable: `save` reports it
        return path
    if not stat.S_ISREG(mode):
        raise UnsupportedError(f"-o {path} is not a regular file; give a new or regular file's path")
    return path


def _arch(name: Optional[str]):
    return parse_option("--arch", arch_facts.load, name) if name is not None else current_arch()


def _selection(op, rule_set, dtype) -> tuple[OpKind, RuleSet]:
    """The op and rule set the options name, each error naming its option."""
    check_dtype_name("--dtype", dtype)
    return parse_option("--op", OpKind.parse, op), parse_option("--rule-set", RuleSet.parse, rule_set)


def _generate(op, rule_set, arch_name, dtype=None, family=None, contains=None) -> Registry:
    kind, rules = _selection(op, rule_set, dtype)
    registry = Registry.from_rule_set(kind, rules, _arch(arch_name))
    return registry.filter(lambda s: (dtype is None or s.dtype == dtype) and (family is None or s.family == family)
                           and (contains is None or contains in s.name))


@registry_app.command("list")
def list_command(op: str = OP, rule_set: str = RULE_SET, arch: Optional[str] = ARCH, dtype: Optional[str] = DTYPE,
                 family: Optional[str] = FAMILY, name_contains: Optional[str] = NAME,
                 limit: int = limit_option(50, "names shown")) -> None:
    """Counts of a rule set's kernels on an arch, and their names."""
    registry = _generate(op, rule_set, arch, dtype, family, name_contains)
    names = [spec.name for spec in registry]
    emit({"total": len(names), "counts": registry.counts(), "kernels": names[:limit] if limit else names})


@registry_app.command("export")
def export_command(output: Path = typer.Option(Path("registry.json"), "-o", "--output", help="file to write"),
                   op: str = OP, rule_set: str = RULE_SET, arch: Optional[str] = ARCH, dtype: Optional[str] = DTYPE,
                   family: Optional[str] = FAMILY, name_contains: Optional[str] = NAME) -> None:
    """Write a rule set's registry to JSON (metadata, then one entry per kernel with its full config)."""
    registry = _generate(op, rule_set, arch, dtype, family, name_contains)
    registry.save(_output(output))
    emit({"status": "ok", "written": str(output), "total": len(registry), "counts": registry.counts()})


@registry_app.command("import")
def import_command(path: Path = typer.Argument(..., help="a registry JSON file"),
                   output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                         help="write it back out here")) -> None:
    """Read a registry file, checking every entry; optionally write it back (a round trip)."""
    registry = Registry.load(path)
    if output is not None:
        registry.save(_output(output))
    emit({"status": "ok", "read": str(path), "total": len(registry), "counts": registry.counts(),
          **({"written": str(output)} if output else {})})


def build_command(op: str = OP, rule_set: str = RULE_SET,
                  arch: str = typer.Option(..., "--arch", help="target arch, e.g. sm_90 (no GPU needed)"),
                  jobs: int = typer.Option(min(os.cpu_count() or 1, JOBS_MAX), "-j", "--jobs", min=1, max=JOBS_MAX,
                                           help="worker processes"),
                  dtype: Optional[str] = DTYPE, family: Optional[str] = FAMILY, name_contains: Optional[str] = NAME,
                  limit: int = limit_option(0, "build at most this many")) -> None:
    """Compile a rule set ahead of time into the kernel cache, in parallel."""
    target = _arch(arch)
    _selection(op, rule_set, dtype)  # a bad option is refused for the interpreter too
    if target.is_interpreter:
        emit({"status": "ok", "built": 0, "note": "interpreter kernels are not compiled"})
        return
    specs = list(_generate(op, rule_set, arch, dtype, family, name_contains))
    specs = specs[:limit] if limit else specs
    cache = KernelCache()
    columns = (TextColumn("[bold]build[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    # Progress goes to stderr: stdout carries the JSON document only, for `| jq` and scripts.
    with Progress(*columns, transient=False, redirect_stdout=False, console=Console(stderr=True)) as progress:
        task = progress.add_task(f"{op}/{rule_set} for {target.name}", total=len(specs))
        results = build_all(specs, cache, jobs, on_done=lambda r: progress.advance(task))
    failed = [r for r in results if not r.ok]
    emit({"status": "ok" if not failed else "failed", "arch": target.name, "cache": str(cache.root),
          "built": len(results) - len(failed), "failed": [{"kernel": r.name, "error": r.error} for r in failed],
          "seconds": round(sum(r.seconds for r in results), 2)})
    if failed:
        raise typer.Exit(ExitCode.FAILED)
