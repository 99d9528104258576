"""What every CLI command shares: JSON output, and TiledispatchError as a clean exit."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import typer

from ..core.dispatcher import Dispatcher, Strategy
from ..core.errors import TiledispatchError
from ..core.op import OpKind
from ..core.registry import Registry
from ..core.runtime import current_arch

EXIT_ERROR = 2  # bad input or an unusable setup
EXIT_FAILED = 1  # ran, but validation failed

RULE_SET = typer.Option("default", help="tiny, tests, default, full")
STRATEGY = typer.Option("rules", help="rules or first")


def dispatcher_for(op: OpKind, rule_set: str, strategy: str) -> Dispatcher:
    """This machine's dispatcher over one op's rule set, as the op commands' options ask."""
    arch = current_arch()
    return Dispatcher(Registry.from_rule_set(op, rule_set, arch), arch, strategy=Strategy.parse(strategy))


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
