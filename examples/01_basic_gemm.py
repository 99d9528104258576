"""A GEMM with a fused epilogue, picked and run by the default dispatcher.

    python examples/01_basic_gemm.py
Runs on the GPU if there is one, else on the CPU under Triton's interpreter.
"""

import tiledispatch  # first: without a GPU it switches Triton to its interpreter

import torch

from tiledispatch.core.runtime import current_backend

device = current_backend().device
dtype = torch.bfloat16 if device == "cuda" else torch.float16  # the interpreter has no bf16 tl.dot
a = torch.randn(200, 96, device=device, dtype=dtype)
b = torch.randn(96, 150, device=device, dtype=dtype)
bias = torch.randn(150, device=device, dtype=dtype)

c = tiledispatch.gemm(a, b, bias=bias, activation="gelu")

reference = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
error = ((c.double() - reference).norm() / reference.norm()).item()
print(f"{tuple(c.shape)} {c.dtype} on {device}: relative error {error:.1e}")
assert error < 2e-2
