"""`tiledispatch attention` and `tiledispatch explain attention`."""

from __future__ import annotations

from typing import Optional

import torch
import typer

from ..core.dtypes import DType
from ..core.errors import InvalidProblemError
from ..core.op import OpKind
from ..core.runtime import Backend, current_backend
from ..ops.attention import (
    AttentionOptions,
    AttentionProblem,
    AttentionVariant,
    Direction,
    Layout,
    MaskKind,
    Window,
    check_operands,
    parse_causal,
)
from ..ops.attention.inputs import make_inputs
from ..ops.attention.reference import compare_lse, compare_tensors, reference_from, tolerance
from .common import (EXPLAIN_ARCH, RULE_SET, SEED_MAX, STRATEGY, ExitCode, dispatcher_for, emit, kernel_name,
                     limit_option, parse_option, repeats_option, seed_option, shown)
from .limits import attention_footprint, check_addressable, check_fits

ALIGN = {"top-left": "top_left", "bottom-right": "bottom_right"}  # --align: the API's causal= values


WINDOW_MAX = 2**31 - 1  # positions are 32-bit in the kernels; a wider window is -1, unbounded


def _window(text: Optional[str]) -> Window | None:
    if text is None:
        return None
    usage = f"--window {shown(text)} must be LEFT,RIGHT (e.g. 1024,0; -1 is unbounded)"
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:  # not two parts, or not integers (int() also refuses 5,000-digit numbers)
        raise InvalidProblemError(usage) from None
    if max(left, right) > WINDOW_MAX:
        raise InvalidProblemError(f"{usage}; each side at most {WINDOW_MAX}, or -1 for unbounded")
    return Window(left, right)


def _causal(causal: bool, align: Optional[str]):
    """The API's causal= for the flags: --causal alone is top-left, as causal=True and torch SDPA."""
    if align is not None and align not in ALIGN:
        raise InvalidProblemError(f"--align {shown(align)}: use one of {', '.join(ALIGN)}")
    if not causal:
        if align is not None:
            raise InvalidProblemError(f"--align {align} aligns the causal mask: add --causal")
        return False
    return ALIGN[align or "top-left"]


def _options(causal: bool, align: Optional[str], window: Optional[str], softcap: Optional[float],
             needs_lse: bool) -> AttentionOptions:
    return AttentionOptions(causal=parse_causal(_causal(causal, align)), window=_window(window), softcap=softcap,
                            needs_lse=needs_lse)


def _problem(b, hq, hkv, sq, skv, d, dv, dtype, layout, causal, align, window, softcap,
             backward) -> AttentionProblem:
    """The problem the command's random inputs will have (for explain, without any tensor)."""
    options = _options(causal, align, window, softcap, backward)
    mask, win = options.causal, Window()
    if options.window is not None:
        mask, win = MaskKind.SLIDING_WINDOW, Window(options.window.left, 0 if options.causal is not MaskKind.NONE
                                                    else options.window.right)
        if win == Window():
            mask = MaskKind.NONE
    variant = AttentionVariant(band=mask is not MaskKind.NONE, softcap=softcap is not None)
    return AttentionProblem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_kv=skv, head_dim_qk=d,
                            head_dim_v=d if dv is None else dv, dtype=parse_option("--dtype", DType.parse, dtype),
                            direction=Direction.BACKWARD if backward else Direction.FORWARD,
                            layout=parse_option("--layout", Layout.parse, layout), mask=mask, window=win,
                            variant=variant)


B = typer.Argument(..., help="batch")
HQ = typer.Argument(..., help="query heads")
HKV = typer.Argument(..., help="key/value heads (a divisor of the query heads)")
SQ = typer.Argument(..., help="query length")
SKV = typer.Argument(..., help="key/value length")
D = typer.Argument(..., help="head dim of Q and K (32, 64, 80, 96, 128, 192, 256)")
DV = typer.Option(None, "--dv", help="head dim of V (default: D)")
DTYPE = typer.Option("fp16", help="fp16, bf16 (GPU), fp32, fp8e4m3 (forward only, unit scales, bf16 out)")
LAYOUT = typer.Option("bhsd", help="bhsd or bshd (the memory order of the random inputs)")
CAUSAL_OPT = typer.Option(False, "--causal", help="causal mask, top-left aligned unless --align says otherwise")
ALIGN_OPT = typer.Option(None, "--align", help="with --causal, where its diagonal starts when Sq != Skv: "
                         "top-left (torch SDPA) or bottom-right (FlashAttention)")
WINDOW = typer.Option(None, "--window", help="sliding window LEFT,RIGHT (bottom-right aligned; -1 unbounded)")
SOFTCAP = typer.Option(None, "--softcap", help="soft-cap the scores: cap * tanh(s / cap)")
BACKWARD = typer.Option(False, "--backward", help="forward and backward (the backward plan), gradients validated")


