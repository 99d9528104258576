"""`tiledispatch conv` and `tiledispatch explain conv`.

Sizes are positional: N C K G, then the input's spatial sizes and the filter's (two
numbers each for 2-D: H W R S; one each for 1-D, three for 3-D).
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

import typer

from ..core.choice import Choice
from ..core.errors import InvalidProblemError
from ..core.hostcost import for_eager
from ..core.op import OpKind
from ..core.runtime import Backend, current_backend
from ..ops.conv import (
    ConvEpilogue,
    ConvProblem,
    ConvTypes,
    Direction,
    SourceLayout,
    check_dtype_on_arch,
    check_operands,
)
from ..ops.conv.inputs import make_inputs
from ..ops.conv.reference import compare
from ..ops.gemm.problem import Activation
from .common import (EXPLAIN_ARCH, RULE_SET, STRATEGY, ExitCode, dispatcher_for, emit, kernel_name, limit_option,
                     parse_option, repeats_option, seed_option, shown)
from .limits import check_fits, conv_footprint


class InputLayout(Choice):
    CHANNELS_LAST = "channels-last"
    CONTIGUOUS = "contiguous"  # PyTorch's default NC... layout: converted, and `explain` says so


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InvalidProblemError(f"--{what} {shown(text)} must be an integer or comma-separated integers, "
                                  "e.g. 1 or 2,2") from None


def _problem(direction, sizes, stride, pad, dilation, dtype, bias, activation, residual, layout) -> ConvProblem:
    if len(sizes) < 6 or len(sizes) % 2:
        raise InvalidProblemError(
            f"give N C K G, then the input's spatial sizes and the filter's: 6 (1-D), 8 (2-D) or 10 (3-D) numbers, "
            f"got {len(sizes)}: {' '.join(map(str, sizes))}")
    n, c, k, g, *rest = sizes
    dims = len(rest) // 2
    epilogue = ConvEpilogue(bias, parse_option("--activation", Activation.parse, activation), residual)
    problem = ConvProblem(parse_option("--direction", Direction.parse, direction), n, c, k, g, tuple(rest[:dims]),
                          tuple(rest[dims:]), _ints(stride, "stride"), _ints(pad, "pad"), _ints(dilation, "dilation"),
                          parse_option("--dtype", ConvTypes.parse, dtype), epilogue)
    source = (SourceLayout.CONVERTED if parse_option("--layout", InputLayout.parse, layout) is InputLayout.CONTIGUOUS
              else SourceLayout.CHANNELS_LAST)
    return replace(problem, specialization=problem.dense_specialization(), source_layout=source)


SIZES = typer.Argument(..., help="N C K G, then input spatial sizes, then filter sizes (e.g. 32 256 256 32 28 28 3 3)")
DIRECTION = typer.Option("forward", help="forward, bwd_data, bwd_weight")
STRIDE = typer.Option("1", help="stride: one value or one per spatial dim, comma-separated")
PAD = typer.Option("0", "--pad", help="padding per side: one value or one per spatial dim")
DILATION = typer.Option("1", help="dilation: one value or one per spatial dim")
DTYPE = typer.Option("fp16", help="fp16, bf16, fp32, tf32")
BIAS = typer.Option(False, "--bias", help="forward: add a bias over K")
ACTIVATION = typer.Option("none", help="forward: none, relu, gelu, silu")
RESIDUAL = typer.Option(False, "--residual", help="forward: add a residual shaped as the output")
LAYOUT = typer.Option("channels-last", help="channels-last, or contiguous (converted into channels-last)")


def conv_command(sizes: List[int] = SIZES, direction: str = DIRECTION, stride: str = STRIDE, pad: str = PAD,
                 dilation: str = DILATION, dtype: str = DTYPE, bias: bool = BIAS, activation: str = ACTIVATION,
                 residual: bool = RESIDUAL, layout: str = LAYOUT,
                 validate: bool = typer.Option(False, "--validate", help="check against a float64 reference"),
                 kernel: Optional[str] = typer.Option(None, callback=kernel_name,
                                                      help="force this kernel by name"),
                 rule_set: str = RULE_SET, strategy: str = STRATEGY,
                 repeats: int = repeats_option(50), seed: int = seed_option()) -> None:
    """Run one convolution on random inputs and print the problem, kernel, time and validation as JSON."""
    requested = _problem(direction, sizes, stride, pad, dilation, dtype, bias, activation, residual, layout)
    backend = current_backend()
    dispatcher = dispatcher_for(OpKind.CONV, rule_set, strategy)
    check_fits(conv_footprint(requested, validate), on_gpu=backend is Backend.CUDA)
    contiguous = requested.source_layout is SourceLayout.CONVERTED
    inputs = make_inputs(requested, device=backend.device, seed=seed, channels_last=not contiguous)
    operands = check_operands(requested.direction, **inputs.kwargs(requested))
    check_dtype_on_arch(operands.problem.types, dispatcher.arch)
    problem = operands.problem
    spec = dispatcher.resolve(kernel, problem) if kernel else dispatcher.select(problem)
    out = dispatcher.run(operands, kernel=spec)  # builds (or loads) the kernel and checks it runs

    from ..bench.timing import time_call

    timing = time_call(lambda: dispatcher.run(operands, kernel=spec), on_gpu=backend is Backend.CUDA,
                       repeats=repeats)
    document = {
        "status": "ok",
        "device": backend.value,
        "arch": dispatcher.arch.name,
        "problem": problem.describe(),
        "kernel": {"name": spec.name, "family": spec.family, "forced": kernel is not None,
                   "strategy": dispatcher.strategy.value, "rule_set": rule_set},
        "execution": {"time_ms": timing.median_ms, "tflops": problem.flops() / timing.median_ms / 1e9,
                      "tbps": problem.bytes() / timing.median_ms / 1e9,
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


def explain_conv_command(sizes: List[int] = SIZES, direction: str = DIRECTION, stride: str = STRIDE,
                         pad: str = PAD, dilation: str = DILATION, dtype: str = DTYPE, bias: bool = BIAS,
                         activation: str = ACTIVATION, residual: bool = RESIDUAL, layout: str = LAYOUT,
                         rule_set: str = RULE_SET, strategy: str = STRATEGY,
                         arch: Optional[str] = EXPLAIN_ARCH,
                         limit: int = limit_option(10, "candidates shown per list")) -> None:
    """Show every candidate for a convolution: the ranking with its terms, and why each refused one refused."""
    problem = _problem(direction, sizes, stride, pad, dilation, dtype, bias, activation, residual, layout)
    dispatcher = dispatcher_for(OpKind.CONV, rule_set, strategy, arch)
    explanation = dispatcher.explain(problem)
    doc = explanation.to_dict(limit=limit or None)
    if explanation.selected is not None:
        # A CUDA graph's replays run `selected`; an eager call the vendor's kernel where `selected` is
        # not expected to save the host time an eager call of ours costs over it (core/hostcost.py).
        doc["eager"] = for_eager(dispatcher, problem, explanation.selected).name
    emit(doc)
