"""The warp-specialised Gluon forward (`fwd-ws`) on a Hopper GPU, in bf16 and fp16, against the
float64 reference: out and the LSE, and the gradients of the backward that reads that LSE.

Skipped without a GPU, and without Hopper's warpgroup MMA (the family is sm_90 only):
`python -m pytest tests/ops/attention/test_gpu_ws.py`.
"""

import pytest
import torch

from ...conftest import requires_gpu
from .helpers import ARCH, check, randn

pytestmark = requires_gpu


def name(dtype: str, d: int, tile: str) -> str:
    return f"attention_fwd_{dtype}_d{d}x{d}_fwd-ws_{tile}_{ARCH.tag}"


def inputs(b, hq, hkv, sq, skv, d, dtype, bshd=False):
    if bshd:
        return (randn(b, sq, hq, d, dtype=dtype).transpose(1, 2), randn(b, skv, hkv, d, dtype=dtype).transpose(1, 2),
                randn(b, skv, hkv, d, dtype=dtype).transpose(1, 2))
    return randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, skv, d, dtype=dtype), randn(b, hkv, skv, d, dtype=dtype)


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
}


@pytest.mark.parametrize("tile", ["128x128_w8_s2", "128x128_w8_s3", "128x64_w8_s3"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_backward(case, tile):
    shape, features = CASES[case]
    features = dict(features)
    bshd = features.pop("bshd", False)
    q, k, v = inputs(*shape, dtype=torch.bfloat16, bshd=bshd)
    check(q, k, v, families=("fwd-ws", "bwd"), rule_set="full", kernel=name("bf16", shape[-1], tile), **features)


@pytest.mark.parametrize("causal", [False, True])
def test_fp16_and_a_negative_scale(causal):
    """fp16 takes the same kernel; a negative scale reaches it as a negated K (plan._positive_scale)."""
    q, k, v = inputs(1, 4, 4, 640, 640, 128, dtype=torch.float16)
    check(q, k, v, families=("fwd-ws", "bwd"), rule_set="full", kernel=name("fp16", 128, "128x128_w8_s2"),
          grad=False, causal=causal, scale=-0.05)

