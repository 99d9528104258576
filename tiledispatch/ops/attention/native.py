"""An attention call that autograd records, run as PyTorch runs it: cuDNN's attention op, whose
autograd is C++.

An eager call that autograd records runs the op's twin (library.py), an autograd.Function whose
forward and backward run in Python around their kernels. Where the dispatcher's picks for the
forward (keeping the LSE) and the backward are cuDNN's, or ours are not expected to save the
twin's host time over cuDNN's (`core.hostcost.native_for_recorded`), the call is
`aten._scaled_dot_product_cudnn_attention` itself, which autograd records with its own backward:
the same cuDNN kernels the vendor family calls, without the twin's Python. The decision is made
once per signature, in the dispatcher's memo; a graph capture runs the twin where a pick of ours
was weighed away (its replays have no host time).

It holds for plain calls on the GPU: fp16 or bf16, no mask, bias, ALiBi, sinks, soft-cap, window,
dropout, varlen or fp8 scales, no forced kernel, not deterministic, the LSE not returned; causal
only where seqlen_q == seqlen_kv, since cuDNN's causal is top-left and the two alignments agree
there alone.
"""

from __future__ import annotations

import torch

from ...core.hostcost import capturing, native_for_recorded
from ...core.replay import tensor_meta
from .config import Family
from .problem import Direction, MaskKind
from .vendor import CUDNN_FORWARD

_SEPARATE = object()  # a signature the op's twin runs
_DTYPES = (torch.float16, torch.bfloat16)
_NO_TENSORS = {"bias": None, "sinks": None, "mask": None, "alibi_slopes": None, "cu_seqlens_q": None,
               "cu_seqlens_k": None, "scale_q": None, "scale_k": None, "scale_v": None}


class CudnnAttention:
    """out = attention(q, k, v) by cuDNN's op, recorded by PyTorch's autograd. `weighed`: a pick of
    ours was weighed away, so a graph capture runs the twin."""

    def __init__(self, causal: bool, scale: float | None, weighed: bool) -> None:
        self.causal, self.scale, self.weighed = causal, scale, weighed

    def __call__(self, q, k, v) -> torch.Tensor:
        # (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask)
        out, *_ = CUDNN_FORWARD(q, k, v, None, True, 0.0, self.causal, False, scale=self.scale)
        return out


def native_forward(q, k, v, call) -> CudnnAttention | None:
    """cuDNN's op for a plain recorded call (`call`: function.Call, its options read and checked), or
    None: the op's twin runs it."""
    native = native_decision(q, k, v, call)
    return None if native is None or native.weighed and capturing() else native


def native_decision(q, k, v, call) -> CudnnAttention | None:
    """native_forward's answer outside a capture: cuDNN's op, or None where the twin runs the call
    whatever the capture."""
    o = call.options
    if (call.dispatcher is None or call.traced or call.kernel is not None or call.backward_kernel is not None
            or type(q) is not torch.Tensor or not q.is_cuda or q.dtype not in _DTYPES or o.window is not None
            or o.softcap is not None or o.dropout_p or o.deterministic or q.dim() != 4
            or o.causal is not MaskKind.NONE and q.shape[2] != k.shape[2]):
        return None
    key = ("attention-native", tensor_meta(q), tensor_meta(k), tensor_meta(v), o)
    native = call.dispatcher.memo(key, lambda: _decide(call, q, k, v))
    return None if native is _SEPARATE else native


def _decide(call, q, k, v):
    """A CudnnAttention where the forward's and the backward's picks are cuDNN's or not expected to
    save the twin's host time over it, else _SEPARATE."""
    from .function import _checked

    dispatcher, o = call.dispatcher, call.options
    forward = _checked(dispatcher, q, k, v, _NO_TENSORS, o)
    out = q.new_empty((*q.shape[:3], v.shape[3]))
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    backward = _checked(dispatcher, q, k, v, _NO_TENSORS, o, direction=Direction.BACKWARD, out=out, lse=lse,
                        grad_out=torch.empty_like(out))
    problems = (forward.problem, backward.problem)
    for problem in problems:  # cuDNN is a candidate, and no other vendor is the pick
        pick = dispatcher.select(problem, device=q.device)
        cudnn = any(c.spec.family == Family.SDPA_CUDNN.value for c in dispatcher.ranked(problem))
        if not cudnn or pick.is_vendor and pick.family != Family.SDPA_CUDNN.value:
            return _SEPARATE
    weighed = native_for_recorded(dispatcher, problems, q.device)
    if weighed is None:
        return _SEPARATE
    return CudnnAttention(o.causal is not MaskKind.NONE, o.scale, weighed)