def attention_command(b: int = B, hq: int = HQ, hkv: int = HKV, sq: int = SQ, skv: int = SKV, d: int = D,
                      dv: Optional[int] = DV, dtype: str = DTYPE, layout: str = LAYOUT, causal: bool = CAUSAL_OPT,
                      align: Optional[str] = ALIGN_OPT, window: Optional[str] = WINDOW,
                      softcap: Optional[float] = SOFTCAP, backward: bool = BACKWARD,
                      validate: bool = typer.Option(False, "--validate", help="check against a float64 reference"),
                      kernel: Optional[str] = typer.Option(None, callback=kernel_name,
                                                           help="force the forward kernel by name"),
                      backward_kernel: Optional[str] = typer.Option(
                          None, callback=kernel_name, help="force the backward kernel by name (with --backward)"),
                      rule_set: str = RULE_SET, strategy: str = STRATEGY,
                      repeats: int = repeats_option(20), seed: int = seed_option()) -> None:
    """Run one attention on random inputs; print the problem, kernels, time and validation as JSON."""
    import tiledispatch

    if backward_kernel is not None and not backward:
        raise InvalidProblemError(f"--backward-kernel {backward_kernel} forces the backward: add --backward")
    problem = _problem(b, hq, hkv, sq, skv, d, dv, dtype, layout, causal, align, window, softcap, backward)
    backend = current_backend()
    dispatcher = dispatcher_for(OpKind.ATTENTION, rule_set, strategy)
    check_fits(attention_footprint(problem, validate, backward), on_gpu=backend is Backend.CUDA)
    inputs = make_inputs(problem, device=backend.device, seed=seed)
    q, k, v = (t.requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
    options = _options(causal, align, window, softcap, True)
    kwargs = {"causal": _causal(causal, align),
              "window": None if window is None else tuple(map(int, window.split(","))),
              "softcap": softcap, "dispatcher": dispatcher, "kernel": kernel, "backward_kernel": backward_kernel}
    operands = check_operands(q.detach(), k.detach(), v.detach(), options=options)
    fwd_spec = dispatcher.resolve(kernel, operands.problem) if kernel else dispatcher.select(operands.problem)
    grad_seed = (seed + 1) % (SEED_MAX + 1)  # a seed of its own, within manual_seed's range
    grad_out = torch.randn(*q.shape[:-1], problem.head_dim_v, generator=torch.Generator().manual_seed(grad_seed))
    grad_out = grad_out.to(device=q.device, dtype=q.dtype)

    def run():
        out, lse = tiledispatch.attention(q, k, v, return_lse=True, **kwargs)
        if backward:
            return out, lse, torch.autograd.grad(out, (q, k, v), grad_out)
        return out, lse, None

    out, lse, grads = run()
    from ..bench.timing import time_call

    timing = time_call(run, on_gpu=backend is Backend.CUDA, repeats=repeats)
    kernels = {"name": fwd_spec.name, "family": fwd_spec.family, "forced": kernel is not None,
               "strategy": dispatcher.strategy.value, "rule_set": rule_set}
    flops = problem.training_flops() if backward else problem.forward_flops()
    if backward:
        bwd_problem = check_operands(q.detach(), k.detach(), v.detach(), options=options,
                                     direction=Direction.BACKWARD, out=out.detach(), lse=lse,
                                     grad_out=grad_out).problem
        bwd_spec = (dispatcher.resolve(backward_kernel, bwd_problem) if backward_kernel
                    else dispatcher.select(bwd_problem))
        kernels["backward"] = {"name": bwd_spec.name, "family": bwd_spec.family, "forced": backward_kernel is not None}
    document = {
        "status": "ok", "device": backend.value, "arch": dispatcher.arch.name,
        "problem": operands.problem.describe(), "kernel": kernels,
        "execution": {"time_ms": timing.median_ms, "tflops": flops / timing.median_ms / 1e9,
                      "method": timing.method, "repeats": timing.repeats,
                      "measures": "forward+backward" if backward else "forward"},
    }
    if validate:
        leaves = [t.detach().to("cpu", torch.float64).requires_grad_(backward) for t in (q, k, v)]
        ref_out, ref_lse = reference_from(*leaves, operands.problem, scale=operands.scale, softcap=operands.softcap)
        checks = {"out": compare_tensors(out, ref_out, tolerance(problem.dtype)),
                  "lse": compare_lse(lse, ref_lse, q, k, operands.scale)}
        if backward:
            ref_grads = torch.autograd.grad(ref_out, leaves, grad_out.to("cpu", torch.float64))
            for name, mine, ref in zip(("dq", "dk", "dv"), grads, ref_grads):
                checks[name] = compare_tensors(mine, ref, tolerance(problem.dtype, gradient=True))
        document["validation"] = {name: c.to_dict() for name, c in checks.items()}
        document["validation"]["passed"] = all(c.passed for c in checks.values())
        if not document["validation"]["passed"]:
            document["status"] = "failed"
    emit(document)
    if document["status"] != "ok":
        raise typer.Exit(ExitCode.FAILED)


def explain_attention_command(b: int = B, hq: int = HQ, hkv: int = HKV, sq: int = SQ, skv: int = SKV, d: int = D,
                              dv: Optional[int] = DV, dtype: str = DTYPE, layout: str = LAYOUT,
                              causal: bool = CAUSAL_OPT, align: Optional[str] = ALIGN_OPT,
                              window: Optional[str] = WINDOW,
                              softcap: Optional[float] = SOFTCAP,
                              backward: bool = typer.Option(False, "--backward", help="explain the backward's pick"),
                              rule_set: str = RULE_SET, strategy: str = STRATEGY,
                              arch: Optional[str] = EXPLAIN_ARCH,
                              limit: int = limit_option(10, "candidates shown per list")) -> None:
    """Show every candidate for an attention: the ranking with its terms, and why each refused one refused."""
    problem = _problem(b, hq, hkv, sq, skv, d, dv, dtype, layout, causal, align, window, softcap, backward)
    check_addressable(attention_footprint(problem, validate=False, backward=backward))
    emit(dispatcher_for(OpKind.ATTENTION, rule_set, strategy, arch).explain(problem).to_dict(limit=limit or None))
