"""The fast path (fastpath.py): a signature seen before replays its bound call.

Each test binds on a first call and then calls again with fresh tensors of the same
signature, so the second call is a replay; its results are compared bit for bit with the
checked path (`dispatcher.run` on `check_operands`) on the same tensors, and against the
float64 reference through `helpers.check`. Runs under the interpreter on the CPU (fp16, fp32).
"""

import gc
import weakref

import pytest
import torch

import tiledispatch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.errors import InvalidProblemError, UnsupportedError
from tiledispatch.core.registry import Registry
from tiledispatch.ops.attention import AttentionOptions, check_operands, fastpath, parse_causal

from .helpers import ARCH, DEVICE, check, randn

F16, F32 = torch.float16, torch.float32


class SpyDispatcher(Dispatcher):
    """Records every kernel it prepares: a replay prepares nothing."""

    def __init__(self, families: tuple[str, ...]) -> None:
        registry = Registry.from_rule_set("attention", "tiny", ARCH).filter(lambda s: s.family in families)
        super().__init__(registry, ARCH)
        self.prepared: list[str] = []

    def prepare(self, operands, *, kernel=None):
        spec, launchers = super().prepare(operands, kernel=kernel)
        self.prepared.append(spec.name)
        return spec, launchers


def _checked_forward(d, q, k, v, **kw):
    """The checked path's output on these tensors: checks, selection, plan, launch."""
    options = AttentionOptions(causal=parse_causal(kw.pop("causal", False)), softcap=kw.pop("softcap", None),
                               dropout_p=kw.pop("dropout_p", 0.0), dropout_seed=kw.pop("dropout_seed", 0),
                               needs_lse=True)
    return d.run(check_operands(q, k, v, options=options, **kw), kernel=None)


def _bound(d, q, k, v, kernel=None, **kw):
    """The memo's entry for this forward call (fails if the call was never bound)."""
    options = AttentionOptions(causal=parse_causal(kw.pop("causal", False)), softcap=kw.pop("softcap", None),
                               dropout_p=kw.pop("dropout_p", 0.0), needs_lse=kw.pop("needs_lse", True))
    optional = tuple(kw.get(n) for n in ("bias", "mask", "alibi_slopes", "sinks"))
    key = fastpath.forward_key(q, k, v, optional, options, kernel)
    return d.memo(("attention", key), lambda: pytest.fail("this signature was never bound"))


@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("families", [("fwd",), ("fwd-tma",)], ids=["fwd", "fwd-tma"])
@pytest.mark.parametrize("features", [{}, {"causal": True, "softcap": 3.0}, {"sinks": True}, {"bshd": True}],
                         ids=["plain", "causal-softcap", "sinks", "bshd"])
def test_replay_equals_the_checked_path(dtype, families, features):
    if dtype is F32 and families == ("fwd-tma",):
        pytest.skip("the TMA family takes half dtypes only")
    d = SpyDispatcher(families)
    features = dict(features)
    bshd = features.pop("bshd", False)
    sinks = features.pop("sinks", False)

    def qkv():
        shape = (2, 19, 4, 32) if bshd else (2, 4, 19, 32)
        t = [randn(*shape, dtype=dtype) for _ in range(3)]
        return [x.transpose(1, 2) for x in t] if bshd else t

    extra = {"sinks": torch.randn(4, device=DEVICE)} if sinks else {}
    tiledispatch.attention(*qkv(), dispatcher=d, return_lse=True, **features, **extra)
    assert len(d.prepared) == 1
    q, k, v = qkv()
    extra = {"sinks": torch.randn(4, device=DEVICE)} if sinks else {}
    out, lse = tiledispatch.attention(q, k, v, dispatcher=d, return_lse=True, **features, **extra)
    assert len(d.prepared) == 1, "the second call of a signature must replay, not prepare again"
    assert isinstance(_bound(d, q, k, v, **features, **extra), fastpath.BoundAttention)
    want = _checked_forward(d, q, k, v, **features, **extra)
    assert torch.equal(out, want.out) and torch.equal(lse, want.lse)
    assert out.stride() == want.out.stride()


