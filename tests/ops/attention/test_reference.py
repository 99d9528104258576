"""The float64 reference attended in head chunks: the same outputs, LSE and gradients as attended
whole, for every feature a chunk must slice (GQA groups, a broadcast bias and mask, ALiBi slopes,
sinks, a window), so a long problem is checked in bounded memory."""

import pytest
import torch

from tiledispatch.ops.attention import reference as ref
from tiledispatch.ops.attention.inputs import reference_output, tuning_operands
from tiledispatch.ops.attention.problem import MaskKind


def _problem(mask=MaskKind.SLIDING_WINDOW, **sizes):
    from tiledispatch.ops.attention import AttentionOptions, check_operands

    b, hq, hkv, s, d = sizes.get("b", 2), sizes.get("hq", 6), sizes.get("hkv", 2), sizes.get("s", 24), 32
    q, k, v = (torch.randn(b, h, s, d) for h in (hq, hkv, hkv))
    window = (5, 0) if mask is MaskKind.SLIDING_WINDOW else None
    ops = check_operands(q, k, v, options=AttentionOptions(window=window))
    return ops.problem, [t.double() for t in (q, k, v)]


@pytest.mark.parametrize("heads_per_chunk", [1, 2, 4, 6])  # part of a group, one group, two, and all
def test_chunked_forward_matches_the_whole(monkeypatch, heads_per_chunk):
    problem, (q, k, v) = _problem(hq=12, hkv=3)  # groups of 4 query heads
    b, hq, s = q.shape[0], q.shape[1], q.shape[2]
    g = torch.Generator().manual_seed(1)
    features = {"scale": 0.3, "softcap": 20.0, "sinks": torch.randn(hq, generator=g, dtype=torch.float64),
                "bias": torch.randn(1, hq, s, s, generator=g, dtype=torch.float64),  # broadcast over batch
                "mask": torch.rand(s, s, generator=g) > 0.2,  # broadcast over batch and heads
                "slopes": torch.rand(b, hq, generator=g, dtype=torch.float64)}
    whole = ref.reference_from(q, k, v, problem, **features)
    monkeypatch.setattr(ref, "MAX_SCORES", heads_per_chunk * s * s)
    chunks = list(ref.head_chunks(b, hq, 3, s, s))
    assert len(chunks) > 1 and all(c[1].stop - c[1].start <= max(heads_per_chunk, 1) for c in chunks)
    chunked = ref.reference_from(q, k, v, problem, **features)
    for got, want in zip(chunked, whole):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_chunks_cover_every_head_once(monkeypatch):
    for fits, group in [(1, 4), (3, 4), (4, 4), (5, 4), (9, 4), (2, 1), (3, 6)]:
        monkeypatch.setattr(ref, "MAX_SCORES", fits * 10 * 10)
        seen = []
        for rows, heads, kv in ref.head_chunks(2, 4 * group, 4, 10, 10):
            for h in range(heads.start, heads.stop):
                assert kv.start <= h // group < kv.stop  # each query head reads its own key head
                seen.append((rows.start, h))
            assert (heads.stop - heads.start) * 100 <= ref.MAX_SCORES
        assert sorted(seen) == [(b, h) for b in range(2) for h in range(4 * group)]


def test_chunked_gradients_match_autograd_of_the_whole(monkeypatch):
    problem, (q, k, v) = _problem(hq=6, hkv=2)
    grad_out = torch.randn(q.shape, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = ref.reference_from(*leaves, problem, scale=0.25)
    want = torch.autograd.grad(out, leaves, grad_out)
    monkeypatch.setattr(ref, "MAX_SCORES", q.shape[2] * q.shape[2])  # one head a chunk
    got = ref.gradients(q, k, v, grad_out, problem, scale=0.25)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_the_sweeps_backward_reference_is_chunked(monkeypatch):
    """reference_output of a backward problem: the chunked gradients, equal to the whole's."""
    import dataclasses

    from tiledispatch.ops.attention.problem import Direction

    problem, _ = _problem(b=1, hq=4, hkv=2, s=16)
    backward = dataclasses.replace(problem, direction=Direction.BACKWARD, needs_lse=False)
    ops = tuning_operands(backward, "cpu", seed=3)
    if ops is None:
        pytest.skip("fresh operands do not reproduce this problem")
    whole = reference_output(ops)
    monkeypatch.setattr(ref, "MAX_SCORES", 16 * 16)
    for got, want in zip(reference_output(ops), whole):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_gqa_reads_each_key_head_for_its_group_without_copying_it():
    """Query head h attends key head h // group: the reference equals the plain softmax over K and V
    repeated per query head, its output, LSE and gradients (whose K and V sum over the group)."""
    problem, (q, k, v) = _problem(mask=MaskKind.NONE, hq=8, hkv=2, s=12)
    g = torch.Generator().manual_seed(5)
    grad_out = torch.randn(q.shape, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = ref.reference_from(*leaves, problem, scale=0.3)
    grads = torch.autograd.grad(out, leaves, grad_out)

    plain = [t.clone().requires_grad_(True) for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(4, dim=1) for t in plain[1:])
    scores = plain[0] @ kk.transpose(-1, -2) * 0.3
    want_out, want_lse = torch.softmax(scores, -1) @ vv, torch.logsumexp(scores, -1)
    want_grads = torch.autograd.grad(want_out, plain, grad_out)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_an_lse_is_judged_against_its_scores_size_not_its_own():
    """An LSE that cancels to near 0 (one key, a small score) passes its scores' roundoff, and a wrong
    LSE still fails, whether near 0 or not."""
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 1, 1, 64, generator=g), torch.randn(1, 1, 1, 64, generator=g)
    scale = 0.125
    want = torch.tensor([[[0.045]]], dtype=torch.float64)
    roundoff = want + 1.1e-6  # what an fp32 score of |q| |k| / 8 ~ 8 carries
    assert not ref.compare_tensors(roundoff, want, ref.LSE_TOLERANCE).passed  # judged against the LSE itself
    assert ref.compare_lse(roundoff, want, q, k, scale).passed
    for wrong in (want + 0.01, want * 2, -want):
        assert not ref.compare_lse(wrong, want, q, k, scale).passed
    big = torch.tensor([[[5.0]]], dtype=torch.float64)
    assert not ref.compare_lse(big + 0.01, big, q, k, scale).passed
