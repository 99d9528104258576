"""Shared by the attention tests: small dispatchers per family, and a check against the reference.

Every check runs the real kernels (the interpreter without a GPU), on fresh random inputs,
against the float64 reference of `reference.py`; gradients against its autograd gradients.
"""

from __future__ import annotations

import functools

import torch

import tiledispatch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.dtypes import DType
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.attention import (
    AttentionOptions,
    check_operands,
    parse_causal,
    parse_window,
)
from tiledispatch.ops.attention.dropout import keep_mask
from tiledispatch.ops.attention.reference import (
    compare_tensors,
    reference_from,
    tolerance,
)

from ...conftest import on_gpu

ARCH = current_arch()
DEVICE = "cuda" if on_gpu() else "cpu"


@functools.cache
def dispatcher(*families: str, rule_set: str = "tiny") -> Dispatcher:
    """The rule set's kernels of these families only (default: the forward and the deterministic backward)."""
    families = families or ("fwd", "bwd")
    registry = Registry.from_rule_set("attention", rule_set, ARCH).filter(lambda s: s.family in families)
    return Dispatcher(registry, ARCH)


def randn(*shape, dtype=torch.float16, scale=1.0, grad=False):
    t = (torch.randn(*shape) * scale).to(device=DEVICE, dtype=dtype)
    return t.requires_grad_(grad)


def _f64_leaf(t):
    return None if t is None else t.detach().to("cpu", torch.float64).requires_grad_(t.requires_grad)


def check(q, k, v, *, families=("fwd", "bwd"), grad=True, deterministic=False, seed=1234, rule_set="tiny",
          kernel=None, backward_kernel=None, **features):
    """Runs tiledispatch.attention (and its backward when `grad`) and compares with the reference.

    `kernel` / `backward_kernel` force kernels of the rule set by name. Returns (out, lse,
    grads) of tiledispatch for further checks.
    """
    d = dispatcher(*families, rule_set=rule_set)
    dtype = DType.from_torch(q.dtype)
    tensors = {n: features.get(n) for n in ("bias", "mask", "alibi_slopes", "sinks")}
    cu_q, cu_k = features.get("cu_seqlens_q"), features.get("cu_seqlens_k")
    leaves = [q, k, v, tensors["bias"], tensors["sinks"]]
    for t in leaves:
        if t is not None and grad and t.dtype.is_floating_point:
            t.requires_grad_(True)
    dropout_p = features.get("dropout_p", 0.0)
    out, lse = tiledispatch.attention(q, k, v, return_lse=True, dispatcher=d, deterministic=deterministic,
                                      dropout_seed=seed if dropout_p else None, kernel=kernel,
                                      backward_kernel=backward_kernel, **features)
    options = AttentionOptions(causal=parse_causal(features.get("causal", False)),
                               window=parse_window(features.get("window")), scale=features.get("scale"),
                               softcap=features.get("softcap"), dropout_p=dropout_p)
    ops = check_operands(q.detach(), k.detach(), v.detach(), options=options,
                         **{n: (t.detach() if t is not None else None) for n, t in tensors.items()},
                         cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    p = ops.problem
    keep = keep_mask(p.batch, p.heads_q, p.seqlen_q, p.seqlen_kv, dropout_p, seed, device=DEVICE).cpu() \
        if dropout_p else None
    ref_leaves = [_f64_leaf(t) for t in leaves]
    mask = tensors["mask"]
    if mask is not None:
        mask = mask.cpu() if mask.dtype == torch.bool else mask.detach().to("cpu", torch.float64)
    ref_out, ref_lse = reference_from(
        *ref_leaves[:3], p, scale=ops.scale, softcap=ops.softcap, bias=ref_leaves[3], mask=mask,
        slopes=None if tensors["alibi_slopes"] is None else _f64_leaf(ops.alibi_slopes),
        sinks=ref_leaves[4], keep=keep, dropout_p=dropout_p,
        cu_seqlens_q=None if cu_q is None else cu_q.cpu(), cu_seqlens_k=None if cu_k is None else cu_k.cpu())
    tokens = ref_out.shape[0] if cu_q is not None else None  # varlen: padding tokens after the last sequence
    result = compare_tensors(out[:tokens], ref_out, tolerance(dtype))
    assert result.passed, ("out", p.describe(), result)
    lse_result = compare_tensors(lse[..., :tokens] if tokens else lse, ref_lse, 1e-5)
    assert lse_result.passed, ("lse", lse_result)
    grads = {}
    if grad:
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(device=DEVICE, dtype=out.dtype)
        out.backward(g)
        ref_out.backward(g[:tokens].detach().to("cpu", torch.float64))
        for name, mine, ref in zip(("q", "k", "v", "bias", "sinks"), leaves, ref_leaves):
            if mine is None:
                continue
            assert mine.grad is not None, f"no gradient for {name}"
            result = compare_tensors(mine.grad, ref.grad, tolerance(dtype, gradient=True))
            assert result.passed, (f"d{name}", p.describe(), result)
            grads[name] = mine.grad
    return out, lse, grads
