"""A recorded attention call that cuDNN's op takes (native.py) runs it, recorded by PyTorch's own
autograd: its output and gradients match the float32 reference as the twin's do. Calls it does
not take keep the twin. GPU only: cuDNN's attention runs on CUDA tensors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch.core import hostcost
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.attention import native
from tiledispatch.ops.attention.function import read_call

from ...conftest import requires_gpu

pytestmark = requires_gpu


def _dispatcher() -> Dispatcher:
    """A fresh one: the decision is kept in a dispatcher's memo, and the tests change the host figure."""
    return Dispatcher(Registry.from_rule_set("attention", "default", current_arch()), current_arch())


def _leaves(heads_kv: int, seqlen: int = 128, head_dim: int = 64):
    g = torch.Generator(device="cuda").manual_seed(heads_kv * 7 + seqlen)
    shapes = ((2, 4, seqlen, head_dim), (2, heads_kv, seqlen, head_dim), (2, heads_kv, seqlen, head_dim))
    return [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for s in shapes]


def _reference(q, k, v, causal, dout):
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=bool(causal), enable_gqa=True)
    return out, torch.autograd.grad(out, leaves, dout.float())


@pytest.mark.parametrize("heads_kv", [4, 2])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_a_plain_recorded_call_runs_cudnns_op_with_the_references_results(monkeypatch, heads_kv, causal):
    monkeypatch.setattr(hostcost, "recorded_host_s", lambda dispatcher: 1.0)  # any pick of ours weighed away
    q, k, v = _leaves(heads_kv)
    d = _dispatcher()
    for _ in range(2):  # the first sight, then the plain key's memo (fastpath.plain_key)
        out = tiledispatch.attention(q, k, v, causal=causal, dispatcher=d)
        assert "Cudnn" in out.grad_fn.name()  # PyTorch's own node, not the twin's
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    want, want_grads = _reference(q, k, v, causal, dout)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)
    for name, got, expected in zip("qkv", grads, want_grads):
        assert got.shape == expected.shape
        torch.testing.assert_close(got.float(), expected, rtol=3e-2, atol=3e-2, msg=lambda m: f"d{name}: {m}")


def test_calls_cudnns_op_does_not_take_keep_the_twin(monkeypatch):
    """A soft-cap, a forced kernel, a returned LSE and a bottom-right causal mask over more keys
    than queries (cuDNN's is top-left) each keep the op's twin."""
    monkeypatch.setattr(hostcost, "recorded_host_s", lambda dispatcher: 1.0)
    q, k, v = _leaves(4)
    d = _dispatcher()
    for kwargs in ({"softcap": 30.0}, {"return_lse": True}):
        out = tiledispatch.attention(q, k, v, dispatcher=d, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        assert "Cudnn" not in out.grad_fn.name(), kwargs
    longer_k, longer_v = (torch.cat([t, t], dim=2).detach().requires_grad_() for t in (k, v))
    out = tiledispatch.attention(q, longer_k, longer_v, causal="bottom_right", dispatcher=d)
    assert "Cudnn" not in out.grad_fn.name()
    # the plain call as attention() reads it, then with a forced kernel
    call, _, _ = read_call(q, k, v, None, None, None, None, causal=False, window=None, scale=None, softcap=None,
                           dropout_p=0.0, dropout_seed=None, dropout_offset=0, return_lse=False, deterministic=False,
                           kernel=None, backward_kernel=None, dispatcher=d)
    assert native.native_forward(q, k, v, call) is not None
    assert native.native_forward(q, k, v, replace(call, kernel="attention_fwd_any")) is None
