"""Fused attention with GQA, a causal sliding window and soft-capping; its gradients; the kernels chosen.

Runs on a GPU, or on the CPU under Triton's interpreter (small shapes, fp16).
"""

import torch

import tiledispatch
from tiledispatch.ops.attention import (
                          AttentionOptions,
                          Direction,
                          check_operands,
                          parse_causal,
)

device = "cuda" if torch.cuda.is_available() else "cpu"
q = torch.randn(1, 8, 64, 64, device=device, dtype=torch.float16, requires_grad=True)
k = torch.randn(1, 2, 64, 64, device=device, dtype=torch.float16, requires_grad=True)
v = torch.randn(1, 2, 64, 64, device=device, dtype=torch.float16, requires_grad=True)

out, lse = tiledispatch.attention(q, k, v, causal=True, window=(16, 0), softcap=30.0, return_lse=True)
out.sum().backward()
print("out", tuple(out.shape), "lse", tuple(lse.shape), "dq norm", float(q.grad.float().norm()))

options = AttentionOptions(causal=parse_causal(True), softcap=30.0, needs_lse=True)
dispatcher = tiledispatch.default_dispatcher()
forward = check_operands(q.detach(), k.detach(), v.detach(), options=options).problem
backward = check_operands(q.detach(), k.detach(), v.detach(), options=options, direction=Direction.BACKWARD,
                          out=out.detach(), lse=lse, grad_out=out.detach()).problem
print("forward kernel:", dispatcher.select(forward).name)
print("backward kernel:", dispatcher.select(backward).name)
