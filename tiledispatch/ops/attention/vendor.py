"""What the vendor families' units call: PyTorch SDPA's FlashAttention-2 and cuDNN backends
(families/sdpa.py holds what those families take and how they rank).

They take plain attention (no bias, sinks, soft-cap, window or varlen here) with an
optional causal mask on square problems (SDPA's fused backends take is_causal only when
seqlen_q == seqlen_kv, and their top-left alignment would differ from ours otherwise).
cuDNN's inference forward also takes a mask tensor, as its additive bias (`mask_bias`).
Dropout is refused: its random stream is not ours, so the backward could not replay it.

Inference forward (no LSE kept): cuDNN through its private op without the LSE (public SDPA
under `sdpa_kernel` costs 15 us of host time a call for the context); flash through public
SDPA with one backend, GQA through enable_gqa.

Forward that keeps the log-sum-exp (training, or return_lse): cuDNN through its private
ATen op `_scaled_dot_product_cudnn_attention` (MHA and GQA), or flash through
`_scaled_dot_product_flash_attention` (equal head counts only).

The LSE contract: every forward (Triton or vendor) hands back the LSE as fp32 (batch,
heads_q, seqlen_q), natural log, the sequence dim of stride 1. cuDNN's own is (B, H, S, 1)
and is returned as a (B, H, S) view of it (on the H200 it equals the Triton forward's to
2e-6); flash's is (B, H, S) already. So any backward can follow any forward.

Backward: cuDNN through `_scaled_dot_product_cudnn_attention_backward`, which reads the
LSE as (B, H, S, 1): ours is viewed so, never copied (it worked with the Triton forward's
LSE on the H200: relative errors 2.4e-3 against fp32). The private ops build their cuDNN
graph from the tensors' own strides (BHSD or BSHD alike, the head dim contiguous), so the
plan passes the caller's views as they are. The flash backward is refused (families/sdpa.py says why).
"""

from __future__ import annotations

import functools

import torch

from ...core.errors import UnsupportedError
from .config import Family

# Head dims cuDNN takes here. cuDNN >= 9.10 takes up to 256 on sm_90 itself (torch's own gate;
# the H200 benchmark ran SDPA cuDNN at d=256, forward and backward, torch 2.11 and cuDNN 9.19);
# elsewhere 128. `cudnn_max_head_dim` asks the runtime.
CUDNN_MAX_HEAD_DIM = 128
CUDNN_HOPPER_MAX_HEAD_DIM = 256
CUDNN_HOPPER_MIN_VERSION = 91000
# The cuDNN backward takes K/V with fewer heads than Q (GQA/MQA) as they are: torch's dense
# backward sizes dK/dV like K/V and cuDNN's graph reads each tensor's own dims, and SDPA
# cuDNN with enable_gqa ran forward+backward on the H200 suite's GQA cases. If
# tests/ops/attention/test_gpu.py::test_cudnn_backward_gqa[native] ever fails, set this to
# False: K/V are then expanded to heads_q and dK/dV summed back over each group.
CUDNN_BACKWARD_TAKES_GQA = True


@functools.lru_cache(maxsize=1)
def cudnn_max_head_dim() -> int:
    """The largest head dim the cuDNN backend takes on this machine (128 without a GPU)."""
    if not torch.cuda.is_available():
        return CUDNN_MAX_HEAD_DIM
    version = torch.backends.cudnn.version() or 0
    if version >= CUDNN_HOPPER_MIN_VERSION and torch.cuda.get_device_capability() == (9, 0):
        return CUDNN_HOPPER_MAX_HEAD_DIM
    return CUDNN_MAX_HEAD_DIM


def _backend(family: Family):
    from torch.nn.attention import SDPBackend

    return SDPBackend.FLASH_ATTENTION if family is Family.SDPA_FLASH else SDPBackend.CUDNN_ATTENTION


@functools.lru_cache(maxsize=16)
def _no_rng(device: torch.device) -> torch.Tensor:
    """A 0-dim int64 zero on the device: the philox seed and offset of a backward without
    dropout (cuDNN reads them only when dropout_p > 0). Made once per device, never written."""
    return torch.zeros((), dtype=torch.int64, device=device)


