"""`tiledispatch sweep` (time a rule set's candidates over a problem set, into a parquet table) and
`tiledispatch sweep-worker` (this host's GPUs as Dask workers of a sweep on many hosts)."""

from __future__ import annotations

import functools
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..core.errors import InvalidArgumentError, UnsupportedError
from ..bench.sweep import KERNELS_PER_TASK
from ..core.op import get_op
from .common import JOBS_MAX, RULE_SET, ExitCode, emit, limit_option, parse_option, seed_option, shown

PROBLEMS_HELP = ("a problem set's name (tiledispatch.bench.problemsets), or a JSON file: a list of problems, or a "
                 "benchmark suite (benchmarks/suites/*.json)")
GPUS_HELP = "GPU indices, e.g. 0,1,2,3: one worker process each (several: through Dask)"


def parse_gpus(value: Optional[str]) -> list[str] | None:
    if value is None:
        return None
    gpus = [part.strip() for part in value.split(",")]
    if not all(re.fullmatch(r"\d{1,4}", g) for g in gpus) or len(set(gpus)) != len(gpus):
        raise InvalidArgumentError(f"--gpus {shown(value)} must be distinct GPU indices separated by commas, "
                                   "e.g. 0,1,2,3")
    return gpus


def _matches(problem: Any, dtype: Optional[str], direction: Optional[str]) -> bool:
    from ..bench.table import selection_key

    key = selection_key(problem, "any")
    return (dtype is None or key.dtype == dtype) and (direction is None or key.direction == direction)


def _slices(problems: list[Any]) -> str:
    """'N of dtype D, direction R' for each (dtype, direction) of `problems`, the most first."""
    from collections import Counter

    from ..bench.table import selection_key

    counts = Counter((k.dtype, k.direction) for k in (selection_key(p, "any") for p in problems))
    return ", ".join(f"{n} of dtype {d}, direction {r}" for (d, r), n in counts.most_common())


def resolve_problems(op: str, given: str, dtype: Optional[str], direction: Optional[str], limit: int,
                     seed: int, cases: Optional[str] = None) -> tuple[list[Any], str]:
    """(problems, the set's name for the table) from a file (of problems, or a suite's cases) or a
    named problem set."""
    try:
        from ..bench import problemsets
    except ImportError:
        raise UnsupportedError(f"--problems {shown(given)}: no problem sets in this installation "
                               "(tiledispatch.bench.problemsets), neither named nor read from files") from None
    path = Path(given)
    if path.is_file() and problemsets.is_suite_file(path):
        if dtype is None:
            raise InvalidArgumentError(f"--problems {shown(given)} is a benchmark suite: give its --dtype too "
                                       "(e.g. bf16)")
        names = tuple(c.strip() for c in cases.split(",") if c.strip()) if cases else None
        problems, _ = problemsets.suite_problems(path, op, dtype, direction, names)
        return list(problems[:limit] if limit else problems), path.stem
    if cases is not None:
        raise InvalidArgumentError(f"--cases picks cases of a benchmark suite; --problems {shown(given)} is none")
    if path.suffix == ".json" or path.is_file():
        kind = get_op(op).kind
        of_op = [p for p in problemsets.load_problems(path) if p.op is kind]
        problems = [p for p in of_op if _matches(p, dtype, direction)]
        if of_op and not problems:
            raise InvalidArgumentError(f"--problems {shown(given)} holds no {kind.value} problem of"
                                       f"{' dtype ' + dtype if dtype else ''}"
                                       f"{' direction ' + direction if direction else ''}; it holds "
                                       f"{_slices(of_op)}: give --dtype and --direction as they are spelt there")
        return (problems[:limit] if limit else problems), path.stem
    if dtype is None:
        raise InvalidArgumentError(f"--problems {shown(given)} names a problem set: give its --dtype too (e.g. bf16)")
    problems = parse_option("--problems", lambda name: problemsets.problem_set(
        name, dtype=dtype, direction=direction, limit=limit or None, seed=seed), given)
    return [p for p in problems if p.op is get_op(op).kind], given


