"""The vendor candidates: PyTorch SDPA's FlashAttention-2 and cuDNN backends.

They take plain attention (no bias, sinks, soft-cap, window or varlen here) with an
optional causal mask on square problems (SDPA's flash backend refuses is_causal when
seqlen_q != seqlen_kv, and its top-left alignment would differ from ours otherwise).
Dropout is refused: its random stream is not ours, so the backward could not replay it.

When the forward must keep the log-sum-exp (training, or return_lse), only the flash
backend is a candidate, through the private ATen entry point that returns it (equal head
counts only). Its LSE is fp32 (batch, heads, seqlen_q) in natural log, the same as the
Triton kernels', so either family's backward can follow either forward. Only the flash
backend is a backward candidate: cuDNN's backward wants its own forward's statistics.
"""

from __future__ import annotations

import torch

from ...core.dtypes import DType
from ...core.validation import Finding, Severity, ValidationResult
from .config import Family, VendorConfig
from .problem import AttentionProblem, Direction, MaskKind, UserMask

MAX_HEAD_DIM = {Family.SDPA_FLASH: 256, Family.SDPA_CUDNN: 128}


def _backend(family: Family):
    from torch.nn.attention import SDPBackend

    return SDPBackend.FLASH_ATTENTION if family is Family.SDPA_FLASH else SDPBackend.CUDNN_ATTENTION


def forward(family: Family, q, k, v, result, scale: float, causal: bool, needs_lse: bool) -> None:
    """Fills `result.out` (and `result.lse` when it is needed) from SDPA."""
    if needs_lse:
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        result.out = out
        result.lse = lse.reshape(q.shape[0], q.shape[1], q.shape[2]).float()
        return
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    with sdpa_kernel([_backend(family)]):
        result.out = scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    result.lse = None


def backward(family: Family, grads, grad_out, q, k, v, out, lse, scale: float, causal: bool) -> None:
    """Fills `grads.dq`, `dk`, `dv` from the flash backend's backward."""
    no_offsets = torch.empty(0, dtype=torch.int32, device=q.device)  # not varlen (the op checks the dtype)
    no_rng = torch.zeros(2, dtype=torch.int64, device=q.device)  # no dropout: the seed is never read
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad_out, q, k, v, out, lse, no_offsets, no_offsets, q.shape[2], k.shape[2], 0.0, causal, no_rng,
        torch.empty(0, dtype=torch.int64, device=q.device), scale=scale)
    grads.dq, grads.dk, grads.dv = dq, dk, dv


def validate(config: VendorConfig, arch) -> ValidationResult:
    from .rules import AttentionRule

    findings = []
    if arch.is_interpreter:
        findings.append(Finding(AttentionRule.FAMILY_ARCH, Severity.ERROR,
                                "the SDPA backends are GPU libraries; the interpreter target runs Triton kernels",
                                "use a GPU arch"))
    elif config.family is Family.SDPA_FLASH and arch.sm is not None and arch.sm < 80:
        findings.append(Finding(AttentionRule.FAMILY_ARCH, Severity.ERROR, "FlashAttention-2 needs sm_80 or newer"))
    elif config.family is Family.SDPA_CUDNN and arch.sm is not None and arch.sm < 90:
        findings.append(Finding(AttentionRule.FAMILY_ARCH, Severity.ERROR,
                                "SDPA's cuDNN attention needs sm_90 or newer", "use sdpa-flash"))
    if config.dtype not in (DType.FP16, DType.BF16):
        findings.append(Finding(AttentionRule.DTYPE_ARCH, Severity.ERROR,
                                f"the SDPA backends take fp16 and bf16, not {config.dtype.value}"))
    if config.family is Family.SDPA_CUDNN and config.direction is Direction.BACKWARD:
        findings.append(Finding(AttentionRule.FAMILY_DIRECTION, Severity.ERROR,
                                "the cuDNN backward needs its own forward's statistics", "use sdpa-flash"))
    if not config.family.is_vendor:
        findings.append(Finding(AttentionRule.FAMILY_DIRECTION, Severity.ERROR,
                                f"{config.family.value} is a Triton family, not a vendor one"))
    return ValidationResult(tuple(findings))


def supports(config: VendorConfig, problem: AttentionProblem) -> str | None:
    p, v = problem, problem.variant
    if config.direction is not p.direction:
        return f"a {config.direction.value} kernel, the problem is {p.direction.value}"
    if config.direction is Direction.BACKWARD:
        # Reachable only through a private ATen op, which refused a standalone call on the
        # H200 (torch 2.11: "batch size must be positive" without its forward's offsets).
        return "SDPA's flash backward is not callable apart from its own forward here; the Triton backward runs"
    if config.dtype is not p.dtype:
        return f"built for {config.dtype.value}, the problem is {p.dtype.value}"
    if p.head_dim_qk != p.head_dim_v:
        return f"SDPA's {config.family.value} needs equal Q/K and V head dims, got {p.head_dim_qk}/{p.head_dim_v}"
    if p.head_dim_qk > MAX_HEAD_DIM[config.family]:
        return f"{config.family.value} takes head dims up to {MAX_HEAD_DIM[config.family]}"
    features = [name for name, on in (("bias", v.bias), ("ALiBi", v.alibi), ("soft-cap", v.softcap),
                                      ("sinks", v.sinks), ("dropout", v.dropout), ("varlen", v.varlen),
                                      ("a mask tensor", v.user_mask is not UserMask.NONE)) if on]
    if features:
        return f"SDPA's {config.family.value} path here takes none of: {', '.join(features)}"
    if p.mask is MaskKind.SLIDING_WINDOW:
        return "SDPA has no sliding window"
    if p.mask is not MaskKind.NONE and p.seqlen_q != p.seqlen_kv:
        return "SDPA's fused backends take is_causal only with seqlen_q == seqlen_kv"
    needs_lse = p.needs_lse or p.direction is Direction.BACKWARD
    if needs_lse and config.family is Family.SDPA_CUDNN:
        return "the LSE is kept for a backward or returned: cuDNN's statistics are not in the kernels' layout"
    if p.heads_q != p.heads_kv and (needs_lse or config.family is Family.SDPA_CUDNN):
        return "GQA/MQA goes to SDPA only for the flash backend's inference forward (enable_gqa)"
    return None
