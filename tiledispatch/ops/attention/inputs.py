"""Random operands for an AttentionProblem, laid out as it says: for the CLI, tests and benchmarks.

Values are fresh normal draws (never zeros, which hide unwritten outputs); Q is scaled so
that scores have a spread of about 1 and the softmax is neither flat nor one-hot.
"""

from __future__ import annotations

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