def _lse_bhs(lse: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A vendor's LSE as our (batch, heads_q, seqlen_q) fp32 with a unit sequence stride."""
    lse = lse.reshape(q.shape[0], q.shape[1], q.shape[2])
    if lse.dtype != torch.float32:
        lse = lse.float()
    return lse if lse.stride(-1) == 1 else lse.contiguous()


def padded_keys(keys: int) -> int:
    """The keys a bias row holds: 16 bytes of a 16-bit dtype, the alignment cuDNN asks of its strides."""
    return -(-keys // 8) * 8


def mask_bias(mask: torch.Tensor, q: torch.Tensor, full: tuple[int, int, int, int]) -> torch.Tensor:
    """A mask tensor as the additive bias cuDNN adds to the scaled scores, expanded to `full`
    (batch, heads_q, seqlen_q, seqlen_kv): 0 where a bool (or its uint8 view) mask attends and -inf where
    it does not; an additive mask as it is. cuDNN gives a row that sees no key zeros, as our kernels do
    (benchmarks/results/h200/attention_masked.txt; public SDPA's bool path does not).

    Made on the mask's own dims (its broadcast ones, of stride 0, kept at one: a (B, 1, S, S) mask
    costs B*S*S, not B*H*S*S; the key dim always whole) in rows of `padded_keys`. The fill values are
    Python scalars: a CPU tensor would be a copy, which a CUDA graph capture refuses."""
    compact = mask[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in mask.stride()[:-1])]
    keys = compact.shape[-1]
    rows = torch.empty((*compact.shape[:-1], padded_keys(keys)), dtype=q.dtype, device=q.device)[..., :keys]
    if compact.dtype in (torch.bool, torch.uint8):
        rows.fill_(float("-inf")).masked_fill_(compact.view(torch.bool), 0.0)
    else:
        rows.copy_(compact)
    return rows.expand(full)


# cuDNN's forward op by its C++ binding in torch's namespace, where this torch has one: the
# torch.ops packet resolves its overload in Python on every call (3-7 us of host time a call).
CUDNN_FORWARD = getattr(torch, "_scaled_dot_product_cudnn_attention", None) or \
    torch.ops.aten._scaled_dot_product_cudnn_attention


def cudnn_forward_op(q, k, v, scale: float, causal: bool, keep_lse: bool = True,
                     bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's forward: (out in Q's layout, LSE (B, H, S, 1) fp32 when `keep_lse`), `bias` added to the scores."""
    # (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask)
    out, lse, *_ = CUDNN_FORWARD(q, k, v, bias, keep_lse, 0.0, causal, False, scale=scale)
    return out, lse


def cudnn_backward_op(grad_out, q, k, v, out, lse4, scale: float, causal: bool):
    """cuDNN's backward: (dq, dk, dv) shaped and laid out like q, k, v; `lse4` is (B, H, S, 1) fp32."""
    no_rng = _no_rng(q.device)
    # (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
    #  cum_seq_k, max_q, max_k, dropout_p, is_causal)
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        grad_out, q, k, v, out, lse4, no_rng, no_rng, None, None, None, q.shape[2], k.shape[2], 0.0, causal,
        scale=scale)


def forward(family: Family, q, k, v, result, scale: float, causal: bool, needs_lse: bool,
            mask: torch.Tensor | None = None) -> None:
    """Fills `result.out` (and `result.lse` when it is needed) from SDPA; a `mask` (cuDNN's only,
    families/sdpa.py) broadcasts to (batch, heads_q, seqlen_q, seqlen_kv)."""
    if family is Family.SDPA_CUDNN:  # the private op: public SDPA would cost a backend context per call
        bias = None if mask is None else mask_bias(mask, q, (*q.shape[:3], k.shape[2]))
        out, lse = cudnn_forward_op(q, k, v, scale, causal, keep_lse=needs_lse, bias=bias)
        result.out, result.lse = out, _lse_bhs(lse, q) if needs_lse else None
        return
    if needs_lse:
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        result.out, result.lse = out, _lse_bhs(lse, q)
        return
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    with sdpa_kernel([_backend(family)]):
        result.out = scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    result.lse = None


def backward(family: Family, grads, grad_out, q, k, v, out, lse, scale: float, causal: bool) -> None:
    """Fills `grads.dq`, `dk`, `dv` from cuDNN's backward (the only vendor backward `supports` lets through).

    `lse` is ours, (batch, heads_q, seqlen_q) fp32 from any forward; cuDNN reads it as (B, H, S, 1).
    """
    if family is not Family.SDPA_CUDNN:
        raise UnsupportedError(f"{family.value} has no backward here; sdpa-cudnn or a Triton family does")
    group = q.shape[1] // k.shape[1]
    expand = group > 1 and not CUDNN_BACKWARD_TAKES_GQA
    if expand:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    dq, dk, dv = cudnn_backward_op(grad_out, q, k, v, out, lse.unsqueeze(-1), scale, causal)
    if expand:
        b, h, s = dk.shape[0], dk.shape[1] // group, dk.shape[2]
        dk = dk.reshape(b, h, group, s, dk.shape[-1]).sum(dim=2)
        dv = dv.reshape(b, h, group, s, dv.shape[-1]).sum(dim=2)
    grads.dq, grads.dk, grads.dv = dq, dk, dv