@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("families", [("fwd", "bwd"), ("fwd", "bwd-atomic")], ids=["bwd", "bwd-atomic"])
def test_replayed_backward_against_the_reference(dtype, families):
    """Twice per signature, each on fresh inputs: the second forward and backward are replays,
    with a bias gradient (a zero-filled buffer) and the atomic dQ workspace."""
    d = SpyDispatcher(families)
    for _ in range(2):
        check(randn(1, 2, 18, 32, dtype=dtype), randn(1, 2, 21, 32, dtype=dtype),
              randn(1, 2, 21, 32, dtype=dtype), families=families, bias=randn(18, 21, dtype=dtype), causal=True)
        q = randn(1, 2, 18, 32, dtype=dtype, grad=True)
        k, v = randn(1, 2, 21, 32, dtype=dtype, grad=True), randn(1, 2, 21, 32, dtype=dtype, grad=True)
        bias = randn(18, 21, dtype=dtype, grad=True)
        out = tiledispatch.attention(q, k, v, bias=bias, causal=True, dispatcher=d)
        out.backward(torch.ones_like(out))
    assert len(d.prepared) == 2, d.prepared  # one forward and one backward bind, then replays
    assert [name.split("_")[1] for name in d.prepared] == ["fwd", "bwd"]


def test_dropout_seeds_are_honoured_by_replays():
    """Same signature, different seeds: each replay (forward and backward) matches the
    reference with its own seed's keep mask; the same seed repeats the output."""
    shapes = ((1, 2, 20, 32), (1, 2, 24, 32), (1, 2, 24, 32))
    outs = []
    for seed in (11, 12, 11):
        q, k, v = (torch.randn(*s, generator=torch.Generator().manual_seed(3)).to(DEVICE, F16) for s in shapes)
        out, _, _ = check(q, k, v, dropout_p=0.3, seed=seed)
        outs.append(out.detach())
    assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], outs[1])


def test_a_bad_call_after_a_good_one_still_raises():
    d = SpyDispatcher(("fwd",))
    q, k, v = randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32)
    tiledispatch.attention(q, k, v, dispatcher=d)
    tiledispatch.attention(randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32), dispatcher=d)
    with pytest.raises(InvalidProblemError, match=r"\[dtype\]"):
        tiledispatch.attention(q, k, v.float(), dispatcher=d)
    with pytest.raises(InvalidProblemError, match=r"\[head-dim-match\]"):
        tiledispatch.attention(q, randn(1, 2, 16, 64), v, dispatcher=d)
    with pytest.raises(InvalidProblemError, match=r"\[head-dim-stride\]"):
        tiledispatch.attention(q, k, randn(1, 2, 32, 16).transpose(-1, -2), dispatcher=d)
    with pytest.raises(InvalidProblemError, match=r"\[softcap\]"):
        tiledispatch.attention(q, k, v, softcap=-1.0, dispatcher=d)
    with pytest.raises(InvalidProblemError, match=r"\[bias-shape\]"):
        tiledispatch.attention(q, k, v, bias=randn(3, 16), dispatcher=d)
    with pytest.raises(UnsupportedError, match=r"causal="):
        tiledispatch.attention(q, k, v, causal="sideways", dispatcher=d)
    # ... and the good signature still replays afterwards.
    tiledispatch.attention(q, k, v, dispatcher=d)
    assert len(d.prepared) == 1


def test_a_misaligned_view_gets_its_own_binding():
    """The 16-byte bit of each base is in the signature: an offset view re-checks (unaligned variant)."""
    d = SpyDispatcher(("fwd",))
    q, k, v = randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32)
    tiledispatch.attention(q, k, v, dispatcher=d)
    storage = randn(1 * 2 * 16 * 32 + 1)
    q_off = storage[1:].view(1, 2, 16, 32)  # base 2 bytes past an aligned one
    out = tiledispatch.attention(q_off, k, v, dispatcher=d)
    assert len(d.prepared) == 2
    assert check_operands(q_off, k, v).problem.variant.aligned is False
    want = _checked_forward(d, q_off, k, v)
    assert torch.equal(out, want.out)


def test_forced_kernels_are_honoured():
    d = SpyDispatcher(("fwd", "fwd-tma"))
    names = [f"attention_fwd_fp16_d32x32_{tile}_{ARCH.tag}" for tile in ("fwd_32x16_w4_s2", "fwd-tma_16x16_w4_s2")]
    for _ in range(2):
        for name in names:
            tiledispatch.attention(randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32), kernel=name,
                                   dispatcher=d)
    assert d.prepared == names  # each bound once, for its own name
    with pytest.raises(UnsupportedError, match="cannot run this problem"):  # a bias the TMA family lacks
        tiledispatch.attention(randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32), bias=randn(16, 16),
                               kernel=names[1], dispatcher=d)


