"""Forward and backward against the float64 reference: every feature, odd lengths, GQA/MQA, varlen.

Runs the real kernels: under the interpreter on the CPU (fp16 and fp32), natively on a GPU.
"""

import pytest
import torch

from .helpers import DEVICE, check, randn

F16, F32 = torch.float16, torch.float32


@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_plain_odd_lengths(dtype, heads):
    hq, hkv = heads
    q, k, v = randn(2, hq, 19, 32, dtype=dtype), randn(2, hkv, 23, 32, dtype=dtype), randn(2, hkv, 23, 32, dtype=dtype)
    check(q, k, v)


@pytest.mark.parametrize("causal", [True, "top_left", "bottom_right"])
@pytest.mark.parametrize("lengths", [(33, 33), (21, 40), (40, 21)], ids=["square", "q<kv", "q>kv"])
def test_causal_alignments(causal, lengths):
    sq, skv = lengths
    check(randn(1, 2, sq, 32), randn(1, 2, skv, 32), randn(1, 2, skv, 32), causal=causal)


@pytest.mark.parametrize("window", [(8, 0), (5, 3), (-1, 4), (0, 0)])
def test_sliding_window(window):
    check(randn(1, 2, 37, 32), randn(1, 2, 45, 32), randn(1, 2, 45, 32), window=window)


def test_causal_sliding_window_closes_the_right_side():
    out_window = check(randn(1, 2, 40, 32), randn(1, 2, 40, 32), randn(1, 2, 40, 32), window=(6, 5), causal=True)
    assert out_window[0].shape == (1, 2, 40, 32)


@pytest.mark.parametrize("dims", [(64, 64), (80, 80), (96, 96), (192, 128), (128, 128)])
def test_head_dims(dims):
    d_qk, d_v = dims
    check(randn(1, 2, 17, d_qk), randn(1, 1, 20, d_qk), randn(1, 1, 20, d_v), grad=d_qk <= 96)


def test_bsdh_layout_from_strides():
    q = randn(2, 19, 4, 32).transpose(1, 2)  # (batch, seq, heads, dim) storage
    k = randn(2, 23, 2, 32).transpose(1, 2)
    v = randn(2, 23, 2, 32).transpose(1, 2)
    out, _, _ = check(q, k, v, causal="bottom_right")
    assert out.stride(1) < out.stride(2)  # the output keeps the BSHD layout


@pytest.mark.parametrize("bias_shape", [(2, 3, 18, 25), (3, 18, 25), (1, 1, 18, 25), (18, 25), (1, 3, 1, 25)])
def test_bias_and_its_gradient(bias_shape):
    check(randn(2, 3, 18, 32), randn(2, 3, 25, 32), randn(2, 3, 25, 32), bias=randn(*bias_shape), causal=True)


def test_alibi_per_head_and_per_batch():
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    check(randn(2, 4, 20, 32), randn(2, 2, 26, 32), randn(2, 2, 26, 32), alibi_slopes=slopes, causal="bottom_right")
    check(randn(2, 4, 20, 32), randn(2, 2, 26, 32), randn(2, 2, 26, 32),
          alibi_slopes=torch.rand(2, 4, device=DEVICE), grad=False)


def test_softcap():
    check(randn(1, 2, 21, 32, scale=3.0), randn(1, 2, 21, 32, scale=3.0), randn(1, 2, 21, 32), softcap=5.0,
          causal=True)


def test_sinks_take_part_in_the_softmax():
    sinks = torch.tensor([2.0, -1.0, 0.5], device=DEVICE)
    _, _, grads = check(randn(1, 3, 19, 32), randn(1, 3, 22, 32), randn(1, 3, 22, 32), sinks=sinks)
    assert grads["sinks"].shape == (3,)


def test_boolean_mask_with_fully_masked_rows():
    mask = torch.rand(2, 1, 17, 24, device=DEVICE) > 0.4
    mask[0, 0, 3] = False  # row 3 attends to nothing: output 0, LSE -inf, no NaN in gradients
    out, lse, grads = check(randn(2, 2, 17, 32), randn(2, 2, 24, 32), randn(2, 2, 24, 32), mask=mask)
    assert torch.all(out[0, :, 3] == 0) and torch.all(torch.isneginf(lse[0, :, 3]))
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_additive_mask_with_minus_infinity():
    mask = torch.zeros(17, 24, device=DEVICE, dtype=torch.float16)
    mask[:, 5:9] = float("-inf")
    mask[:, 12] = -2.0
    check(randn(1, 2, 17, 32), randn(1, 2, 24, 32), randn(1, 2, 24, 32), mask=mask)


