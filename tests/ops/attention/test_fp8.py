"""fp8 (e4m3) attention, forward only: per-tensor dequantization scales, a bf16 output.

The kernels run under the interpreter (fp8 tensor descriptors and fp8 tl.dot run there) and
natively on a GPU, against the float64 reference of the dequantized inputs: fp8 values times
their scales are exact in float64, so the only error left is the kernel's own (Q K^T in fp8
products with fp32 sums, P V in fp16, the bf16 output).
"""

import pytest
import torch

import tiledispatch
from tiledispatch.core.dtypes import DType
from tiledispatch.core.errors import InvalidProblemError, UnsupportedError
from tiledispatch.ops.attention import (
    AttentionConfig,
    AttentionOptions,
    AttentionRule,
    Family,
    check_operands,
    parse_causal,
    parse_window,
    validate,
)
from tiledispatch.ops.attention.reference import compare_tensors, reference_from, tolerance

from .helpers import ARCH, DEVICE, dispatcher

FP8 = torch.float8_e4m3fn


def quantized(*shape, amax=2.0, seed=0):
    """fp8 values and their scale: x / scale is e4m3, x = fp8 * scale (a per-tensor recipe)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * amax / 3
    scale = (x.abs().amax() / 448).reshape(1).float()
    return (x / scale).to(FP8).to(DEVICE), scale.to(DEVICE)


def check_fp8(shape_q, shape_kv, *, families=("fwd-tma",), **features):
    (b, hq, sq, d), (hkv, skv) = shape_q, shape_kv
    q, sq_ = quantized(b, hq, sq, d, seed=1)
    k, sk = quantized(b, hkv, skv, d, seed=2)
    v, sv = quantized(b, hkv, skv, d, amax=5.0, seed=3)
    sinks = features.pop("sinks", None)
    with torch.no_grad():
        out, lse = tiledispatch.attention(q, k, v, scale_q=sq_, scale_k=sk, scale_v=sv, sinks=sinks, return_lse=True,
                                          dispatcher=dispatcher(*families, rule_set="tests"), **features)
    assert out.dtype == torch.bfloat16 and out.shape == (b, hq, sq, d)
    options = AttentionOptions(causal=parse_causal(features.get("causal", False)),
                               window=parse_window(features.get("window")), scale=features.get("scale"),
                               softcap=features.get("softcap"))
    ops = check_operands(q, k, v, options=options, sinks=sinks)
    exact = [(t.to("cpu", torch.float64) * s.item()) for t, s in ((q, sq_), (k, sk), (v, sv))]
    ref_out, ref_lse = reference_from(*exact, ops.problem, scale=ops.scale, softcap=ops.softcap,
                                      sinks=None if sinks is None else sinks.to("cpu", torch.float64))
    result = compare_tensors(out, ref_out, tolerance(DType.BF16))
    assert result.passed, (ops.problem.describe(), result)
    assert compare_tensors(lse, ref_lse, 1e-5).passed
    return out


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_fp8_plain_odd_lengths(heads):
    check_fp8((2, heads[0], 37, 32), (heads[1], 45))


@pytest.mark.parametrize("features", [{"causal": True}, {"causal": "bottom_right"}, {"window": (8, 0)},
                                      {"softcap": 5.0}, {"scale": -0.2}],
                         ids=["causal", "bottom-right", "window", "softcap", "negative-scale"])
def test_fp8_features(features):
    check_fp8((1, 2, 33, 32), (2, 40), **features)


def test_fp8_sinks_and_head_dim_64():
    sinks = torch.randn(2, device=DEVICE)
    check_fp8((1, 2, 21, 64), (1, 30), sinks=sinks)


def test_fp8_scales_move_the_result():
    """The scales are read by the kernel: doubling scale_v doubles the output."""
    q, sq = quantized(1, 2, 16, 32, seed=1)
    k, sk = quantized(1, 2, 16, 32, seed=2)
    v, sv = quantized(1, 2, 16, 32, seed=3)
    d = dispatcher("fwd-tma", rule_set="tests")
    with torch.no_grad():
        once = tiledispatch.attention(q, k, v, scale_q=sq, scale_k=sk, scale_v=sv, dispatcher=d)
        twice = tiledispatch.attention(q, k, v, scale_q=sq, scale_k=sk, scale_v=2 * sv, dispatcher=d)
    torch.testing.assert_close(twice.float(), 2 * once.float(), rtol=1e-2, atol=1e-3)


def test_fp8_runs_in_the_tma_forward_only():
    assert validate(AttentionConfig(Family.FWD_TMA, DType.FP8E4M3, 128, 128, 64, 64, 4, 3), ARCH).ok
    for family in (Family.FWD, Family.BWD):
        config = AttentionConfig(family, DType.FP8E4M3, 128, 128, 64, 64, 4, 2)
        assert AttentionRule.FAMILY_DTYPE in validate(config, ARCH).broken_rules(), family


def test_fp8_bad_inputs_say_what_to_do():
    q, s = quantized(1, 2, 16, 32)
    d = dispatcher("fwd-tma", rule_set="tests")
    with pytest.raises(UnsupportedError, match=r"\[fp8-forward\]"):
        tiledispatch.attention(q.clone().requires_grad_(), q, q, dispatcher=d)
    with torch.no_grad():
        for extra, rule in (({"mask": torch.ones(16, 16, dtype=torch.bool, device=DEVICE)}, "fp8-features"),
                            ({"dropout_p": 0.1}, "fp8-features"),
                            ({"alibi_slopes": torch.ones(2, device=DEVICE)}, "fp8-features"),
                            ({"scale_q": torch.ones(2, device=DEVICE)}, "fp8-scales"),
                            ({"scale_k": torch.ones(1, dtype=torch.float16, device=DEVICE)}, "fp8-scales")):
            with pytest.raises(InvalidProblemError, match=rf"\[{rule}\]"):
                tiledispatch.attention(q, q, q, dispatcher=d, **extra)
        d80, _ = quantized(1, 2, 16, 80)
        with pytest.raises(InvalidProblemError, match=r"\[fp8-head-dim\]"):
            tiledispatch.attention(d80, d80, d80, dispatcher=d)
        half = torch.randn(1, 2, 16, 32, device=DEVICE, dtype=torch.float16)
        with pytest.raises(InvalidProblemError, match=r"\[fp8-scales\]"):
            tiledispatch.attention(half, half, half, scale_q=s, dispatcher=d)
        with pytest.raises(InvalidProblemError, match=r"\[dtype\]"):
            tiledispatch.attention(q, half.to(FP8).to(torch.float16), q, dispatcher=d)


def test_fp8_bshd_storage():
    """Q, K, V stored (batch, seq, heads, d), as many inference engines keep them: the descriptors
    take the strides; the output comes back in the same layout."""
    q, sq = quantized(1, 37, 2, 32, seed=1)
    k, sk = quantized(1, 45, 2, 32, seed=2)
    v, sv = quantized(1, 45, 2, 32, seed=3)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    with torch.no_grad():
        out = tiledispatch.attention(q, k, v, scale_q=sq, scale_k=sk, scale_v=sv, causal=True,
                                     dispatcher=dispatcher("fwd-tma", rule_set="tests"))
    assert out.stride(1) < out.stride(2)  # BSHD
    ops = check_operands(q, k, v, options=AttentionOptions(causal=parse_causal(True)))
    exact = [(t.to("cpu", torch.float64) * s.item()) for t, s in ((q, sq), (k, sk), (v, sv))]
    ref, _ = reference_from(*exact, ops.problem, scale=ops.scale)
    assert compare_tensors(out, ref, tolerance(DType.BF16)).passed