def test_one_tensor_as_k_and_v_then_two():
    """Which inputs are one object is in the signature: a binding made with k is v must not
    serve a later call with distinct k and v."""
    d = SpyDispatcher(("fwd",))
    q, kv = randn(1, 2, 16, 32), randn(1, 2, 16, 32)
    tiledispatch.attention(q, kv, kv, dispatcher=d)
    q, k, v = randn(1, 2, 16, 32), randn(1, 2, 16, 32), randn(1, 2, 16, 32)
    out = tiledispatch.attention(q, k, v, dispatcher=d)
    assert torch.equal(out, _checked_forward(d, q, k, v).out)


def test_negative_scale_on_the_tma_forward_stays_checked():
    """Its plan negates K, which a replay cannot: the signature is checked on every call, and right."""
    d = SpyDispatcher(("fwd-tma",))
    for _ in range(2):
        q, k, v = randn(1, 2, 19, 32), randn(1, 2, 23, 32), randn(1, 2, 23, 32)
        out = tiledispatch.attention(q, k, v, scale=-0.4, dispatcher=d, return_lse=True)[0]
    options = AttentionOptions(scale=-0.4, needs_lse=True)
    key = fastpath.forward_key(q, k, v, (None,) * 4, options, None)
    assert d.memo(("attention", key), lambda: None) is fastpath.CHECKED
    assert torch.equal(out, d.run(check_operands(q, k, v, options=options)).out)


def test_a_bound_call_keeps_no_tensor_alive():
    d = SpyDispatcher(("fwd", "bwd"))
    q = randn(1, 2, 16, 32, grad=True)
    k, v = randn(1, 2, 16, 32, grad=True), randn(1, 2, 16, 32, grad=True)
    out = tiledispatch.attention(q, k, v, dispatcher=d)
    out.sum().backward()
    refs = [weakref.ref(t) for t in (q, k, v, out)]
    del q, k, v, out
    gc.collect()
    assert all(r() is None for r in refs)


def test_keys_refuse_what_only_the_checked_path_takes():
    q = randn(1, 2, 16, 32)
    options = AttentionOptions()
    assert fastpath.forward_key(q, q, q, (None,) * 4, options, None) is not None
    assert fastpath.forward_key(object(), q, q, (None,) * 4, options, None) is None
    assert fastpath.forward_key(q, q, q, (None,) * 4, AttentionOptions(scale=torch.tensor(0.5)), None) is None
    assert fastpath.forward_key(q, q, q, (None,) * 4, options, object()) is None
    options_bwd = AttentionOptions(deterministic=True)
    assert fastpath.backward_key(q, q, q, q, q, q, (None,) * 4, options_bwd, None, False) != \
        fastpath.backward_key(q, q, q, q, q, q, (None,) * 4, AttentionOptions(), None, False)


@pytest.mark.parametrize("given", [True, False], ids=["scales", "unit-scales"])
def test_fp8_replay_takes_each_calls_scales(given):
    """fp8 binds its scale tensors as roles: a replay with fresh tensors and new scales equals the
    checked path bit for bit; scales left out are ones on both paths."""
    fp8 = torch.float8_e4m3fn
    d = SpyDispatcher(("fwd-tma",))

    def call():
        q, k, v = (randn(1, 2, 24, 32, dtype=F32).to(fp8) for _ in range(3))
        scales = {f"scale_{n}": torch.rand(1, device=DEVICE) + 0.5 for n in "qkv"} if given else {}
        with torch.no_grad():
            out, lse = tiledispatch.attention(q, k, v, causal=True, dispatcher=d, return_lse=True, **scales)
        return (q, k, v), scales, out, lse

    call()
    (q, k, v), scales, out, lse = call()
    assert len(d.prepared) == 1, "the second fp8 call of a signature must replay"
    want = _checked_forward(d, q, k, v, causal=True, **scales)
    assert torch.equal(out, want.out) and torch.equal(lse, want.lse)


