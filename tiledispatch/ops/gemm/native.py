"""A GEMM whose three picks are the vendor's, run as PyTorch runs it.

An eager call that autograd records runs the op's twin (library.py), whose backward computes
dA = dC B^T and dB = A^T dC, each selected for its own problem. Where the dispatcher gives the
forward and both products to the vendor (cuBLAS through PyTorch), that is what PyTorch's own
`mm`/`addmm` and its autograd compute, without the twin's Python: a recorded 16x16 linear cost
48 us of host time on the H200's host against F.linear's 18
(results/h200/autograd_overhead_profile.txt). `native_forward` makes the decision once per
signature, in the dispatcher's memo, and gives PyTorch's call where it holds.

It holds for 2-D fp16 or bf16 operands (an nn.Linear's flattened input and transposed weight)
with no activation, residual, out dtype or scales in the op, the result in the operands' dtype;
fp32's TF32 choice stays the vendor family's own to make.
"""

from __future__ import annotations

import torch

from ...core.dispatcher import dispatcher_or_default
from ...core.replay import tensor_meta
from .config import Family
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
    if a.dtype not in _NATIVE_DTYPES or a.dim() != 2 or b.dim() != 2 or b.dtype != a.dtype:
        return None
    if bias is not None and (bias.dtype != a.dtype or bias.dim() != 1):
        return None
    key = ("gemm-native", tensor_meta(a), tensor_meta(b), None if bias is None else tensor_meta(bias))
    chosen = dispatcher_or_default(dispatcher, a)
    native = chosen.memo(key, lambda: _decide(chosen, a, b, bias))
    return None if native is _SEPARATE else native


def _meta(t: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    shape, stride = tuple(t.shape), t.stride()
    if transposed:
        shape, stride = shape[::-1], stride[::-1]
    return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")


def _decide(dispatcher, a, b, bias):
    forward = check_operands(a, b, bias=bias)
    if forward.problem.wide_offsets or not _vendor(dispatcher, forward.problem, a.device):
        return _SEPARATE
    dc = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="meta")
    for x, y in ((dc, _meta(b, transposed=True)), (_meta(a, transposed=True), dc)):  # dA = dC B^T, dB = A^T dC
        problem = check_operands(x, y).problem
        if problem.wide_offsets or not _vendor(dispatcher, problem, a.device):
            return _SEPARATE
    return _mm if bias is None else _addmm


def _vendor(dispatcher, problem, device) -> bool:
    return dispatcher.select(problem, device=device).family == Family.VENDOR.value
