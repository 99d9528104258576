"""`tiledispatch gemm` and `tiledispatch explain gemm`."""

from __future__ import annotations

from typing import Optional

import typer

from ..core.hostcost import for_eager
from ..core.op import OpKind
from ..core.runtime import Backend, current_backend
from ..ops.gemm import GemmLayout, GemmProblem, GemmTypes, check_operands
from ..ops.gemm.inputs import make_inputs
from ..ops.gemm.problem import Activation, Epilogue
from ..ops.gemm.ranking import replay_pick
from ..ops.gemm.reference import compare
from .common import (EXPLAIN_ARCH, RULE_SET, STRATEGY, ExitCode, dispatcher_for, emit, kernel_name, limit_option,
                     parse_option, repeats_option, seed_option)
from .limits import check_addressable, check_fits, gemm_footprint

DTYPE_HELP = "fp16, bf16, fp32, tf32, fp8e4m3, fp8e4m3xfp8e5m2 (fp8 gives bf16 out)"


def _problem(m, n, k, batch, dtype, layout, bias, activation, residual) -> GemmProblem:
    types = parse_option("--dtype", GemmTypes.parse, dtype)
    gemm_layout = parse_option("--layout", GemmLayout.parse, layout)
    epilogue = Epilogue(bias, parse_option("--activation", Activation.parse, activation), residual)
    return GemmProblem(m=m, n=n, k=k, batch=batch, types=types, layout=gemm_layout, epilogue=epilogue)


M = typer.Argument(..., help="rows of A and C")
N = typer.Argument(..., help="columns of B and C")
K = typer.Argument(..., help="the reduced dimension")
BATCH = typer.Option(1, "--batch", help="batch count")
DTYPE = typer.Option("fp16", help=DTYPE_HELP)
LAYOUT = typer.Option("rrr", help="r/c/s for A, B, C: row-major, column-major, strided")
BIAS = typer.Option(False, "--bias", help="add a bias over N")
ACTIVATION = typer.Option("none", help="none, relu, gelu, silu")
RESIDUAL = typer.Option(False, "--residual", help="add a residual M x N")


def gemm_command(m: int = M, n: int = N, k: int = K, batch: int = BATCH, dtype: str = DTYPE,
                 layout: str = LAYOUT, bias: bool = BIAS, activation: str = ACTIVATION, residual: bool = RESIDUAL,
                 validate: bool = typer.Option(False, "--validate", help="check against a float64 reference"),
                 kernel: Optional[str] = typer.Option(None, callback=kernel_name,
                                                      help="force this kernel by name"),
                 rule_set: str = RULE_SET, strategy: str = STRATEGY,
                 repeats: int = repeats_option(50), seed: int = seed_option()) -> None:
    """Run one GEMM on random inputs and print the problem, kernel, time and validation as JSON."""
    problem = _problem(m, n, k, batch, dtype, layout, bias, activation, residual)
    backend = current_backend()
    dispatcher = dispatcher_for(OpKind.GEMM, rule_set, strategy)
    check_fits(gemm_footprint(problem, validate), on_gpu=backend is Backend.CUDA)
    inputs = make_inputs(problem, device=backend.device, seed=seed)
    operands = check_operands(inputs.a, inputs.b, allow_tf32=problem.types.allow_tf32,
                              activation=problem.epilogue.activation, **inputs.kwargs())
    spec = dispatcher.resolve(kernel, operands.problem) if kernel else dispatcher.select(operands.problem)
    out = dispatcher.run(operands, kernel=spec)  # builds (or loads) the kernel and checks it runs

    from ..bench.timing import time_call

    timing = time_call(lambda: dispatcher.run(operands, kernel=spec), on_gpu=backend is Backend.CUDA,
                       repeats=repeats)
    document = {
        "status": "ok",
        "device": backend.value,
        "arch": dispatcher.arch.name,
        "problem": operands.problem.describe(),
        "kernel": {"name": spec.name, "family": spec.family, "forced": kernel is not None,
                   "strategy": dispatcher.strategy.value, "rule_set": rule_set},
        "execution": {"time_ms": timing.median_ms, "tflops": problem.flops() / timing.median_ms / 1e9,
                      "method": timing.method, "repeats": timing.repeats},
    }
    if validate:
        comparison = compare(out, operands)
        document["validation"] = comparison.to_dict()
        if not comparison.passed:
            document["status"] = "failed"
    emit(document)
    if document["status"] != "ok":
        raise typer.Exit(ExitCode.FAILED)


def explain_gemm_command(m: int = M, n: int = N, k: int = K, batch: int = BATCH, dtype: str = DTYPE,
                         layout: str = LAYOUT, bias: bool = BIAS, activation: str = ACTIVATION,
                         residual: bool = RESIDUAL, rule_set: str = RULE_SET, strategy: str = STRATEGY,
                         arch: Optional[str] = EXPLAIN_ARCH,
                         limit: int = limit_option(10, "candidates shown per list")) -> None:
    """Show every candidate for a GEMM: the ranking with its terms, and why each refused one refused."""
    problem = _problem(m, n, k, batch, dtype, layout, bias, activation, residual)
    check_addressable(gemm_footprint(problem, validate=False))  # even meta tensors need 64-bit sizes
    # As `gemm` poses it on fresh tensors of this layout: rows of 4093 halves are not 16-byte aligned.
    inputs = make_inputs(problem, device="meta")  # shapes and strides, no memory (so no `out`: no alias check)
    problem = check_operands(inputs.a, inputs.b, allow_tf32=problem.types.allow_tf32,
                             activation=problem.epilogue.activation, **{**inputs.kwargs(), "out": None}).problem
    dispatcher = dispatcher_for(OpKind.GEMM, rule_set, strategy, arch)
    explanation = dispatcher.explain(problem)
    doc = explanation.to_dict(limit=limit or None)
    if explanation.selected is not None:
        # Eager calls run `selected`; a CUDA graph's replays have no host time, so where the
        # launches outlast the kernel they run the kernel fastest on the device instead.
        doc["graph_replay"] = replay_pick(dispatcher, problem, explanation.selected).name
        # An eager call, recorded by autograd or not, runs the vendor's product where `selected` is
        # not expected to save an eager call's host time over it (core/hostcost.py); a recorded one
        # also where its gradients' picks and its own together do not save the twin's host time
        # (`native_for_recorded`), which the forward's problem alone does not say.
        doc["eager"] = doc["recorded"] = for_eager(dispatcher, problem, explanation.selected).name
    emit(doc)
