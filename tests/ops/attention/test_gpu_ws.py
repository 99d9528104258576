"""The warp-specialised Gluon forward (`fwd-ws`) on a Hopper GPU, in bf16 and fp16, against the
float64 reference: out and the LSE, and the gradients of the backward that reads that LSE.

Skipped without a GPU, and without Hopper's warpgroup MMA (the family is sm_90 only):
`python -m pytest tests/ops/attention/test_gpu_ws.py`.
"""

import pytest
import torch

import tiledispatch
from tiledispatch.ops.attention import AttentionOptions, check_operands, fastpath, parse_causal

from ...conftest import requires_gpu
from .helpers import ARCH, check, dispatcher, randn

pytestmark = requires_gpu


def name(dtype: str, d: int, tile: str) -> str:
    return f"attention_fwd_{dtype}_d{d}x{d}_fwd-ws_{tile}_{ARCH.tag}"


def inputs(b, hq, hkv, sq, skv, d, dtype, bshd=False):
    if bshd:
        return (randn(b, sq, hq, d, dtype=dtype).transpose(1, 2), randn(b, skv, hkv, d, dtype=dtype).transpose(1, 2),
                randn(b, skv, hkv, d, dtype=dtype).transpose(1, 2))
    return randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, skv, d, dtype=dtype), randn(b, hkv, skv, d, dtype=dtype)


def case_inputs(shape, features):
    """bf16 Q, K, V of a case (BSHD storage where it says so) and its attention() keywords, with a
    per-head sink tensor where it asks for one."""
    features = dict(features)
    bshd = features.pop("bshd", False)
    if features.get("sinks") == "per-head":
        features["sinks"] = torch.randn(shape[1], device="cuda")
    return (*inputs(*shape, dtype=torch.bfloat16, bshd=bshd), features)


@pytest.fixture(autouse=True)
def needs_wgmma():
    if not ARCH.has("wgmma"):
        pytest.skip(f"{ARCH.name} has no warpgroup MMA (fwd-ws is sm_90 only)")


# Lengths that are not multiples of the blocks (the copy engine clips each head's sequence),
# bands that empty whole rows (bottom-right with more queries than keys), GQA, BSHD storage.
CASES = {
    "plain-d128": ((2, 4, 4, 1024, 1024, 128), {}),
    "ragged-d128": ((1, 4, 4, 1000, 1100, 128), {}),
    "causal-d128": ((1, 4, 4, 1024, 1024, 128), {"causal": True}),
    "causal-br-q<kv-gqa-d64": ((1, 4, 2, 1000, 2048, 64), {"causal": "bottom_right"}),
    "causal-br-q>kv-d128": ((1, 2, 2, 1500, 700, 128), {"causal": "bottom_right"}),
    "window-gqa-bshd-d128": ((1, 8, 2, 1536, 1536, 128), {"window": (256, 0), "causal": True, "bshd": True}),
    "short-d64": ((3, 2, 2, 77, 130, 64), {}),
    "softcap-sinks-causal-d128": ((2, 4, 2, 1100, 1100, 128), {"softcap": 30.0, "sinks": "per-head", "causal": True}),
    "softcap-bshd-d64": ((1, 4, 4, 1000, 1000, 64), {"softcap": 20.0, "bshd": True}),
}


