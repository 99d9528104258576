"""The ops as PyTorch custom ops (torch.library, namespace "tiledispatch"): what autograd and
torch.compile see.

An eager call whose result autograd does not record calls the op's fast path directly: the
torch.library dispatcher costs about 10 us a call, more than a replayed GEMM's whole host
time. A call that autograd records, or that torch.compile traces, goes through the custom op
instead, whose fake implementation gives the result's shape, dtype and strides without
running a kernel, and whose registered autograd runs each gradient through the dispatcher
as a problem of its own. Each op's module (ops/<op>/library.py) registers its ops; importing
this module (tiledispatch does) registers them all:

    tiledispatch::gemm
    tiledispatch::conv, tiledispatch::conv_backward_data, tiledispatch::conv_backward_weight
    tiledispatch::attention, tiledispatch::attention_backward
"""

from __future__ import annotations

from .ops.attention import library as attention  # noqa: F401
from .ops.conv import library as conv  # noqa: F401
from .ops.gemm import library as gemm  # noqa: F401
from .ops.library_common import DEFAULT_DISPATCHER, dispatcher_token

__all__ = ["DEFAULT_DISPATCHER", "attention", "conv", "dispatcher_token", "gemm"]
