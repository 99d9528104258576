"""attention()'s public input handling: every argument checked by name, negated views read by
value (on the checked and the fast path), and pair counts that never allocate per position."""

import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import tiledispatch
from tiledispatch.core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from tiledispatch.ops.attention import (
    AttentionOptions,
    AttentionProblem,
    AttentionVariant,
    MaskKind,
    Window,
    check_operands,
    fastpath,
)
from tiledispatch.ops.attention.counting import band_pairs, block_pairs, floor_sum
from tiledispatch.ops.attention.dropout import keep_mask
from tiledispatch.ops.attention.kernels.scores import UNBOUNDED
from tiledispatch.ops.attention.plan import runtime_args as planned_runtime
from tiledispatch.ops.attention.problem import MAX_SEQLEN
from tiledispatch.ops.attention.ranking import computed_pairs

from .helpers import DEVICE, check, dispatcher, randn


def call(q, k, v, **kw):
    kw.setdefault("dispatcher", dispatcher())
    return tiledispatch.attention(q, k, v, **kw)


def qkv(sq=8, skv=8, dtype=torch.float16):
    return randn(1, 2, sq, 32, dtype=dtype), randn(1, 2, skv, 32, dtype=dtype), randn(1, 2, skv, 32, dtype=dtype)


def neg_view(values: torch.Tensor) -> torch.Tensor:
    """A negated view whose values are `values` (its memory holds -values)."""
    return torch._neg_view(values.neg())


# -- scalar arguments ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    ({"dropout_p": 0.1, "dropout_seed": 2**70}, r"\[dropout-seed\].*2\*\*63 - 1.*at most"),
    ({"dropout_p": 0.1, "dropout_seed": -1}, r"\[dropout-seed\].*at least 0"),
    ({"dropout_p": 0.1, "dropout_seed": 1.5}, r"\[dropout-seed\].*must be an integer"),
    ({"dropout_p": 0.1, "dropout_seed": True}, r"\[dropout-seed\].*must be an integer"),
    ({"dropout_p": 0.1, "dropout_seed": "7"}, r"\[dropout-seed\].*must be an integer"),
    ({"dropout_p": 0.1, "dropout_offset": -1}, r"\[dropout-offset\].*at least 0"),
    ({"dropout_p": 0.1, "dropout_offset": 2.0}, r"\[dropout-offset\].*must be an integer"),
    ({"dropout_p": "0.1"}, r"\[dropout\].*real number"),
    ({"dropout_p": float("nan")}, r"\[dropout\].*finite"),
    ({"dropout_p": -0.1}, r"\[dropout\].*at least 0"),
    ({"dropout_p": 1.0}, r"\[dropout\].*\[0, 1\)"),
    ({"dropout_p": 0.1j}, r"\[dropout\].*real number"),
    ({"window": ("a", 1)}, r"\[window\] window left='a'"),
    ({"window": (1.7, 2)}, r"\[window\] window left=1.7"),
    ({"window": (1, True)}, r"\[window\] window right=True"),
    ({"window": (1, 2, 3)}, r"\[window\].*\(left, right\)"),
    ({"window": "12"}, r"\[window\].*\(left, right\)"),
    ({"scale": "0.5"}, r"\[scale\].*real number"),
    ({"scale": float("inf")}, r"\[scale\].*finite"),
    ({"scale": torch.ones(2)}, r"\[scale\].*one real floating value"),
    ({"softcap": "1"}, r"\[softcap\].*real number"),
    ({"softcap": 0.0}, r"\[softcap\].*above 0"),
    ({"softcap": float("inf")}, r"\[softcap\].*finite"),
    ({"causal": 1}, r"\[causal\].*got 1 \(int\)"),
    ({"causal": 0.0}, r"\[causal\].*got 0.0 \(float\)"),
    ({"causal": MaskKind.SLIDING_WINDOW}, r"\[causal\].*window=\(left, right\)"),
    ({"return_lse": "no"}, r"return_lse must be True or False"),
    ({"deterministic": 1}, r"deterministic must be True or False"),
    ({"kernel": 123}, r"kernel must be a kernel name"),
    ({"backward_kernel": 1.5}, r"backward_kernel must be a kernel name"),
    ({"dispatcher": "foo"}, r"dispatcher must be a tiledispatch\.Dispatcher"),
])
def test_scalar_arguments_are_refused_by_name(kwargs, words):
    with pytest.raises(InvalidArgumentError, match=words):
        call(*qkv(), **kwargs)


