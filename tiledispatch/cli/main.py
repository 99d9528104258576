"""The `tiledispatch` command. Every command prints one JSON document; every error too, with
one of the documented exit codes (`common.ExitCode`, README's "Exit codes")."""

from __future__ import annotations

import platform
import sys

import typer

from .. import arch as arch_facts
from .attention import attention_command, explain_attention_command
from .cache import cache_app
from .common import ExitCode, JsonGroup, emit, parse_option
from .conv import conv_command, explain_conv_command
from .evaluate import evaluate_command
from .gemm import explain_gemm_command, gemm_command
from .registry import build_command, registry_app
from .sweep import sweep_command, sweep_worker_command
from .train import train_command
from .warmup import warmup_command

app = typer.Typer(help="tiledispatch: select, build and run the fastest kernel per problem.", cls=JsonGroup,
                  pretty_exceptions_enable=False, add_completion=False)
explain_app = typer.Typer(help="Show how a problem's kernel is selected.", cls=JsonGroup)

def versions() -> dict[str, str | None]:
    """tiledispatch's version and those of what it runs on, from the installed metadata (fast:
    nothing is imported), None where one is not installed."""
    from .. import __version__
    from ..core.runtime import installed_version

    return {"tiledispatch": __version__, "python": platform.python_version(),
            "torch": installed_version("torch"), "triton": installed_version("triton")}


def _print_version(value: bool) -> None:
    if value:
        emit(versions())
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                          help="print the versions of tiledispatch, Python, torch and Triton")) -> None:
    """tiledispatch: select, build and run the fastest kernel per problem."""


app.command("gemm")(gemm_command)
explain_app.command("gemm")(explain_gemm_command)
app.command("conv")(conv_command)
explain_app.command("conv")(explain_conv_command)
app.command("attention")(attention_command)
explain_app.command("attention")(explain_attention_command)
app.add_typer(explain_app, name="explain")
app.add_typer(registry_app, name="registry")
app.add_typer(cache_app, name="cache")
app.command("build")(build_command)
app.command("warmup")(warmup_command)
app.command("evaluate")(evaluate_command)
app.command("sweep")(sweep_command)
app.command("sweep-worker")(sweep_worker_command)
app.command("train")(train_command)


@app.command("arch")
def arch_command(name: str = typer.Argument(None, help="an arch name; default: this machine's")) -> None:
    """The facts tiledispatch uses about an architecture."""
    from ..core.runtime import current_arch

    emit((parse_option("arch", arch_facts.load, name) if name is not None else current_arch()).to_dict())


def main() -> None:
    """The console script: JsonGroup.main exits with the command's ExitCode."""
    try:
        app()
    except KeyboardInterrupt:  # outside click's own handler, in typer's set-up around it
        sys.exit(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    main()
