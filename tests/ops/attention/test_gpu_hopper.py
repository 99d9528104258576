"""The Hopper forward families and the FlashAttention-2 backward tiles on a GPU, in bf16, at the
sizes they are built for (S = 1024..2048, d = 64/128), against the float64 reference.

Skipped without a GPU (and the TMA families without sm_90+); on the H200:
`python -m pytest tests/ops/attention/test_gpu_hopper.py`.
"""

import pytest
import torch

from ...conftest import requires_gpu
from .helpers import ARCH, check, randn

pytestmark = requires_gpu
BF16 = torch.bfloat16


def name(direction: str, d: int, family: str, tile: str) -> str:
    return f"attention_{direction}_bf16_d{d}x{d}_{family}_{tile}_{ARCH.tag}"


def inputs(b, hq, hkv, sq, skv, d, bshd=False):
    if bshd:
        return (randn(b, sq, hq, d, dtype=BF16).transpose(1, 2), randn(b, skv, hkv, d, dtype=BF16).transpose(1, 2),
                randn(b, skv, hkv, d, dtype=BF16).transpose(1, 2))
    return randn(b, hq, sq, d, dtype=BF16), randn(b, hkv, skv, d, dtype=BF16), randn(b, hkv, skv, d, dtype=BF16)


def needs_tma():
    if not ARCH.has("tma"):
        pytest.skip(f"{ARCH.name} has no tensor memory accelerator")


TMA_CASES = {
    "plain-d128": ((1, 4, 4, 1024, 1024, 128), {}),
    "causal-d128": ((1, 4, 4, 1024, 1024, 128), {"causal": True}),
    "causal-br-q<kv-d64": ((1, 4, 2, 1000, 2048, 64), {"causal": "bottom_right"}),
    "window-gqa-d128": ((1, 8, 2, 1536, 1536, 128), {"window": (256, 0), "causal": True}),
    "softcap-sinks-bshd-d64": ((2, 4, 4, 1100, 1100, 64), {"softcap": 30.0, "sinks": "per-head", "bshd": True}),
}


@pytest.mark.parametrize("tile", ["128x128_w8_s2", "128x64_w8_s3"])
@pytest.mark.parametrize("case", list(TMA_CASES))
def test_tma_forward_and_backward(case, tile):
    needs_tma()
    shape, features = TMA_CASES[case]
    features = dict(features)
    bshd = features.pop("bshd", False)
    if features.get("sinks") == "per-head":
        features["sinks"] = torch.randn(shape[1], device="cuda")
    q, k, v = inputs(*shape, bshd=bshd)
    check(q, k, v, families=("fwd-tma", "bwd"), rule_set="default", kernel=name("fwd", shape[-1], "fwd-tma", tile),
          backward_kernel=name("bwd", shape[-1], "bwd", "32x128_w8_s2"), **features)


@pytest.mark.parametrize("tile", ["128x128_w8_s2", "128x64_w4_s3"])
@pytest.mark.parametrize("causal", [False, True])
def test_pointer_forward_tiles(causal, tile):
    q, k, v = inputs(1, 4, 4, 1024, 1024, 64 if "w4" in tile else 128)
    check(q, k, v, rule_set="default", kernel=name("fwd", q.shape[-1], "fwd", tile), grad=False, causal=causal)


@pytest.mark.parametrize("family", ["bwd", "bwd-atomic"])
@pytest.mark.parametrize("tile", ["32x128_w8_s2", "64x128_w8_s2", "32x128_w8_s3"])
@pytest.mark.parametrize("case", [((1, 4, 4, 1024, 1024, 128), True), ((1, 4, 2, 1111, 2048, 64), "bottom_right"),
                                  ((2, 4, 4, 1024, 1024, 64), False)], ids=["causal-d128", "gqa-br-d64", "plain-d64"])
def test_backward_tiles(case, tile, family):
    shape, causal = case
    q, k, v = inputs(*shape)
    check(q, k, v, families=("fwd", family), rule_set="default",
          backward_kernel=name("bwd", shape[-1], family, tile), causal=causal)
