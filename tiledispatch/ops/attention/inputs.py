"""Random operands for an AttentionProblem, laid out as it says: for the CLI, tests and benchmarks.

Values are fresh normal draws (never zeros, which hide unwritten outputs); Q is scaled so
that scores have a spread of about 1 and the softmax is neither flat nor one-hot.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .problem import AttentionProblem, Layout


@dataclass(frozen=True)
class AttentionInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None


def _tensor(batch: int, heads: int, seqlen: int, dim: int, layout: Layout, dtype, device, g) -> torch.Tensor:
    if layout is Layout.BSHD:
        return torch.randn(batch, seqlen, heads, dim, generator=g).to(device=device, dtype=dtype).transpose(1, 2)
    return torch.randn(batch, heads, seqlen, dim, generator=g).to(device=device, dtype=dtype)


def make_inputs(problem: AttentionProblem, device="cpu", seed: int = 0) -> AttentionInputs:
    g = torch.Generator().manual_seed(seed)
    p, dtype = problem, problem.dtype.torch
    if p.seqlens:
        tq, tk = p.tokens()
        q = torch.randn(tq, p.heads_q, p.head_dim_qk, generator=g).to(device=device, dtype=dtype)
        k = torch.randn(tk, p.heads_kv, p.head_dim_qk, generator=g).to(device=device, dtype=dtype)
        v = torch.randn(tk, p.heads_kv, p.head_dim_v, generator=g).to(device=device, dtype=dtype)
        cu_q = torch.tensor([0] + [sum(s[0] for s in p.seqlens[:i + 1]) for i in range(p.batch)], dtype=torch.int32)
        cu_k = torch.tensor([0] + [sum(s[1] for s in p.seqlens[:i + 1]) for i in range(p.batch)], dtype=torch.int32)
        return AttentionInputs(q, k, v, cu_q.to(device), cu_k.to(device))
    q = _tensor(p.batch, p.heads_q, p.seqlen_q, p.head_dim_qk, p.layout, dtype, device, g)
    k = _tensor(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim_qk, p.layout, dtype, device, g)
    v = _tensor(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim_v, p.layout, dtype, device, g)
    return AttentionInputs(q, k, v, None, None)


SOFTCAP = 30.0  # the cap of a soft-capped problem's fresh operands (Gemma 2's): the problem holds no value


def _options(problem: AttentionProblem):
    from .operands import AttentionOptions
    from .problem import Direction, MaskKind

    causal = problem.mask if problem.mask in (MaskKind.CAUSAL_TOP_LEFT, MaskKind.CAUSAL_BOTTOM_RIGHT) else None
    window = (problem.window.left, problem.window.right) if problem.mask is MaskKind.SLIDING_WINDOW else None
    return AttentionOptions(causal=causal, window=window, softcap=SOFTCAP if problem.variant.softcap else None,
                            needs_lse=problem.needs_lse or problem.direction is Direction.BACKWARD,
                            deterministic=problem.deterministic)


@functools.lru_cache(maxsize=4)
def _rules_dispatcher(backend):
    """A dispatcher of the default rule set ranked by rules alone, for a backward's forward: the
    calling dispatcher may be autotuning that backward, under a lock a forward's tuning would take."""
    from ...core.dispatcher import Dispatcher, Strategy
    from ...core.registry import Registry
    from ...core.runtime import current_arch
    from .problem import KIND

    arch = current_arch(backend)
    return Dispatcher(Registry.from_rule_sets([KIND], "default", arch), arch, strategy=Strategy.RULES)


def _forward(operands):
    """O and LSE of checked forward operands, by the rules' pick on their device: what a training
    step's forward hands its backward, in moments where a float64 reference takes minutes."""
    from ...core.runtime import Backend

    backend = Backend.CUDA if operands.device.type == "cuda" else Backend.INTERPRETER
    return _rules_dispatcher(backend).run(operands)