def test_a_plain_inference_call_replays_under_its_raw_options():
    """No grad, dropout or LSE: the call is keyed on its options as written (fastpath.plain_key) and
    replays the same bound forward; other options are another key, with their own answer."""
    d = SpyDispatcher(("fwd",))
    with torch.no_grad():
        tiledispatch.attention(randn(1, 2, 17, 32), randn(1, 2, 17, 32), randn(1, 2, 17, 32), causal=True,
                               softcap=2.0, dispatcher=d)
        q, k, v = randn(1, 2, 17, 32), randn(1, 2, 17, 32), randn(1, 2, 17, 32)
        out = tiledispatch.attention(q, k, v, causal=True, softcap=2.0, dispatcher=d)
        assert len(d.prepared) == 1, "the second plain call must replay"
        plain = fastpath.plain_key(q, k, v, (None,) * 4, True, None, None, 2.0, False, None)
        assert d.memo(plain, lambda: pytest.fail("no plain entry")) is not None
        want = _checked_forward(d, q, k, v, causal=True, softcap=2.0)
        assert torch.equal(out, want.out)
        other = tiledispatch.attention(q, k, v, causal=False, softcap=2.0, dispatcher=d)
        assert torch.equal(other, _checked_forward(d, q, k, v, causal=False, softcap=2.0).out)
        assert not torch.equal(other, out)
    assert fastpath.plain_key(q, k, v, (None,) * 4, True, [1, 0], None, None, False, None) is None  # unhashable
    recorded = fastpath.plain_key(q.requires_grad_(), k, v, (None,) * 4, True, None, None, None, False, None)
    assert recorded[1] is True and recorded != plain  # a recorded call is its own key
    with torch.no_grad():
        assert fastpath.plain_key(q, k, v, (None,) * 4, True, None, None, None, False, None)[1] is False
    bias = randn(1, 2, 17, 17)
    assert fastpath.plain_key(q, k, v, (bias, None, None, None), True, None, None, None, False, None) is None
    assert fastpath.plain_key(q.detach(), k, v, (bias.requires_grad_(), None, None, None), True, None, None, None,
                              False, None) is None  # the bias's gradient: the checked path


def test_a_plain_recorded_call_off_cudnn_keeps_the_checked_path_and_its_gradients():
    """A recorded plain call that cuDNN's op cannot take (here: the CPU) is remembered as such
    under its raw options, and each call runs the checked path, whose output and gradients are the
    float64 reference's to fp16's tolerance."""
    d = SpyDispatcher(("fwd", "bwd"))
    q, k, v = (randn(1, 2, 17, 32).requires_grad_() for _ in range(3))
    for _ in range(2):
        out = tiledispatch.attention(q, k, v, causal=True, dispatcher=d)
    plain = fastpath.plain_key(q, k, v, (None,) * 4, True, None, None, None, False, None)
    assert d.memo(plain, lambda: pytest.fail("no plain entry")) is None
    dout = randn(*out.shape)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    want_grads = torch.autograd.grad(want, leaves, dout.double())
    torch.testing.assert_close(out.double(), want, rtol=2e-3, atol=2e-3)  # fp16 inputs and outputs
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got.double(), expected, rtol=1e-2, atol=1e-2)


def test_signature_metas_read_what_tensor_meta_reads():
    """`_metas` gives each tensor's replay.tensor_meta, so a signature means what every other bound
    call's does; a negated view has none."""
    from tiledispatch.core.replay import tensor_meta
    base = randn(2, 3, 17, 32)
    views = (base, base.transpose(1, 2), base[:, :, 1:], torch.nn.Parameter(base.clone()))
    assert fastpath._metas(views) == tuple(tensor_meta(t) for t in views)
    assert fastpath._metas((base, torch._neg_view(base))) is None


def test_a_plain_recorded_call_weighed_to_cudnn_runs_the_twin_in_a_capture(monkeypatch):
    """Where a pick of ours was weighed away for cuDNN's op (`CudnnAttention.weighed`), a CUDA graph
    capture runs the twin, which replays the device's picks: the plain key's answer is asked about
    the capture on every call, not once."""
    import tiledispatch.ops.attention as attention_op

    class Weighed:
        weighed, calls = True, 0

        def __call__(self, q, k, v):
            Weighed.calls += 1
            return q
    d = SpyDispatcher(("fwd", "bwd"))
    q, k, v = (randn(1, 2, 17, 32).requires_grad_() for _ in range(3))
    plain = fastpath.plain_key(q, k, v, (None,) * 4, True, None, None, None, False, None)
    d.memo(plain, Weighed)
    assert tiledispatch.attention(q, k, v, causal=True, dispatcher=d) is q and Weighed.calls == 1
    monkeypatch.setattr(attention_op, "capturing", lambda: True)
    out = tiledispatch.attention(q, k, v, causal=True, dispatcher=d)
    assert Weighed.calls == 1 and out is not q and out.grad_fn is not None  # the twin ran it
