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

# Inference in fp8 (e4m3): per-tensor dequantization scales, a bf16 output, no gradients.
def quantize(x):
    scale = (x.detach().float().abs().amax() / 448).reshape(1)
    return (x.detach().float() / scale).to(torch.float8_e4m3fn), scale


(q8, sq), (k8, sk), (v8, sv) = quantize(q), quantize(k), quantize(v)
with torch.no_grad():
    out8 = tiledispatch.attention(q8, k8, v8, scale_q=sq, scale_k=sk, scale_v=sv, causal=True, window=(16, 0),
                                  softcap=30.0)
reference = out.detach().float()
print("fp8 out", out8.dtype, "relative difference to fp16 (the inputs' quantization):",
      float((out8.float() - reference).norm() / reference.norm()))