@pytest.mark.parametrize("tile", ["128x128_w8_s2", "128x128_w8_s3", "128x64_w8_s3"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_backward(case, tile):
    shape, features = CASES[case]
    q, k, v, features = case_inputs(shape, features)
    check(q, k, v, families=("fwd-ws", "bwd"), rule_set="full", kernel=name("bf16", shape[-1], tile), **features)


@pytest.mark.parametrize("causal", [False, True])
def test_fp16_and_a_negative_scale(causal):
    """fp16 takes the same kernel; a negative scale reaches it as a negated K (plan._positive_scale)."""
    q, k, v = inputs(1, 4, 4, 640, 640, 128, dtype=torch.float16)
    check(q, k, v, families=("fwd-ws", "bwd"), rule_set="full", kernel=name("fp16", 128, "128x128_w8_s2"),
          grad=False, causal=causal, scale=-0.05)



@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_256(causal):
    """d = 256 fits as 128 x 64 over two stages: O is 128 registers a thread, the scores 32."""
    q, k, v = inputs(1, 4, 2, 700, 900, 256, dtype=torch.bfloat16)
    check(q, k, v, families=("fwd-ws", "bwd"), rule_set="full", kernel=name("bf16", 256, "128x64_w8_s2"),
          causal=causal)


def test_a_call_seen_before_replays_its_plan():
    """The fast path binds fwd-ws's plan, O's descriptor included (it describes a buffer the plan
    makes), and a replay on fresh tensors matches the checked path bit for bit."""
    d = dispatcher("fwd-ws", rule_set="full")
    kernel = name("bf16", 128, "128x128_w8_s2")
    tiledispatch.attention(*inputs(1, 4, 2, 1000, 1000, 128, dtype=torch.bfloat16), causal=True, return_lse=True,
                           dispatcher=d, kernel=kernel)
    q, k, v = inputs(1, 4, 2, 1000, 1000, 128, dtype=torch.bfloat16)
    out, lse = tiledispatch.attention(q, k, v, causal=True, return_lse=True, dispatcher=d, kernel=kernel)
    options = AttentionOptions(causal=parse_causal(True), needs_lse=True)
    key = fastpath.forward_key(q, k, v, (None,) * 4, options, kernel)
    assert isinstance(d.memo(("attention", key), lambda: pytest.fail("never bound")), fastpath.BoundAttention)
    checked = d.run(check_operands(q, k, v, options=options), kernel=kernel)
    assert torch.equal(out, checked.out) and torch.equal(lse, checked.lse)


def bwd_name(dtype: str, d: int, tile: str) -> str:
    return f"attention_bwd_{dtype}_d{d}x{d}_bwd-ws_{tile}_{ARCH.tag}"


@pytest.mark.parametrize("tile", ["32x128_w8_s3", "32x128_w8_s2", "64x128_w8_s2"])
@pytest.mark.parametrize("case", list(CASES))
def test_warp_specialised_backward(case, tile):
    """bwd-ws's dK/dV and dQ stages (Gluon) in the bwd plan, against the float64 reference's
    gradients (the sinks' own gradient too, which the autograd function takes from the LSE)."""
    shape, features = CASES[case]
    if tile.startswith("64") and shape[-1] == 128:
        pytest.skip("64 query rows spill at d=128: the rules refuse the tile there")
    q, k, v, features = case_inputs(shape, features)
    check(q, k, v, families=("fwd-ws", "bwd-ws"), rule_set="default", kernel=name("bf16", shape[-1], "128x128_w8_s2"),
          backward_kernel=bwd_name("bf16", shape[-1], tile), **features)


# d = 256: the two warpgroups split the dK/dV stage by role (kernels/backward_ws_wide.py).
WIDE_CASES = {
    "ragged-gqa-d256": ((1, 4, 2, 700, 900, 256), {}),
    "causal-br-q<kv-d256": ((1, 2, 2, 1000, 1100, 256), {"causal": "bottom_right"}),
    "softcap-sinks-window-bshd-d256": ((1, 4, 4, 768, 768, 256),
                                       {"softcap": 30.0, "sinks": "per-head", "causal": True, "window": (200, 0),
                                        "bshd": True}),
}


@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_warp_specialised_backward_wide_heads(case):
    shape, features = WIDE_CASES[case]
    q, k, v, features = case_inputs(shape, features)
    check(q, k, v, families=("fwd-ws", "bwd-ws"), rule_set="default", kernel=name("bf16", 256, "128x64_w8_s2"),
          backward_kernel=bwd_name("bf16", 256, "32x64_w8_s2"), **features)


def test_warp_specialised_backward_fp16_and_an_expanded_grad():
    """fp16, and dO broadcast from a loss's sum (zero strides, made dense before the plan)."""
    q, k, v = inputs(1, 4, 4, 512, 512, 64, dtype=torch.float16)
    check(q, k, v, families=("fwd-ws", "bwd-ws"), rule_set="default", kernel=name("fp16", 64, "128x128_w8_s2"),
          backward_kernel=bwd_name("fp16", 64, "64x128_w8_s2"), causal=True)
    q, k, v = (t.detach().requires_grad_(True) for t in inputs(1, 2, 2, 256, 256, 64, dtype=torch.float16))
    d = dispatcher("fwd-ws", "bwd-ws", rule_set="default")
    tiledispatch.attention(q, k, v, dispatcher=d, backward_kernel=bwd_name("fp16", 64, "64x128_w8_s2")).sum().backward()
    want = [t.detach().requires_grad_(True) for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*[t.float() for t in want]).sum().backward()
    for got, ref in zip((q, k, v), want):
        assert torch.allclose(got.grad.float(), ref.grad.float(), atol=2e-2, rtol=2e-2)