def tuning_operands(problem: AttentionProblem, device, seed: int = 0):
    """Fresh checked operands of exactly this problem (for `autotune` and sweeps), or None: a problem
    with a mask or bias tensor, ALiBi or dropout, whose values fresh draws cannot stand for, or whose
    layout fresh tensors do not reproduce. A backward problem's O and LSE are those its forward gives
    on the same device (`_forward`), its dO a fresh draw."""
    from .operands import check_operands
    from .problem import Direction, UserMask

    v = problem.variant
    if v.user_mask is not UserMask.NONE or v.bias or v.alibi or v.dropout or v.bias_grad:
        return None
    inputs = make_inputs(problem, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    sinks = torch.randn(problem.heads_q, generator=g).to(device) if v.sinks else None
    common = dict(options=_options(problem), sinks=sinks, cu_seqlens_q=inputs.cu_seqlens_q,
                  cu_seqlens_k=inputs.cu_seqlens_k)
    forward = check_operands(inputs.q, inputs.k, inputs.v, **common)
    if problem.direction is Direction.FORWARD:
        return forward if forward.problem == problem else None
    from .plan import like_layout

    result = _forward(forward)
    out, lse = result.out, result.lse
    grad_out = like_layout(inputs.q, problem.head_dim_v)
    grad_out.copy_(torch.randn(out.shape, generator=g).to(grad_out.dtype))
    operands = check_operands(inputs.q, inputs.k, inputs.v, direction=Direction.BACKWARD, out=out, lse=lse,
                              grad_out=grad_out, **common)
    return operands if operands.problem == problem else None


def reference_output(operands):
    """The float64 result the sweep checks each kernel against, on the operands' device (float64
    math there is exact, and a 2-TFLOP problem takes the CPU minutes): (out, lse) forward,
    (dq, dk, dv) backward."""
    from .problem import Direction
    from .reference import gradients, reference, reference_from

    device = operands.q.device
    if operands.problem.direction is Direction.FORWARD:
        return reference(operands, device=device)
    f64 = [t.detach().to(device, torch.float64) for t in (operands.q, operands.k, operands.v)]
    sinks = None if operands.sinks is None else operands.sinks.detach().to(device, torch.float64)
    common = {"scale": operands.scale, "softcap": operands.softcap, "sinks": sinks}
    if operands.cu_seqlens_q is None:
        grad_out = operands.grad_out.detach().to(device, torch.float64).reshape(
            *f64[0].shape[:3], operands.problem.head_dim_v)
        return gradients(*f64, grad_out, operands.problem, **common)
    f64 = [t.requires_grad_(True) for t in f64]
    out, _ = reference_from(*f64, operands.problem, cu_seqlens_q=operands.cu_seqlens_q.cpu(),
                            cu_seqlens_k=operands.cu_seqlens_k.cpu(), **common)
    grad_out = operands.grad_out.detach().to(device, torch.float64).reshape(out.shape)
    return torch.autograd.grad(out, f64, grad_out)


def check_output(output, expected, operands):
    """A plan's output (AttentionResult or AttentionGrads) against `reference_output`: the worst of
    its parts, each under the dtype's tolerance (the LSE, where the problem asks for it, `compare_lse`'s)."""
    from .problem import Direction
    from .reference import compare_lse, compare_tensors, tolerance

    problem = operands.problem
    if problem.direction is Direction.FORWARD:
        checks = [compare_tensors(output.out, expected[0], tolerance(problem.dtype))]
        if problem.needs_lse:
            checks.append(compare_lse(output.lse, expected[1], operands.q, operands.k, operands.scale,
                                      operands.scale_q, operands.scale_k))
    else:
        tol = tolerance(problem.dtype, gradient=True)
        checks = [compare_tensors(got, ref, tol) for got, ref in zip((output.dq, output.dk, output.dv), expected)]
    failed = [c for c in checks if not c.passed]
    return failed[0] if failed else max(checks, key=lambda c: c.relative_error / c.tolerance)