def test_everything_at_once():
    check(randn(2, 4, 23, 32), randn(2, 2, 31, 32), randn(2, 2, 31, 32), causal="bottom_right",
          bias=randn(4, 23, 31), alibi_slopes=torch.rand(4, device=DEVICE), softcap=4.0,
          sinks=torch.randn(4, device=DEVICE), mask=torch.rand(1, 1, 23, 31, device=DEVICE) > 0.2, scale=0.3)


@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_varlen(causal):
    lengths_q, lengths_k = [5, 17, 1, 30], [9, 17, 4, 30]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q, k, v = randn(sum(lengths_q), 4, 32), randn(sum(lengths_k), 2, 32), randn(sum(lengths_k), 2, 32)
    out, lse, _ = check(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                        alibi_slopes=torch.rand(4, device=DEVICE), sinks=torch.randn(4, device=DEVICE))
    assert out.shape == (sum(lengths_q), 4, 32) and lse.shape == (4, sum(lengths_q))


def test_varlen_with_padding_tokens_after_the_last_sequence():
    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=DEVICE)
    q, k, v = randn(26, 2, 32), randn(26, 2, 32), randn(26, 2, 32)  # 6 padding tokens at the end
    out, _, _ = check(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, grad=False)
    assert out.shape == (26, 2, 32)


@pytest.mark.parametrize("family", ["bwd", "bwd-atomic"])
def test_both_backward_families(family):
    check(randn(2, 4, 21, 32), randn(2, 2, 30, 32), randn(2, 2, 30, 32), causal="bottom_right",
          families=("fwd", family), bias=randn(4, 21, 30), sinks=torch.randn(4, device=DEVICE), softcap=3.0)


def test_deterministic_backward_is_bitwise_repeatable():
    q, k, v = randn(1, 4, 33, 32, grad=True), randn(1, 1, 33, 32, grad=True), randn(1, 1, 33, 32, grad=True)
    grads = []
    for _ in range(2):
        out = __import__("tiledispatch").attention(q, k, v, causal=True, deterministic=True,
                                                   dispatcher=__import__("tests.ops.attention.helpers",
                                                                         fromlist=["x"]).dispatcher("fwd", "bwd",
                                                                                                    "bwd-atomic"))
        g = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        grads.append(g)
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_dropout_matches_the_reference_with_the_same_mask():
    check(randn(2, 2, 19, 32), randn(2, 2, 27, 32), randn(2, 2, 27, 32), dropout_p=0.3, causal=True, seed=99)


def test_dropout_is_reproducible_with_a_seed_and_changes_without():
    import tiledispatch

    from .helpers import dispatcher

    q, k, v = randn(1, 2, 32, 32), randn(1, 2, 32, 32), randn(1, 2, 32, 32)
    d = dispatcher()
    a = tiledispatch.attention(q, k, v, dropout_p=0.5, dropout_seed=5, dispatcher=d)
    b = tiledispatch.attention(q, k, v, dropout_p=0.5, dropout_seed=5, dispatcher=d)
    c = tiledispatch.attention(q, k, v, dropout_p=0.5, dropout_seed=6, dispatcher=d)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(3)
    e = tiledispatch.attention(q, k, v, dropout_p=0.5, dispatcher=d)
    torch.manual_seed(3)
    f = tiledispatch.attention(q, k, v, dropout_p=0.5, dispatcher=d)
    assert torch.equal(e, f)
    none = tiledispatch.attention(q, k, v, dispatcher=d)
    assert not torch.equal(a, none)


def test_dropout_mask_keeps_about_one_minus_p():
    from tiledispatch.ops.attention.dropout import keep_mask

    keep = keep_mask(2, 4, 64, 96, 0.3, seed=11, device=DEVICE)
    assert abs(keep.float().mean().item() - 0.7) < 0.02
    assert torch.equal(keep, keep_mask(2, 4, 64, 96, 0.3, seed=11, device=DEVICE))
    other = keep_mask(2, 4, 64, 96, 0.3, seed=11, offset=1, device=DEVICE)
    assert not torch.equal(keep, other)


def test_output_without_grad_and_scale():
    q, k, v = randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32)
    check(q, k, v, scale=0.05, grad=False)
