"""`tiledispatch evaluate TABLE`: how close each strategy's picks come to the oracle on a sweep's table."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Optional

import typer

from ..bench import completeness
from ..core.errors import InvalidArgumentError
from ..heuristics.training import SEED_MAX
from .common import _strict, emit, parse_option
from .train import read_table

FILTERS = ("op", "direction", "dtype", "arch")
PROVENANCE = ("gpu", "torch", "triton", "commit")  # the table's columns a reader needs to trust the numbers


def _filtered(frame, chosen: dict[str, Optional[str]]):
    from ..heuristics.evaluate import EvaluationError

    for column, value in chosen.items():
        if value is not None and column in frame.columns:
            frame = frame[frame[column].astype(str) == value]
    if frame.empty:
        asked = ", ".join(f"--{c} {v}" for c, v in chosen.items() if v is not None) or "no filter"
        raise EvaluationError(f"no row of the table matches {asked}; leave a filter out, or name a value the "
                              "table's op, direction, dtype and arch columns hold")
    return frame


def _command_line(ctx: typer.Context) -> str:
    """The command as typed, rebuilt from what click parsed: options left at their default are omitted."""
    words = ["tiledispatch", ctx.info_name or "evaluate"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.param_type_name == "argument":
            words.append(str(value))
        elif value is not None and value != param.default and value is not False:
            words.append(param.opts[0])
            if not getattr(param, "is_flag", False):
                words.append(str(value))
    return shlex.join(words)


def _provenance(frame) -> dict[str, Any]:
    """Each provenance column's values, with their row counts."""
    return {column: {str(k): int(v) for k, v in frame[column].value_counts(dropna=False).items()}
            for column in PROVENANCE if column in frame.columns}


def evaluate_command(
        ctx: typer.Context,
        table: Path = typer.Argument(..., help="a sweep's results: a parquet file, or the directory of its parts"),
        model: Optional[Path] = typer.Option(None, "--model", exists=True, file_okay=False,
                                             help="a directory of trained models (default: the models shipped "
                                             "for the table's arch)"),
        strategies: str = typer.Option("rules,model,autotune,vendor", "--strategies",
                                       help="comma-separated: rules, model, autotune, vendor, nvmmh (NVIDIA's "
                                       "nvMatmulHeuristics, GEMM only: pip install 'tiledispatch[nvmmh]')"),
        folds: int = typer.Option(5, "--folds", min=2, max=100, help="folds of the split by problem"),
        cv: bool = typer.Option(False, "--cv", help="for every fold, train a model on the others and judge it on "
                                "that fold: each problem judged once, by a model that never saw it"),
        train_fold: Optional[int] = typer.Option(None, "--train-fold", min=0,
                                                 help="as --cv, for this fold alone"),
        holdout_fold: Optional[int] = typer.Option(None, "--holdout-fold", min=0,
                                                   help="judge this fold's problems alone"),
        by_layer: bool = typer.Option(False, "--by-layer", help="folds keep a layer's problems together (its "
                                      "token counts or batches: problemsets' group_of), so a model is judged on "
                                      "layers it never saw"),
        op: Optional[str] = typer.Option(None, "--op", help="only this op's rows"),
        direction: Optional[str] = typer.Option(None, "--direction", help="only this direction's rows"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="only this dtype's rows (the table's spelling)"),
        arch: Optional[str] = typer.Option(None, "--arch", help="only this arch's rows (sm_90, ...)"),
        rescore: bool = typer.Option(False, "--rescore", help="rank by today's rules, not the table's scores"),
        allow_seen: bool = typer.Option(False, "--allow-seen", help="judge a model on problems it trained on"),
        seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help="training seed (--cv, --train-fold)"),
        worst: int = typer.Option(10, "--worst", min=0, help="problems listed per strategy, worst first"),
        out: Optional[Path] = typer.Option(None, "--out", help="also write the JSON document to this file")) -> None:
    """Judge the strategies' picks against the fastest kernel measured (the oracle), per op, direction,
    dtype and arch: efficiency, top-1 hits, time lost, ratio to the vendor, the worst problems."""
    from ..heuristics import evaluate as ev, nvmmh

    pickers = [parse_option("--strategies", ev.Picker.parse, s.strip()) for s in strategies.split(",") if s.strip()]
    if not pickers:
        raise InvalidArgumentError("--strategies names none; use some of: rules, model, autotune, vendor, nvmmh")
    training = cv or train_fold is not None
    if training and (model is not None or holdout_fold is not None):
        raise InvalidArgumentError("--cv and --train-fold train their own models on the other folds: leave out "
                                   "--model and --holdout-fold")
    for option, fold in (("--train-fold", train_fold), ("--holdout-fold", holdout_fold)):
        if fold is not None and fold >= folds:
            raise InvalidArgumentError(f"{option} {fold}: folds are numbered 0..{folds - 1} (--folds {folds})")
    frame = _filtered(read_table(table), dict(zip(FILTERS, (op, direction, dtype, arch))))
    # A problem a stopped sweep left with kernels untimed has no known oracle (bench/completeness.py).
    incomplete = completeness.incomplete(table, frame)
    frame = frame[~frame["problem_id"].astype(str).isin(incomplete)]
    by = "problem_id"
    if by_layer:
        from ..bench.problemsets import with_groups

        frame, by = with_groups(frame), "group_id"
    if training:
        report = ev.cross_validate(frame, folds=folds, only=train_fold, seed=seed, strategies=pickers,
                                   rescore=rescore, by=by)
    else:
        holdout = ev.Fold(holdout_fold, folds) if holdout_fold is not None else None
        if holdout is not None and by_layer:  # the problems of the layers in that fold
            holdout = frame.loc[frame[by].map(lambda g: ev.fold_of(g, folds)) == holdout_fold, "problem_id"]
        report = ev.evaluate(frame, strategies=pickers, model=model, holdout=holdout, rescore=rescore,
                             allow_seen=allow_seen)
    document = {"status": "ok", "command": _command_line(ctx), "table": str(table), "rows": len(frame),
                "problems": int(frame["problem_id"].nunique()), "incomplete_problems_left_out": len(incomplete),
                "provenance": _provenance(frame),
                **({"nvmmh": nvmmh.version()} if ev.Picker.NVMMH in pickers else {}),  # its package's version
                **report.to_dict(worst)}
    if out is not None:
        out.write_text(json.dumps(_strict(document), indent=2, default=str, allow_nan=False) + "\n")
    emit(document)
