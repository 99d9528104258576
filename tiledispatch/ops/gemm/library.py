"""tiledispatch::gemm, the custom op torch.compile traces, and its eager twin GemmFunction, which
autograd records on an eager call (see tiledispatch/library.py): its kernel is `gemm()`'s fast
path, its fake the result's shape and dtype, and its autograd the two products dA = dC B^T and
dB = A^T dC, each a GEMM selected for its own problem, plus dbias (dC summed over the rows) and
dresidual (dC).

The op's autograd differentiates the linear part only: `gemm()` keeps an activation out of
the op while recording (it keeps the pre-activation and applies the activation as a PyTorch
op, whose own autograd takes its derivative). Batched operands follow gemm's broadcast: an
operand shared by the batch (2-D, or a batch of 1) gets the sum over the batch.
"""

from typing import Optional

import torch

from ...core.errors import UnsupportedError
from .. import inductor
from ..library_common import DEFAULT_DISPATCHER, custom_op, dispatcher_of, eager_twin, runs_eagerly
from . import FP8, check_operands, gemm as _gemm
from .problem import Activation


def gemm_kernel(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
                residual: Optional[torch.Tensor], out_dtype: Optional[torch.dtype], allow_tf32: bool,
                scale_a: Optional[torch.Tensor], scale_b: Optional[torch.Tensor], kernel: Optional[str],
                dispatcher: int) -> torch.Tensor:
    """`gemm()` on real tensors, outside autograd: the fast path, result contiguous as the fake says."""
    with torch.no_grad():
        c = _gemm(a, b, bias=bias, activation=activation, residual=residual, out_dtype=out_dtype,
                  allow_tf32=allow_tf32, scale_a=scale_a, scale_b=scale_b, kernel=kernel,
                  dispatcher=dispatcher_of(dispatcher))
    return c if c.is_contiguous() else c.contiguous()


gemm_op = custom_op("gemm", gemm_kernel)


@inductor.decomposes(gemm_op)
def _gemm_as_aten(a, b, bias, activation, residual, out_dtype, allow_tf32, scale_a, scale_b, kernel, dispatcher):
    """aten.mm or aten.addmm where the default dispatcher picks the vendor for this traced product (2-D
    16-bit operands, a bias in their dtype or none, nothing else in the op; inductor.py)."""
    if (a.dim() != 2 or b.dim() != 2 or a.dtype not in inductor.VENDOR_DTYPES or b.dtype != a.dtype
            or activation is not None or residual is not None or out_dtype not in (None, a.dtype)
            or scale_a is not None or scale_b is not None or kernel is not None or dispatcher != DEFAULT_DISPATCHER
            or bias is not None and (bias.dtype != a.dtype or bias.dim() != 1)):
        return NotImplemented
    metas = inductor.static_metas(a, b, bias)

    def problem(tensors):
        operands = check_operands(tensors[0], tensors[1], bias=tensors[2])
        return None if operands.problem.wide_offsets else operands.problem
    if metas is None or not inductor.picks_vendor(("gemm", metas), a, problem):
        return NotImplemented
    return torch.ops.aten.mm(a, b) if bias is None else torch.ops.aten.addmm(bias, a, b)


@gemm_op.register_fake
def _gemm_fake(a, b, bias, activation, residual, out_dtype, allow_tf32, scale_a, scale_b, kernel, dispatcher):
    inductor.register()
    dtype = out_dtype if out_dtype is not None else torch.bfloat16 if a.dtype in FP8 else a.dtype
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        return a.new_empty((m, n), dtype=dtype)
    batch_a = a.shape[0] if a.dim() == 3 else 1
    batch_b = b.shape[0] if b.dim() == 3 else 1
    return a.new_empty((batch_b if batch_a == 1 else batch_a, m, n), dtype=dtype)


