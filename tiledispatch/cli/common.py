"""What every CLI command shares: JSON output, checked options, and the documented exit codes.

Every outcome of a command line is one JSON document on stdout and one of the `ExitCode`s;
`--help` alone prints text. The app's top group (`JsonGroup`) runs click without its
standalone mode, so that click's usage errors, tiledispatch's own errors and any bug all
reach one handler (`run_guarded`), which turns each into its JSON error document.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import re
import sys
from typing import Any, Callable, Optional, TypeVar

import typer
from typer.core import TyperGroup

from ..core.dispatcher import Dispatcher, Strategy
from ..core.errors import TiledispatchError, UnsupportedError
from ..core.op import OpKind, RuleSet
from ..core.registry import Registry
from ..core.runtime import current_arch

try:  # typer vendors click as typer._click; older typers depend on click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors

T = TypeVar("T")

DEBUG_ENV = "TILEDISPATCH_DEBUG"  # "1": an internal error re-raises, traceback and all
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed
REPEATS_MAX = 100_000
JOBS_MAX = 1024
BUG_HINT = ("this is a bug in tiledispatch: please report it with the command line that raised it; "
            f"{DEBUG_ENV}=1 shows the traceback")
# The optional packages some commands import, by module, and the extra of pyproject.toml that brings each.
EXTRA_OF = {"pandas": "selection", "pyarrow": "selection", "dask": "distributed", "distributed": "distributed",
            "matplotlib": "bench"}


class ExitCode(enum.IntEnum):
    """The exit status of `tiledispatch`; README's "Exit codes" table lists the same."""

    OK = 0
    FAILED = 1  # it ran, and the result failed validation (or a build failed)
    USAGE = 2  # the command line cannot be parsed: unknown option, wrong type, missing argument
    BAD_INPUT = 3  # a TiledispatchError: the problem, registry or file is invalid or unsupported
    INTERNAL = 4  # any other exception: a bug
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    BROKEN_PIPE = 141  # the reader of stdout went away (128 + SIGPIPE)


# --- options shared by the commands --------------------------------------------------------

RULE_SET = typer.Option("default", "--rule-set", help="tiny, tests, default, full")
STRATEGY = typer.Option("rules", "--strategy", help="rules, first, autotune or model")
EXPLAIN_ARCH = typer.Option(None, "--arch", help="rank for this arch (sm_90, sm_80, ...; default: this machine's): "
                            "explaining runs nothing, so any arch's facts and models serve")


def seed_option() -> Any:
    return typer.Option(0, "--seed", min=0, max=SEED_MAX, help="seed of the random inputs (0 .. 2**63-1)")


def repeats_option(default: int) -> Any:
    return typer.Option(default, "--repeats", min=1, max=REPEATS_MAX, help="timed runs on the GPU (median)")


def limit_option(default: int, what: str) -> Any:
    return typer.Option(default, "--limit", min=0, help=f"{what} (0: all)")


def finite_non_negative(value: Optional[float]) -> Optional[float]:
    """A typer callback: NaN, infinities and negative numbers are usage errors (NaN compares
    false with every bound, so a range alone lets it through)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"{value} is not a finite number >= 0; give e.g. 30")
    return value


def kernel_name(value: Optional[str]) -> Optional[str]:
    """A typer callback for the options that force a kernel: an empty name would read as no
    option at all, and select a kernel while the output says one was forced."""
    if value is not None and not value.strip():
        raise typer.BadParameter("an empty name forces no kernel: give a name (`tiledispatch explain` ranks them) "
                                 "or leave the option out")
    return value


def shown(value: Any, width: int = 60) -> str:
    """`value` quoted for an error message, cut short: a value may be 5,000 characters long."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 5] + "...'"


def parse_option(option: str, parse: Callable[[Any], T], value: Any) -> T:
    """`parse(value)`, with an error that names the option: `--dtype 'x': unknown dtype 'x'; use ...`.
    A ValueError of the parser (not a TiledispatchError) becomes an UnsupportedError."""
    try:
        return parse(value)
    except TiledispatchError as e:
        message = f"{option} {shown(value)}: {e}"
        try:
            renamed = type(e)(message)
        except Exception:  # an error class whose constructor takes more than a message
            renamed = UnsupportedError(message)
        raise renamed from None
    except (ValueError, TypeError, KeyError) as e:
        raise UnsupportedError(f"{option} {shown(value)}: {e}") from None


_DTYPE_PART = re.compile(r"(acc)?(fp16|bf16|fp32|tf32|fp64|fp8e4m3|fp8e5m2)")  # GemmTypes.name's parts


def check_dtype_name(option: str, value: Optional[str]) -> Optional[str]:
    """A kernel dtype name as the registries spell it (`fp16`, `fp16-fp32`, `fp8e4m3xfp8e5m2-bf16`),
    so that a misspelt filter is refused rather than matching nothing."""
    if value is None:
        return None
    parts = re.split(r"[x-]", value)
    if not all(_DTYPE_PART.fullmatch(p) for p in parts) or len(parts) > 4:
        raise UnsupportedError(f"{option} {shown(value)} is not a kernel dtype name; use one such as fp16, bf16, "
                               "fp32, tf32, fp8e4m3, fp16-fp32 or fp8e4m3-bf16 (`registry list` counts them)")
    return value


