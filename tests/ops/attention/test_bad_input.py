"""Bad input is refused with an error that names the rule and says what would work."""

import pytest
import torch

import tiledispatch
from tiledispatch import InvalidProblemError, UnsupportedError
from tiledispatch.ops.attention import AttentionProblem

from .helpers import DEVICE, dispatcher, randn


def call(q, k, v, **kw):
    return tiledispatch.attention(q, k, v, dispatcher=dispatcher(), **kw)


def qkv(hq=4, hkv=2, sq=8, skv=8, d=32, dv=None, dtype=torch.float16):
    return randn(1, hq, sq, d, dtype=dtype), randn(1, hkv, skv, d, dtype=dtype), randn(1, hkv, skv, dv or d, dtype=dtype)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"hq": 3, "hkv": 2}, InvalidProblemError, r"\[heads-group\].*3 heads.*multiple of the 2"),
    ({"d": 48}, UnsupportedError, r"\[head-dim\].*48.*\(32, 64, 80, 96, 128, 192, 256\)"),
    ({"d": 32, "dv": 40}, UnsupportedError, r"\[head-dim\].*v head dim 40"),
    ({"dtype": torch.float64}, UnsupportedError, r"\[dtype\]"),
])
def test_shapes_and_dtypes(kwargs, error, words):
    with pytest.raises(error, match=words):
        call(*qkv(**kwargs))


def test_mismatches_name_the_tensors():
    q, k, v = qkv()
    with pytest.raises(InvalidProblemError, match=r"\[head-dim-match\]"):
        call(q, randn(1, 2, 8, 64), randn(1, 2, 8, 64))
    with pytest.raises(InvalidProblemError, match=r"\[seqlen-match\].*8 keys but v has 9"):
        call(q, k, randn(1, 2, 9, 32))
    with pytest.raises(InvalidProblemError, match=r"\[heads-match\]"):
        call(q, k, randn(1, 1, 8, 32))
    with pytest.raises(InvalidProblemError, match=r"\[dtype\].*share one dtype"):
        call(q, k.float(), v)
    with pytest.raises(InvalidProblemError, match=r"\[rank\].*4-D"):
        call(q[0], k, v)
    with pytest.raises(InvalidProblemError, match=r"\[head-dim-stride\].*contiguous"):
        call(randn(1, 4, 32, 8).transpose(-1, -2), k, v)
    with pytest.raises(InvalidProblemError, match=r"\[empty\]"):
        call(randn(1, 4, 0, 32), k, v)
    with pytest.raises(InvalidProblemError, match="must be a torch.Tensor"):
        call(q, k, "v")


def test_features_are_checked():
    q, k, v = qkv()
    with pytest.raises(InvalidProblemError, match=r"\[bias-shape\]"):
        call(q, k, v, bias=randn(3, 8, 8))
    with pytest.raises(InvalidProblemError, match=r"\[bias-dtype\].*bias.to\(q.dtype\)"):
        call(q, k, v, bias=randn(8, 8, dtype=torch.float32))
    with pytest.raises(InvalidProblemError, match=r"\[mask-dtype\].*torch.bool"):
        call(q, k, v, mask=torch.zeros(8, 8, dtype=torch.int32, device=DEVICE))
    with pytest.raises(InvalidProblemError, match=r"\[alibi-shape\]"):
        call(q, k, v, alibi_slopes=torch.ones(3, device=DEVICE))
    with pytest.raises(InvalidProblemError, match=r"\[sinks-shape\].*one logit per query head"):
        call(q, k, v, sinks=torch.ones(2, device=DEVICE))
    with pytest.raises(InvalidProblemError, match=r"\[softcap\]"):
        call(q, k, v, softcap=-1.0)
    with pytest.raises(InvalidProblemError, match=r"\[dropout\]"):
        call(q, k, v, dropout_p=1.0)
    with pytest.raises(InvalidProblemError, match=r"window right=-2"):
        call(q, k, v, window=(3, -2))
    with pytest.raises(InvalidProblemError, match=r"\[window\]"):
        call(q, k, v, window=5)
    with pytest.raises(UnsupportedError, match="causal='x'"):
        call(q, k, v, causal="x")


def test_window_with_top_left_causal_on_unequal_lengths_is_refused():
    with pytest.raises(InvalidProblemError, match=r"\[window-alignment\].*bottom_right"):
        call(*qkv(sq=8, skv=12), window=(4, 0), causal=True)


def test_varlen_is_checked():
    q, k, v = randn(10, 2, 32), randn(10, 2, 32), randn(10, 2, 32)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
    with pytest.raises(InvalidProblemError, match=r"\[varlen\].*both"):
        call(q, k, v, cu_seqlens_q=cu)
    with pytest.raises(InvalidProblemError, match=r"\[varlen\].*end at most at the 10 tokens"):
        call(q, k, v, cu_seqlens_q=torch.tensor([0, 4, 12], dtype=torch.int32, device=DEVICE), cu_seqlens_k=cu)
    with pytest.raises(InvalidProblemError, match=r"\[varlen\].*never decrease"):
        call(q, k, v, cu_seqlens_q=torch.tensor([0, 6, 4], dtype=torch.int32, device=DEVICE), cu_seqlens_k=cu)
    with pytest.raises(InvalidProblemError, match=r"\[varlen-features\]"):
        call(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, bias=randn(10, 10))
    with pytest.raises(InvalidProblemError, match=r"\[rank\].*cu_seqlens"):
        call(randn(1, 10, 2, 32), k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)


def test_problem_refuses_by_rule():
    with pytest.raises(InvalidProblemError, match=r"\[heads-group\]"):
        AttentionProblem(1, 6, 4, 8, 8, 64, 64)
    with pytest.raises(UnsupportedError, match=r"\[head-dim\]"):
        AttentionProblem(1, 4, 4, 8, 8, 72, 64)
    with pytest.raises(InvalidProblemError, match="positive integer"):
        AttentionProblem(1, 4, 4, 0, 8, 64, 64)


@pytest.mark.skipif(DEVICE == "cuda", reason="bf16 runs on a GPU")
def test_bf16_on_the_interpreter_says_why():
    with pytest.raises(UnsupportedError, match=r"\[dtype-arch\].*bf16.*interpreter"):
        call(*qkv(dtype=torch.bfloat16))


def test_forcing_a_kernel_that_cannot_run_says_why():
    q, k, v = qkv(d=32)
    name = next(s.name for s in dispatcher().registry if s.family == "fwd" and "d64x64" in s.name)
    with pytest.raises(UnsupportedError, match="head dims 64/64, the problem has 32/32"):
        call(q, k, v, kernel=name)