def test_unknown_causal_words_say_what_works():
    with pytest.raises(UnsupportedError, match=r"causal='top-left'.*'top_left' or 'bottom_right'"):
        call(*qkv(), causal="top-left")


def test_options_built_by_hand_are_checked_and_normalised():
    with pytest.raises(InvalidArgumentError, match=r"\[dropout-seed\]"):
        AttentionOptions(dropout_seed=2**64)
    with pytest.raises(InvalidArgumentError, match=r"\[softcap\]"):
        AttentionOptions(softcap=-2)
    options = AttentionOptions(window=(np.int64(3), 0), scale=np.float64(0.25), causal=True)
    assert options.window == Window(3, 0) and type(options.scale) is float
    assert options.causal is MaskKind.CAUSAL_TOP_LEFT
    with pytest.raises(InvalidArgumentError, match="options must be an AttentionOptions"):
        check_operands(*qkv(), options={"causal": True})


def test_largest_seed_runs_and_matches_the_keep_mask():
    """2**63 - 1 reaches the kernels as the Philox key keep_mask draws with (check compares both)."""
    check(*qkv(sq=9, skv=12), dropout_p=0.3, seed=2**63 - 1, grad=False)
    with pytest.raises(InvalidArgumentError, match=r"\[dropout-seed\]"):
        keep_mask(1, 1, 4, 4, 0.5, 2**63)


def test_numpy_scalars_are_read_exactly():
    q, k, v = qkv(sq=8, skv=12)
    plain = call(q, k, v, window=(3, 1), scale=0.25)
    same = call(q, k, v, window=(np.int64(3), np.int32(1)), scale=np.float64(0.25), causal=np.bool_(False))
    assert torch.equal(plain, same)


def test_a_window_past_every_key_is_unbounded():
    """Sides above 2**31 reach the 32-bit kernel arguments capped, as the unbounded side they are."""
    q, k, v = qkv(sq=8, skv=12)
    ops = check_operands(q, k, v, options=AttentionOptions(window=(2**40, 2**33)))
    runtime = planned_runtime(ops)  # what the kernels take as i32 (the interpreter would not wrap)
    assert runtime["window_left"] == runtime["window_right"] == UNBOUNDED
    wide = call(q, k, v, window=(2**40, 0))
    causal = call(q, k, v, causal="bottom_right")
    torch.testing.assert_close(wide, causal, rtol=0, atol=0)


def test_dropout_counters_must_fit_64_bits():
    with pytest.raises(InvalidProblemError, match=r"\[dropout-offset\].*do not fit"):
        call(*qkv(), dropout_p=0.1, dropout_offset=2**63 - 10)


# -- tensor arguments --------------------------------------------------------------------------
@pytest.mark.parametrize("name, value, words", [
    ("mask", [[True] * 8] * 8, r"mask must be a torch.Tensor broadcastable"),
    ("bias", 0.5, r"bias must be a torch.Tensor broadcastable"),
    ("alibi_slopes", [0.5, 0.25], r"alibi_slopes must be a torch.Tensor of shape \(heads_q,\)"),
    ("sinks", [0.5, 0.25], r"sinks must be a torch.Tensor of shape \(heads_q,\)"),
])
def test_optional_tensors_must_be_tensors(name, value, words):
    with pytest.raises(InvalidArgumentError, match=words):
        call(*qkv(), **{name: value})


@pytest.mark.parametrize("name", ["alibi_slopes", "sinks"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64, torch.bool])
def test_slopes_and_sinks_must_be_real_floats(name, dtype):
    with pytest.raises(InvalidProblemError, match=rf"\[{name.replace('_', '-')}-dtype\].*{name}.float\(\)"):
        call(*qkv(), **{name: torch.ones(2, device=DEVICE).to(dtype)})