def product(x: torch.Tensor, y: torch.Tensor, allow_tf32: bool, dispatcher: int) -> torch.Tensor:
    """x @ y by tiledispatch's GEMM, selected for this problem: the fast path in an eager backward,
    the custom op in a trace or a double backward."""
    if runs_eagerly(x, y):
        return _gemm(x, y, allow_tf32=allow_tf32, dispatcher=dispatcher_of(dispatcher))
    return gemm_op(x, y, None, None, None, None, allow_tf32, None, None, None, dispatcher)


def _grad_a(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, allow_tf32: bool, token: int) -> torch.Tensor:
    """dA = dC B^T, summed over the batch where a is shared by it."""
    if dc.dim() == 2 or (a.dim() == 3 and a.shape[0] == dc.shape[0]):
        return product(dc, b.transpose(-1, -2), allow_tf32, token)
    batch, m, n = dc.shape  # a is (M, K) or (1, M, K), b is (batch, K, N)
    da = product(dc.permute(1, 0, 2).reshape(m, batch * n), b.transpose(1, 2).reshape(batch * n, -1),
                 allow_tf32, token)
    return da.reshape(a.shape)


def _grad_b(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, allow_tf32: bool, token: int) -> torch.Tensor:
    """dB = A^T dC, summed over the batch where b is shared by it."""
    if dc.dim() == 2 or (b.dim() == 3 and b.shape[0] == dc.shape[0]):
        return product(a.transpose(-1, -2), dc, allow_tf32, token)
    batch, m, n = dc.shape  # b is (K, N) or (1, K, N), a is (batch, M, K)
    db = product(a.reshape(batch * m, -1).transpose(0, 1), dc.reshape(batch * m, n), allow_tf32, token)
    return db.reshape(b.shape)


def _reduce_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of a residual broadcast over the batch: summed back to its shape."""
    if grad.dim() > like.dim():
        return grad.sum(0)
    if like.dim() == 3 and like.shape[0] == 1 and grad.shape[0] != 1:
        return grad.sum(0, keepdim=True)
    return grad


def _setup_context(ctx, inputs, output) -> None:
    a, b, bias, activation, residual, _, allow_tf32, _, _, _, dispatcher = inputs
    ctx.save_for_backward(a, b, residual)
    ctx.activation = activation
    ctx.allow_tf32 = allow_tf32
    ctx.dispatcher = dispatcher
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _backward(ctx, dc: torch.Tensor):
    a, b, residual = ctx.saved_tensors
    if a.dtype in FP8:
        raise UnsupportedError("a is fp8: fp8 gemm is forward only (inference); call it under torch.no_grad() "
                               "or with inputs that do not require grad, or train in bf16")
    if Activation.parse(ctx.activation) is not Activation.NONE:
        raise UnsupportedError(
            f"activation={ctx.activation!r}: tiledispatch::gemm differentiates its linear part only; call "
            "tiledispatch.gemm, which applies the activation outside the op when autograd records it")
    needs = ctx.needs_input_grad
    dx = dc if dc.dtype == a.dtype else dc.to(a.dtype)
    da = _grad_a(dx, a, b, ctx.allow_tf32, ctx.dispatcher) if needs[0] else None
    db = _grad_b(dx, a, b, ctx.allow_tf32, ctx.dispatcher) if needs[1] else None
    dbias = None
    if ctx.bias_dtype is not None and needs[2]:
        dbias = dc.sum(dim=tuple(range(dc.dim() - 1)), dtype=torch.float32).to(ctx.bias_dtype)
    dresidual = _reduce_to(dc, residual) if residual is not None and needs[4] else None
    return da, db, dbias, None, dresidual, None, None, None, None, None, None


gemm_op.register_autograd(_backward, setup_context=_setup_context)
GemmFunction = eager_twin("GemmFunction", gemm_kernel, _setup_context, _backward)

__all__ = ["DEFAULT_DISPATCHER", "GemmFunction", "gemm_op", "product"]
