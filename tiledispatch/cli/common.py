"""What every CLI command shares: JSON output, and TiledispatchError as a clean exit."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import typer

from ..core.errors import TiledispatchError

EXIT_ERROR = 2  # bad input or an unusable setup
EXIT_FAILED = 1  # ran, but validation failed


def emit(document: Any) -> None:
    typer.echo(json.dumps(document, indent=2, default=str))


def json_errors(fn: Callable) -> Callable:
    """Turns a TiledispatchError into a JSON error document and a non-zero exit, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (TiledispatchError, OSError) as e:  # OSError: a file the user named is unusable
            emit({"status": "error", "error": {"type": type(e).__name__, "message": str(e)}})
            sys.exit(EXIT_ERROR)

    return wrapper
