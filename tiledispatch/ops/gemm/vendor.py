"""The vendor candidate's run: cuBLAS through PyTorch, with the epilogue as separate steps.

It takes any strides (PyTorch copies what cuBLAS cannot read); fp8 goes through
``torch._scaled_mm``, which wants A row-major, B column-major, K and N multiples of 16 and no
batch. Its rules, ranking and plan are the vendor family's (families/vendor.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.dtypes import DType
from ...core.switches import TF32
from .problem import Activation, Epilogue, GemmTypes

# cuBLAS takes each matrix's leading dimension as a 32-bit int: a wider stride is copied first.
LEADING_DIM_LIMIT = 2**31

ACTIVATIONS = {Activation.NONE: None, Activation.RELU: F.relu, Activation.GELU: F.gelu, Activation.SILU: F.silu}


def is_plain(operands) -> bool:
    """Whether the call is one cuBLAS matmul into the output, with nothing before or after."""
    p = operands.problem
    return (p.epilogue.plain and not p.types.scaled and p.types.c is p.types.a
            and (operands.out is None or operands.out.is_contiguous()))


def adds_bias_alone(operands, result_2d: bool) -> bool:
    """Whether the call is one cuBLASLt addmm, the bias in its epilogue: a 2-D 16-bit product plus a
    bias of its dtype, and nothing else (an nn.Linear's call)."""
    p = operands.problem
    return (result_2d and p.epilogue == Epilogue(bias=True) and p.types.a in (DType.FP16, DType.BF16)
            and p.types.b is p.types.c is p.types.a
            and operands.bias.dtype == operands.a.dtype and (operands.out is None or operands.out.is_contiguous()))


def _addressable(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a contiguous copy where a matrix stride is past what cuBLAS can address."""
    if any(s >= LEADING_DIM_LIMIT for s, n in zip(t.stride()[-2:], t.shape[-2:]) if n > 1):
        return t.contiguous()
    return t


def tf32_switch(types: GemmTypes) -> bool | None:
    """What cuBLAS's TF32 switch must read for a product of these types (`core.switches.TF32`): the
    problem's own choice for fp32 inputs, None (the switch is not read) for any other."""
    return types.allow_tf32 if types.a is DType.FP32 else None


def run(a, b, out, bias, residual, scale_a, scale_b, activation: Activation, tf32: bool | None = None) -> None:
    """out = activation(scale * a @ b + bias) + residual, on batched (3-D) views; `tf32` as
    `tf32_switch` gives it."""
    if tf32 is not None:
        with TF32(torch.backends.cuda.matmul, tf32):
            return run(a, b, out, bias, residual, scale_a, scale_b, activation)
    a, b = _addressable(a), _addressable(b)
    plain = bias is None and residual is None and activation is Activation.NONE
    if plain and scale_a is None and out.dtype == a.dtype and out.is_contiguous():
        if a.shape[0] == b.shape[0] == out.shape[0] == 1:
            torch.mm(a[0], b[0], out=out[0])  # straight into the output: no extra pass
        else:
            torch.matmul(a, b, out=out)
        return
    if scale_a is not None:
        if residual is None and activation is Activation.NONE and out.is_contiguous():
            # Straight into the output, bias in cuBLASLt's epilogue: a copy cost 15 % on small M.
            torch._scaled_mm(a[0], b[0], scale_a, scale_b, bias=bias, out_dtype=out.dtype, out=out[0])
            return
        result = torch._scaled_mm(a[0], b[0], scale_a, scale_b, out_dtype=out.dtype).unsqueeze(0)
        if bias is not None:
            result += bias
    elif bias is not None and a.shape[0] == 1 and b.shape[0] == 1 and out.dtype == a.dtype:
        result = torch.addmm(bias, a[0], b[0]).unsqueeze(0)  # cuBLASLt adds the bias in its epilogue
    else:
        result = torch.matmul(a, b) if out.dtype == a.dtype else torch.matmul(a.float(), b.float())
        if bias is not None:
            result += bias
    if ACTIVATIONS[activation] is not None:
        result = ACTIVATIONS[activation](result)
    if residual is not None:
        result += residual
    out.copy_(result.expand_as(out))


def warm_up(types: GemmTypes, device) -> None:
    """Creates this thread's cuBLAS(Lt) handle by one tiny matmul: a CUDA graph capture cannot
    (CUBLAS_STATUS_NOT_INITIALIZED), and a capture may be the first to run the vendor path."""
    if types.scaled:
        x = torch.ones(16, 16, device=device).to(types.a.torch)
        one = torch.ones((), device=device)
        torch._scaled_mm(x, x.t(), one, one, out_dtype=types.c.torch)
    else:
        x = torch.ones(16, 16, device=device, dtype=types.a.torch)
        torch.mm(x, x)
