"""`tiledispatch warmup SHAPES`: compile ahead of time the kernels a recorded shapes file names."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from ..core.errors import RegistryFormatError
from .common import JOBS_MAX, ExitCode, emit


def warmup_command(shapes: Path = typer.Argument(..., help="a shapes file written by tiledispatch.warmup / save_shapes"),
                   jobs: int = typer.Option(min(os.cpu_count() or 1, JOBS_MAX), "-j", "--jobs", min=1, max=JOBS_MAX,
                                            help="worker processes")) -> None:
    """Compile the kernels of a recorded shapes file into the kernel cache, in parallel."""
    from ..core.dispatcher import default_dispatcher
    from ..recording import build_shapes, load_shapes

    try:
        recorded = load_shapes(shapes)
    except (OSError, ValueError) as e:
        raise RegistryFormatError(f"cannot read shapes file {shapes}: {e}") from None
    dispatcher = default_dispatcher()
    results = build_shapes(recorded, dispatcher=dispatcher, jobs=jobs)
    failed = [r for r in results if not r.ok]
    emit({"status": "ok" if not failed else "failed", "arch": dispatcher.arch.name, "shapes": len(recorded),
          "built": len(results) - len(failed), "failed": [{"kernel": r.name, "error": r.error} for r in failed]})
    if failed:
        raise typer.Exit(ExitCode.FAILED)