@pytest.mark.parametrize("cu, words", [
    (torch.tensor([0, 4, 2**31 + 4], dtype=torch.int64), r"\[varlen\].*below 2\*\*31"),
    (torch.tensor([0.0, 4.0, 8.0]), r"\[varlen\].*int32"),
    (torch.tensor([[0, 4, 8]], dtype=torch.int32), r"\[varlen\].*1-D.*got 1x3"),
    ([0, 4, 8], r"\[varlen\].*1-D.*got list"),
    (torch.tensor([0, 6, 4], dtype=torch.int32), r"\[varlen\].*never decrease"),
])
def test_cu_seqlens_are_checked(cu, words):
    q, k, v = randn(8, 2, 32), randn(8, 2, 32), randn(8, 2, 32)
    good = torch.tensor([0, 4, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(InvalidProblemError, match=words):
        call(q, k, v, cu_seqlens_q=cu.to(DEVICE) if isinstance(cu, torch.Tensor) else cu, cu_seqlens_k=good)


@pytest.mark.parametrize("name", ["mask", "alibi_slopes"])
def test_tensors_without_a_gradient_may_not_require_one(name):
    value = randn(8, 8, dtype=torch.float32) if name == "mask" else torch.rand(2, device=DEVICE)
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(InvalidArgumentError, match=rf"\[{name.replace('_', '-')}-grad\].*{name}.detach\(\)"):
        call(q, k, v, **{name: value.requires_grad_(True)})
    with torch.no_grad():  # nothing to differentiate: accepted
        call(q, k, v, **{name: value})


# -- negated and conjugated views ------------------------------------------------------------------
@pytest.mark.parametrize("role", ["q", "k", "v"])
def test_negated_views_of_q_k_v_are_read_by_value(role):
    """The reference reads values; the kernels would read the negated memory."""
    tensors = dict(zip("qkv", qkv(sq=9, skv=11)))
    tensors[role] = neg_view(tensors[role])
    check(tensors["q"], tensors["k"], tensors["v"], grad=False)


def test_negated_views_of_features_and_conjugate_imaginary_parts_are_read_by_value():
    q, k, v = qkv(sq=9, skv=11, dtype=torch.float32)

    def imag_of_conj(*shape):  # x.conj().imag: a negated view of the imaginary parts (stride 2)
        return torch.complex(torch.randn(*shape), torch.randn(*shape)).to(DEVICE).conj().imag

    bias, slopes = imag_of_conj(2, 9, 11), imag_of_conj(2)
    assert bias.is_neg() and slopes.is_neg()
    check(q, k, v, grad=False, bias=bias, alibi_slopes=slopes, sinks=neg_view(randn(2, dtype=torch.float32)))


def test_gradients_through_negated_views_and_of_a_negated_grad_out():
    q, k, v = qkv(sq=9, skv=11, dtype=torch.float32)
    leaf = q.detach().neg().requires_grad_(True)
    g = randn(1, 2, 9, 32, dtype=torch.float32)
    out = call(torch._neg_view(leaf), k, v)
    out.backward(neg_view(g))
    plain = q.detach().requires_grad_(True)
    call(plain, k, v).backward(g)
    torch.testing.assert_close(leaf.grad, -plain.grad)


def test_negated_cu_seqlens_are_read_by_value():
    q, k, v = randn(10, 2, 32), randn(10, 2, 32), randn(10, 2, 32)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
    check(q, k, v, cu_seqlens_q=neg_view(cu), cu_seqlens_k=neg_view(cu), grad=False)


def test_the_fast_path_never_replays_a_negated_view_as_plain():
    """A plain call binds the signature; the same signature with a negated view must not replay it."""
    d = dispatcher()
    q, k, v = qkv(sq=12, skv=12)
    first = call(q, k, v, dispatcher=d)
    assert torch.equal(call(q.clone(), k, v, dispatcher=d), first)  # replayed
    assert fastpath.forward_key(neg_view(q), k, v, (None,) * 4, AttentionOptions(), None) is None
    assert fastpath.forward_key(q, k, v, (neg_view(q[0, :, :, :1].reshape(2, 12)), None, None, None),
                                AttentionOptions(), None) is None
    assert torch.equal(call(neg_view(q), k, v, dispatcher=d), first)
    assert torch.equal(call(q, neg_view(k), v, dispatcher=d), first)


# -- counts without per-position memory ---------------------------------------------------------------
def _visible_brute(sq, skv, offset, left, right):
    return sum(1 for i in range(sq) for j in range(skv)
               if (left < 0 or j >= i + offset - left) and (right < 0 or j <= i + offset + right))


def _computed_brute(sq, skv, offset, left, right, bm, bn):
    total = 0
    for m0 in range(0, sq, bm):
        last = min(m0 + bm, sq) - 1
        lo = 0 if left < 0 else max(m0 + offset - left, 0) // bn * bn
        hi = skv if right < 0 else min(max(last + offset + right + 1, 0), skv)
        total += bm * -(-(hi - lo) // bn) * bn if hi > lo else 0
    return total


def _random_band(rng: random.Random):
    sq, skv = rng.randint(1, 90), rng.randint(1, 90)
    mode = rng.choice(["none", "top_left", "bottom_right", "window"])
    if mode == "none":
        return sq, skv, 0, -1, -1
    if mode == "top_left":
        return sq, skv, 0, -1, 0
    left, right = rng.choice([-1, 0, 1, 5, 33, 200]), rng.choice([-1, 0, 2, 17, 200])
    return sq, skv, skv - sq, (-1 if mode == "bottom_right" else left), (0 if mode == "bottom_right" else right)


def test_pair_counts_match_a_brute_force_count():
    rng = random.Random(38)
    for _ in range(400):
        sq, skv, offset, left, right = band = _random_band(rng)
        assert band_pairs(*band) == _visible_brute(*band), band
        bm, bn = rng.choice([16, 32, 64]), rng.choice([16, 32, 64, 128])
        assert block_pairs(*band, bm, bn) == _computed_brute(*band, bm, bn), (band, bm, bn)
    for _ in range(2000):
        n, m, a, b = rng.randint(0, 30), rng.randint(1, 20), rng.randint(-40, 40), rng.randint(-60, 60)
        assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


def test_problem_counts_sum_over_sequences():
    window = AttentionProblem(3, 2, 2, 20, 30, 32, 32, mask=MaskKind.SLIDING_WINDOW, window=Window(4, 2),
                              variant=AttentionVariant(band=True))
    assert window.visible_pairs() == 3 * _visible_brute(20, 30, 10, 4, 2)
    assert computed_pairs(window, 16, 32) == 3 * _computed_brute(20, 30, 10, 4, 2, 16, 32)


def test_counts_of_the_longest_sequences_are_closed_form():
    n = 2**31
    assert band_pairs(n, n, 0, -1, 0) == n * (n + 1) // 2
    assert band_pairs(n, n, 0, -1, -1) == n * n
    assert band_pairs(n, 2 * n, n, 7, 0) == 8 * n
    assert block_pairs(n, n, 0, -1, -1, 64, 64) == n * n
    causal = AttentionProblem(2, 1, 1, MAX_SEQLEN, MAX_SEQLEN, 32, 32, mask=MaskKind.CAUSAL_TOP_LEFT,
                              variant=AttentionVariant(band=True))
    assert causal.visible_pairs() == MAX_SEQLEN * (MAX_SEQLEN + 1)
    assert computed_pairs(causal, 64, 64) > causal.visible_pairs()


def test_sequences_past_the_32_bit_positions_are_refused():
    # a row of the last tile plus the diagonal offset plus an unbounded side stays an int32
    assert MAX_SEQLEN + 256 + UNBOUNDED < 2**31 and MAX_SEQLEN < UNBOUNDED
    with pytest.raises(UnsupportedError, match=r"\[seqlen-limit\]"):
        AttentionProblem(1, 1, 1, MAX_SEQLEN + 1, 8, 32, 32)


def test_an_expanded_query_of_2_31_rows_is_answered_without_allocating():
    """The issue's reproducer, in a process allowed 3 GiB: a 2**31-row operand would need 256 GiB."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
        import torch, tiledispatch
        q = torch.randn(1, 1, 1, 32).expand(1, 1, 2**31, 32)
        kv = torch.randn(1, 1, 16, 32)
        for k in (kv, q):
            try:
                tiledispatch.attention(q, k, k, causal=True)
            except tiledispatch.UnsupportedError as e:
                print("refused:", e)
    """)
    # No CUDA context in 3 GiB, and one BLAS thread: OpenBLAS reserves buffers per thread, which on a
    # 16-core GPU host outgrow the limit before any attention runs.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("refused: [seqlen-limit] 2147483648 queries") == 2, done.stdout
