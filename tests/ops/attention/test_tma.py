"""The Hopper forward family (`fwd-tma`) and the FlashAttention-2 backward tiles.

Tensor descriptors run under the interpreter, so these run on the CPU (fp16: the TMA family
takes half dtypes only) against the float64 reference, and natively on a GPU. The backward is
forced to tiles whose owned and stepped blocks differ, so that its masked edge runs and its
unmasked interior both run.
"""

import pytest
import torch

import tiledispatch
from tiledispatch.core.dtypes import DType
from tiledispatch.ops.attention import AttentionConfig, Family
from tiledispatch.ops.attention.plan import kernel_units

from .helpers import ARCH, DEVICE, check, dispatcher, randn

F16, F32 = torch.float16, torch.float32
TMA = ("fwd-tma", "bwd")


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_tma_plain_odd_lengths(heads):
    hq, hkv = heads
    out, _, _ = check(randn(2, hq, 37, 32), randn(2, hkv, 45, 32), randn(2, hkv, 45, 32), families=TMA)
    assert out.shape == (2, hq, 37, 32)


@pytest.mark.parametrize("causal", [True, "bottom_right"])
@pytest.mark.parametrize("lengths", [(33, 33), (21, 40), (40, 21)], ids=["square", "q<kv", "q>kv"])
def test_tma_causal_alignments(causal, lengths):
    sq, skv = lengths
    check(randn(1, 2, sq, 32), randn(1, 2, skv, 32), randn(1, 2, skv, 32), families=TMA, causal=causal)


@pytest.mark.parametrize("window", [(8, 0), (5, 3), (-1, 4)])
def test_tma_sliding_window(window):
    check(randn(1, 2, 37, 32), randn(1, 2, 45, 32), randn(1, 2, 45, 32), families=TMA, window=window)


def test_tma_softcap_sinks_gqa_and_bshd_storage():
    q = randn(2, 21, 4, 64, scale=3.0).transpose(1, 2)  # (batch, seq, heads, dim) storage
    k = randn(2, 30, 2, 64, scale=3.0).transpose(1, 2)
    v = randn(2, 30, 2, 64).transpose(1, 2)
    out, _, grads = check(q, k, v, families=TMA, causal="bottom_right", softcap=4.0,
                          sinks=torch.randn(4, device=DEVICE))
    assert out.stride(1) < out.stride(2) and grads["sinks"].shape == (4,)


def test_tma_negative_scale_is_moved_into_k():
    """The TMA step takes rowmax(qk) * c for rowmax(qk * c): the plan makes c >= 0."""
    check(randn(1, 2, 19, 32), randn(1, 2, 23, 32), randn(1, 2, 23, 32), families=TMA, scale=-0.4)
    check(randn(1, 2, 19, 32), randn(1, 2, 23, 32), randn(1, 2, 23, 32), scale=-0.4, causal=True)


def test_tma_is_refused_for_features_it_lacks():
    d = dispatcher("fwd-tma")
    q, k, v = randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32)
    with pytest.raises(tiledispatch.TiledispatchError):
        tiledispatch.attention(q, k, v, bias=randn(16, 16), dispatcher=d)
    with pytest.raises(tiledispatch.TiledispatchError):
        tiledispatch.attention(q, k, v, dropout_p=0.1, dropout_seed=1, dispatcher=d)


def test_tma_unit_moves_whole_head_dims_by_descriptor():
    (unit,) = kernel_units(AttentionConfig(Family.FWD_TMA, DType.FP16, 64, 64, 128, 64, 4, 3))
    assert unit.function == "attention_fwd_tma"
    assert dict(unit.signature)["q_desc"] == "tensordesc<fp16[1,1,128,64]>"
    assert dict(unit.signature)["k_desc"] == "tensordesc<fp16[1,1,64,64]>"


# --- the backward: owned block (block_n) and stepped block (block_m) of different sizes ----------

BWD_TILES = {"own32-step16": "16x32_w4_s2", "own16-step32": "32x16_w4_s1"}
DTYPES = {"fp16": F16, "fp32": F32}
FEATURES = {"plain": {}, "causal": {"causal": True}, "causal-br": {"causal": "bottom_right"},
            "window": {"window": (9, 4)}, "softcap": {"softcap": 4.0, "causal": True}, "sinks": {"sinks": "per-head"}}


def _backward_cases() -> list:
    """Pairwise over tile x dtype x features: each feature runs on both tiles, in fp16 on one and fp32 on
    the other, which two swap from feature to feature; so every (tile, dtype) pair runs too."""
    out = []
    for i, feature in enumerate(FEATURES):
        for j, tile in enumerate(BWD_TILES):
            dtype = list(DTYPES)[(i + j) % 2]
            out.append(pytest.param(tile, dtype, feature, id=f"{feature}-{dtype}-{tile}"))
    return out


def test_backward_cases_are_pairwise():
    cases = [p.values for p in _backward_cases()]
    for a, b in ((0, 1), (0, 2), (1, 2)):
        pairs = {(c[a], c[b]) for c in cases}
        want = [list(BWD_TILES), list(DTYPES), list(FEATURES)]
        assert len(pairs) == len(want[a]) * len(want[b]), (a, b)


@pytest.mark.parametrize(("tile", "dtype", "features"), _backward_cases())
def test_backward_tiles_against_float64(tile, dtype, features):
    dtype = DTYPES[dtype]
    features = {k: (torch.randn(4, device=DEVICE) if v == "per-head" else v) for k, v in FEATURES[features].items()}
    q, k, v = randn(2, 4, 45, 32, dtype=dtype), randn(2, 2, 61, 32, dtype=dtype), randn(2, 2, 61, 32, dtype=dtype)
    name = f"attention_bwd_{DType.from_torch(dtype).value}_d32x32_bwd_{BWD_TILES[tile]}_{ARCH.tag}"
    check(q, k, v, rule_set="tests", backward_kernel=name, **features)


@pytest.mark.parametrize("family", ["bwd", "bwd-atomic"])
def test_backward_tiles_with_every_feature(family):
    name = f"attention_bwd_fp16_d32x32_{family}_16x32_w4_s2_{ARCH.tag}"
    check(randn(2, 4, 23, 32), randn(2, 2, 31, 32), randn(2, 2, 31, 32), families=("fwd", family), rule_set="tests",
          backward_kernel=name, causal="bottom_right", bias=randn(4, 23, 31), alibi_slopes=torch.rand(4, device=DEVICE),
          softcap=4.0, sinks=torch.randn(4, device=DEVICE), mask=torch.rand(1, 1, 23, 31, device=DEVICE) > 0.2,
          dropout_p=0.2)
