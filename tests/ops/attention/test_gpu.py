"""Attention on a real GPU: bf16 (which the interpreter lacks), native compiles, the SDPA candidates.

Skipped without a GPU; on the H200: `python -m pytest tests/ops/attention/test_gpu.py`.
"""

import pytest
import torch

import tiledispatch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.attention import AttentionOptions, check_operands
from tiledispatch.ops.attention.reference import (
    compare_tensors,
    reference_from,
    tolerance,
)

from ...conftest import requires_gpu
from .helpers import check, randn

pytestmark = requires_gpu
BF16 = torch.bfloat16


def default_families(*families):
    arch = current_arch()
    return Dispatcher(Registry.from_rule_set("attention", "default", arch).filter(lambda s: s.family in families), arch)


# Each (features, head dim) compiles its own kernels on the GPU: the features are crossed with
# one shape, the other shapes run plain and causal (a cold cache compiles each in seconds).
FEATURES = [{}, {"causal": True}, {"causal": "bottom_right"}, {"window": (64, 0), "causal": True},
            {"softcap": 30.0}, {"alibi_slopes": "per-head"}, {"sinks": "per-head"}, {"dropout_p": 0.2}]
GQA_D128 = (2, 8, 2, 300, 300, 128)
CASES = [(f, GQA_D128) for f in FEATURES] + [(f, shape) for f in FEATURES[:2]
                                              for shape in ((1, 4, 4, 129, 257, 64), (1, 4, 1, 77, 77, 256))]


@pytest.mark.parametrize("features, shape", CASES,
                         ids=[("-".join(f) or "plain") + f"-d{s[-1]}" for f, s in CASES])
def test_bf16_forward_and_backward(features, shape):
    b, hq, hkv, sq, skv, d = shape
    features = {k: (torch.rand(hq, device="cuda") if v == "per-head" and k == "alibi_slopes" else
                    torch.randn(hq, device="cuda") if v == "per-head" else v) for k, v in features.items()}
    check(randn(b, hq, sq, d, dtype=BF16), randn(b, hkv, skv, d, dtype=BF16), randn(b, hkv, skv, d, dtype=BF16),
          **features)


@pytest.mark.parametrize("family", ["bwd", "bwd-atomic"])
@pytest.mark.parametrize("dims", [(192, 128), (80, 80), (32, 32)])
def test_default_tiles_every_head_dim(family, dims):
    d_qk, d_v = dims
    d = default_families("fwd", family)
    q, k, v = randn(2, 4, 200, d_qk, dtype=BF16, grad=True), randn(2, 2, 333, d_qk, dtype=BF16, grad=True), \
        randn(2, 2, 333, d_v, dtype=BF16, grad=True)
    out = tiledispatch.attention(q, k, v, causal="bottom_right", dispatcher=d)
    out.backward(torch.ones_like(out))
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ops = check_operands(q.detach(), k.detach(), v.detach(), options=AttentionOptions(causal=tiledispatch.ops.attention.
                                                                                       parse_causal("bottom_right")))
    ref, _ = reference_from(*leaves, ops.problem, scale=ops.scale)
    ref.backward(torch.ones_like(ref))
    assert compare_tensors(out, ref, tolerance(ops.problem.dtype)).passed
    for mine, theirs in zip((q, k, v), leaves):
        result = compare_tensors(mine.grad, theirs.grad, tolerance(ops.problem.dtype, gradient=True))
        assert result.passed, result


def test_varlen_bf16():
    lengths = [17, 128, 333, 77]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = randn(sum(lengths), 8, 128, dtype=BF16), randn(sum(lengths), 2, 128, dtype=BF16), \
        randn(sum(lengths), 2, 128, dtype=BF16)
    check(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)


@pytest.mark.parametrize("family", ["sdpa-flash", "sdpa-cudnn"])
@pytest.mark.parametrize("causal", [False, True])
def test_vendor_forward_with_and_without_lse(family, causal):
    d = default_families("fwd", "bwd", family)
    q, k, v = randn(2, 8, 256, 128, dtype=BF16), randn(2, 8, 256, 128, dtype=BF16), randn(2, 8, 256, 128, dtype=BF16)
    name = f"attention_fwd_bf16_{family}_{d.arch.tag}"
    out = tiledispatch.attention(q, k, v, causal=causal, dispatcher=d, kernel=name)
    ops = check_operands(q, k, v, options=AttentionOptions(causal=tiledispatch.ops.attention.parse_causal(causal)))
    ref, ref_lse = reference_from(q.double().cpu(), k.double().cpu(), v.double().cpu(), ops.problem, scale=ops.scale)
    assert compare_tensors(out, ref, tolerance(ops.problem.dtype)).passed
    if family == "sdpa-cudnn":
        with pytest.raises(tiledispatch.UnsupportedError, match="cuDNN's statistics"):
            tiledispatch.attention(q, k, v, causal=causal, dispatcher=d, kernel=name, return_lse=True)
        return
    out2, lse = tiledispatch.attention(q, k, v, causal=causal, dispatcher=d, kernel=name, return_lse=True)
    assert compare_tensors(out2, ref, tolerance(ops.problem.dtype)).passed
    assert compare_tensors(lse, ref_lse, 1e-3).passed


def test_vendor_flash_backward_is_refused_with_its_reason():
    """Its private ATen entry point failed standalone on the H200; forcing it says so."""
    d = default_families("fwd", "sdpa-flash")
    q, k, v = (randn(2, 8, 256, 128, dtype=BF16, grad=True) for _ in range(3))
    out = tiledispatch.attention(q, k, v, causal=True, dispatcher=d,
                                 backward_kernel=f"attention_bwd_bf16_sdpa-flash_{d.arch.tag}")
    with pytest.raises(tiledispatch.UnsupportedError, match="flash backward"):
        out.backward(torch.ones_like(out))


def test_default_dispatcher_training_step_on_the_suite_shape():
    q, k, v = (randn(2, 16, 1024, 128, dtype=BF16, grad=True) for _ in range(3))
    out = tiledispatch.attention(q, k, v, causal=True)
    out.backward(torch.ones_like(out))
    ref_q, ref_k, ref_v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(ref_q, ref_k, ref_v, is_causal=True)
    ref.backward(torch.ones_like(ref))
    assert compare_tensors(out, ref.double(), 2e-2).passed
    for a, b in zip((q, k, v), (ref_q, ref_k, ref_v)):
        assert compare_tensors(a.grad, b.grad.double(), 3e-2).passed
