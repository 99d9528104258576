"""A GEMM whose three picks are the vendor's, run as PyTorch runs it.

An eager call that autograd records runs the op's twin (library.py), whose backward computes
dA = dC B^T and dB = A^T dC, each selected for its own problem. Where the dispatcher gives the
forward and both products to the vendor (cuBLAS through PyTorch), that is what PyTorch's own
`mm`/`addmm` and its autograd compute, without the twin's Python: a recorded 16x16 linear cost
48 us of host time on the H200's host against F.linear's 18
(results/h200/autograd_overhead_profile.txt). So the three picks' savings over the vendor are
weighed together against the twin's host time (`core.hostcost.native_for_recorded`): where they
are not expected to save it, eager calls run PyTorch's op (a graph capture runs the twin, whose
products replay the device's picks). A GEMM's gradients are GEMMs,
which the estimates cover as they cover its forward. `native_forward` makes the decision once
per signature, in the dispatcher's memo, and gives PyTorch's call where it holds.

It holds for 2-D fp16 or bf16 operands (an nn.Linear's flattened input and transposed weight)
with no activation, residual, out dtype or scales in the op, the result in the operands' dtype;
fp32's TF32 choice stays the vendor family's own to make.
"""

from __future__ import annotations

import torch

from ...core.dispatcher import dispatcher_or_default
from ...core.hostcost import capturing, native_for_recorded
from ...core.replay import tensor_meta
from . import fastpath
from .operands import check_operands

_NATIVE_DTYPES = (torch.float16, torch.bfloat16)
_SEPARATE = object()  # a signature the twin runs


def _mm(a, b, bias):
    return torch.mm(a, b)


def _addmm(a, b, bias):
    return torch.addmm(bias, a, b)


def native_forward(a, b, bias, dispatcher):
    """PyTorch's product for a recorded 2-D call whose forward and both gradients the dispatcher
    gives the vendor, called as native(a, b, bias); else None."""
    return _unless_captured(_decision(a, b, bias, dispatcher_or_default(dispatcher, a)))


def recorded_native(a, b, bias, allow_tf32, dispatcher):
    """`native_forward` for a recorded call on the GPU with no epilogue but a bias (no activation,
    residual, out, out dtype, scales or forced kernel), keyed as the fast path keys the call: an
    nn.Linear's every training step asks, and the key skips the checks `gemm()`'s recorded path
    makes first. None where the op's twin runs it, or where the call has no key."""
    decision = recorded_decision(a, b, bias, allow_tf32, dispatcher)
    return None if decision is None else _unless_captured(decision)


def recorded_decision(a, b, bias, allow_tf32, dispatcher) -> tuple | None:
    """(PyTorch's product, whether a graph capture must not run it) for a plain recorded call
    whatever captures, or None: `recorded_native` before the capture's say."""
    key = fastpath.call_key(a, b, bias, None, None, None, None, allow_tf32, None, None, None)
    if key is None:
        return None
    chosen = dispatcher_or_default(dispatcher, a)
    native, weighed_pick = chosen.memo(("recorded", key), lambda: _decision(a, b, bias, chosen))
    return None if native is _SEPARATE else (native, weighed_pick)


def _unless_captured(decision: tuple):
    native, weighed_pick = decision
    return None if native is _SEPARATE or weighed_pick and capturing() else native


def _decision(a, b, bias, chosen) -> tuple:
    """(PyTorch's product or _SEPARATE, whether a pick was weighed to the vendor), once a signature."""
    if a.dtype not in _NATIVE_DTYPES or a.dim() != 2 or b.dim() != 2 or b.dtype != a.dtype:
        return _SEPARATE, False
    if bias is not None and (bias.dtype != a.dtype or bias.dim() != 1):
        return _SEPARATE, False
    key = ("gemm-native", tensor_meta(a), tensor_meta(b), None if bias is None else tensor_meta(bias))
    return chosen.memo(key, lambda: _decide(chosen, a, b, bias))


def _meta(t: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    shape, stride = tuple(t.shape), t.stride()
    if transposed:
        shape, stride = shape[::-1], stride[::-1]
    return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")


def _decide(dispatcher, a, b, bias) -> tuple:
    """(PyTorch's product, whether a pick was weighed to the vendor) or (_SEPARATE, False)."""
    forward = check_operands(a, b, bias=bias)
    dc = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="meta")
    # the forward, then dA = dC B^T and dB = A^T dC
    problems = (forward.problem, *(check_operands(x, y).problem for x, y in (
        (dc, _meta(b, transposed=True)), (_meta(a, transposed=True), dc))))
    if any(problem.wide_offsets for problem in problems):
        return _SEPARATE, False
    weighed = native_for_recorded(dispatcher, problems, a.device)
    return (_SEPARATE, False) if weighed is None else ((_mm if bias is None else _addmm), weighed)