def sweep_command(
        op: str = typer.Option(..., "--op", help="gemm, conv or attention"),
        problems: str = typer.Option(..., "--problems", help=PROBLEMS_HELP),
        out: Path = typer.Option(..., "--out", help="the table's directory: part-*.parquet, appended to"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16, fp16, fp32, fp8e4m3 ..."),
        direction: Optional[str] = typer.Option(None, "--direction", help="forward (gemm); forward, bwd_data "
                                                "or bwd_weight (conv); fwd or bwd (attention)"),
        rule_set: str = RULE_SET,
        space: Optional[str] = typer.Option(None, "--space", help="one of the op's tile spaces (gemm: split-k, "
                                            "stream-k, decode, gemv, ws): each problem's configs from it, beside "
                                            "the rule set's vendor kernel"),
        top: Optional[int] = typer.Option(None, "--top", min=1, help="the rules' best N only (default: all)"),
        sample: int = typer.Option(0, "--sample", min=0, help="with --top: M other candidates drawn at random"),
        family: Optional[str] = typer.Option(None, "--family", help="only these kernel families, comma-separated "
                                             "(the vendor's kernel is timed beside them)"),
        match: Optional[str] = typer.Option(None, "--match", help="only kernels whose names match this regular "
                                            "expression"),
        seed: int = seed_option(),
        arch: Optional[str] = typer.Option(None, "--arch", help="the arch to select for (default: this machine's)"),
        gpus: Optional[str] = typer.Option(None, "--gpus", help=GPUS_HELP),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="a Dask scheduler, tcp://host:8786"),
        timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="seconds a build or a kernel may take"),
        kernels_per_task: int = typer.Option(KERNELS_PER_TASK, "--kernels-per-task", min=1, help="kernels a task"),
        jobs: int = typer.Option(8, "-j", "--jobs", min=1, max=JOBS_MAX, help="compile processes per worker"),
        prebuild_jobs: int = typer.Option(0, "--prebuild-jobs", min=0, max=JOBS_MAX,
                                          help="compile every planned kernel first, this many processes on this "
                                               "host (0: each worker compiles its own, as it meets them)"),
        cases: Optional[str] = typer.Option(None, "--cases", help="with a benchmark suite: only these cases, "
                                            "comma-separated"),
        limit: int = limit_option(0, "problems"),
        budget_s: Optional[float] = typer.Option(None, "--budget-s", min=1.0,
                                                 help="stop cleanly past this many seconds, the tasks in flight dropped "
                                                      "(on one GPU, the first always runs); a rerun into --out "
                                                      "goes on"),
        record_refused: bool = typer.Option(False, "--record-refused",
                                            help="a row per refused candidate too (status unsupported)"),
        gather_to: Optional[Path] = typer.Option(None, "--gather", help="then the whole table of --out (this "
                                                 "sweep's rows and earlier ones) as one parquet file here")) -> None:
    """Time the candidates of a rule set on every problem of a set; one long-format parquet table."""
    from .. import arch as arch_facts
    from ..bench.sweep import CandidatePolicy, SweepInterrupted, gather, sweep
    from ..core.op import OpKind, RuleSet

    kind = parse_option("--op", OpKind.parse, op)
    found, set_name = resolve_problems(kind.value, problems, dtype, direction, limit, seed, cases)
    if not found:
        raise InvalidArgumentError(f"--problems {shown(problems)}: no {kind.value} problems"
                                   f"{' of dtype ' + dtype if dtype else ''}"
                                   f"{' and direction ' + direction if direction else ''}")
    run = functools.partial(
        sweep, kind, found, out=out, rule_set=parse_option("--rule-set", RuleSet.parse, rule_set),
        arch=None if arch is None else parse_option("--arch", arch_facts.load, arch),
        candidates=CandidatePolicy(top=top, sample=sample, seed=seed, record_refused=record_refused,
                                   families=tuple(f.strip() for f in (family or "").split(",") if f.strip()),
                                   match=match),
        timeout_s=timeout, gpus=parse_gpus(gpus), scheduler=scheduler, kernels_per_task=kernels_per_task, jobs=jobs,
        problem_set_name=set_name, seed=seed, prebuild_jobs=prebuild_jobs, budget_s=budget_s, space=space)

    def gathered() -> dict:
        return {} if gather_to is None else {"gathered": {"file": str(gather_to), "rows": gather(out, gather_to)}}

    try:
        report = _with_progress(run, f"{kind.value} {set_name}")
    except SweepInterrupted as stopped:  # what it wrote before a Ctrl-C or SIGTERM, then the usual exit code
        emit({"status": "interrupted", "op": kind.value, "problem_set": set_name, **stopped.report.to_dict(),
              **gathered()})
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    emit({"status": "ok", "op": kind.value, "problem_set": set_name, **report.to_dict(), **gathered()})


def _with_progress(run: Callable[..., Any], what: str) -> Any:
    """`run(progress=...)` with its progress on stderr (stdout carries the JSON document only, for
    `| jq` and scripts): a bar on a terminal, else a line per finished task, so that a log of a
    sweep stopped by a time limit still says how far it went."""
    console = Console(stderr=True)
    if not console.is_terminal:
        start = time.monotonic()

        def line(done: int, total: int) -> None:
            print(f"sweep {what}: {done}/{total} tasks, {time.monotonic() - start:.0f} s", file=sys.stderr,
                  flush=True)

        return run(progress=line)
    columns = (TextColumn("[bold]sweep[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, transient=False, redirect_stdout=False, console=console) as progress:
        bar = progress.add_task(f"{what}: tasks", total=None)
        return run(progress=lambda done, total: progress.update(bar, completed=done, total=total))


def sweep_worker_command(scheduler: str = typer.Argument(..., help="the Dask scheduler, tcp://host:8786"),
                         gpus: str = typer.Option("0", "--gpus", help="this host's GPUs to serve, e.g. 0,1,2,3"),
                         name: Optional[str] = typer.Option(None, "--name", help="worker name prefix (default: host)")
                         ) -> None:
    """Serve this host's GPUs to a sweep: one Dask worker per GPU, pinned; runs until they stop."""
    from ..bench.distributed import start_workers
    from ..bench.sweep import terminating

    with terminating():  # SIGTERM stops this host's workers as Ctrl-C does
        code = start_workers(scheduler, parse_gpus(gpus), name)
    emit({"status": "ok" if code == 0 else "failed", "scheduler": scheduler, "gpus": parse_gpus(gpus),
          "exit_code": code})
    if code:
        raise typer.Exit(1)