def dispatcher_for(op: OpKind, rule_set: str, strategy: str, arch: Optional[str] = None) -> Dispatcher:
    """A dispatcher over one op's rule set, as the op commands' options ask: for this machine, or for
    the arch named (`--arch`, explain only: a run needs this machine's)."""
    from .. import arch as arch_facts

    rules = parse_option("--rule-set", RuleSet.parse, rule_set)
    chosen = parse_option("--strategy", Strategy.parse, strategy)
    facts = current_arch() if arch is None else parse_option("--arch", arch_facts.load, arch)
    return Dispatcher(Registry.from_rule_set(op, rules, facts), facts, strategy=chosen)


# --- output --------------------------------------------------------------------------------


def _strict(value: Any) -> Any:
    """`value` with every non-finite float spelt as a string: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


class StdoutClosedError(Exception):
    """The reader of stdout went away. Not an OSError: click's own EPIPE handler would exit 1."""


def emit(document: Any) -> None:
    try:
        typer.echo(json.dumps(_strict(document), indent=2, default=str, allow_nan=False))
    except BrokenPipeError:
        raise StdoutClosedError() from None


def emit_error(code: ExitCode, kind: str, message: str, **extra: str) -> ExitCode:
    emit({"status": "error", "exit_code": int(code), "error": {"type": kind, "message": message, **extra}})
    return code


# --- the one place where errors end ---------------------------------------------------------


def _out_of_memory(e: BaseException) -> bool:
    """torch's and Python's ways of saying an allocation failed."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("not enough memory", "can't allocate", "out of memory", "cannot allocate"))


class MissingCommandError(click_errors.UsageError):
    """A group called without a command; click's no_args_is_help would print the help to stdout."""

    def __init__(self, ctx) -> None:
        names = ", ".join(getattr(ctx.command, "commands", {}))
        super().__init__(f"{ctx.command_path} needs a command: {names}", ctx=ctx)


def _usage(e: click_errors.ClickException) -> ExitCode:
    """A command line click cannot parse; a missing command also gets the group's help on stderr,
    for the person who typed it."""
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "tiledispatch"
    if isinstance(e, MissingCommandError):
        with contextlib.redirect_stdout(sys.stderr):  # typer's rich help prints itself while it formats
            help_text = ctx.get_help()
        if help_text:  # without rich, click returns the help text instead
            typer.echo(help_text, err=True)
    return emit_error(ExitCode.USAGE, type(e).__name__, e.format_message(), hint=f"`{path} --help` shows the usage")


def _exception(e: Exception) -> ExitCode:
    """The exit code and JSON error of an exception a command raised."""
    if isinstance(e, TiledispatchError):
        return emit_error(ExitCode.BAD_INPUT, type(e).__name__, str(e))
    if _out_of_memory(e):
        return emit_error(ExitCode.BAD_INPUT, type(e).__name__,
                          f"not enough memory for this problem's tensors ({str(e).strip()[:300]}); "
                          "use smaller sizes, or free memory on the device")
    if isinstance(e, OSError):  # a file or directory the user named is unusable
        return emit_error(ExitCode.BAD_INPUT, type(e).__name__, str(e))
    extra = EXTRA_OF.get((getattr(e, "name", None) or "").split(".")[0]) if isinstance(e, ImportError) else None
    if extra is not None:  # an optional package this command needs is not installed
        return emit_error(ExitCode.BAD_INPUT, type(e).__name__, f"this command needs {e.name}, which is not installed",
                          hint=f"pip install 'tiledispatch[{extra}]'")
    if os.environ.get(DEBUG_ENV) == "1":
        raise e
    return emit_error(ExitCode.INTERNAL, type(e).__name__, str(e)[:2000] or repr(e), hint=BUG_HINT)


def run_guarded(call: Callable[[], Any]) -> int:
    """Runs click (not standalone) and returns the exit code; every error becomes a JSON document."""
    try:
        return _outcome(call)
    except (BrokenPipeError, StdoutClosedError):  # also while printing an error
        _silence_stdout()
        return ExitCode.BROKEN_PIPE


def _outcome(call: Callable[[], Any]) -> int:
    try:
        result = call()
        return result if isinstance(result, int) and not isinstance(result, bool) else ExitCode.OK
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except typer.Abort:  # click's answer to an EOF at a prompt, or an abort
        return ExitCode.INTERRUPTED
    except (BrokenPipeError, StdoutClosedError):
        raise
    except click_errors.ClickException as e:
        return _usage(e)
    except Exception as e:
        return _exception(e)


def _silence_stdout() -> None:
    """After EPIPE, flushing stdout at exit would raise again: point it at /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (CliRunner's): nothing to flush
        pass


class JsonGroup(TyperGroup):
    """Every group of the app. At the top, click runs without its standalone mode, so that no
    error prints click's text box or a traceback; `run_guarded` turns each into JSON and an
    ExitCode. CliRunner calls this `main` too, so tests see what a shell sees."""

    def parse_args(self, ctx, args):
        if not args and not ctx.resilient_parsing:
            raise MissingCommandError(ctx)
        return super().parse_args(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        code = run_guarded(lambda: super(JsonGroup, self).main(
            args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra))
        if standalone_mode:
            sys.exit(int(code))
        return int(code)
