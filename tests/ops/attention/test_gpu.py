"""Attention on a real GPU: bf16 (which the interpreter lacks), native compiles, the SDPA candidates
(cuDNN's forward that keeps the LSE and its backward, alone and mixed with the Triton kernels).

Skipped without a GPU; on the H200: `python -m pytest tests/ops/attention/test_gpu.py`.
"""

import pytest
import torch

import tiledispatch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.attention import AttentionOptions, Direction, check_operands, vendor
from tiledispatch.ops.attention.reference import (
    compare_tensors,
    reference_from,
    tolerance,
)

from ...conftest import requires_gpu
from .helpers import check, randn

pytestmark = requires_gpu
BF16 = torch.bfloat16


def default_families(*families):
    arch = current_arch()
    return Dispatcher(Registry.from_rule_set("attention", "default", arch).filter(lambda s: s.family in families), arch)


# Each (features, head dim) compiles its own kernels on the GPU: the features are crossed with
# one shape, the other shapes run plain and causal (a cold cache compiles each in seconds).
FEATURES = [{}, {"causal": True}, {"causal": "bottom_right"}, {"window": (64, 0), "causal": True},
            {"softcap": 30.0}, {"alibi_slopes": "per-head"}, {"sinks": "per-head"}, {"dropout_p": 0.2}]
GQA_D128 = (2, 8, 2, 300, 300, 128)
CASES = [(f, GQA_D128) for f in FEATURES] + [(f, shape) for f in FEATURES[:2]
                                              for shape in ((1, 4, 4, 129, 257, 64), (1, 4, 1, 77, 77, 256))]
CASES += [({"softcap": 50.0, "causal": True}, (2, 4, 2, 200, 200, 256))]  # Gemma-2's attention: no vendor takes it


@pytest.mark.parametrize("features, shape", CASES,
                         ids=[("-".join(f) or "plain") + f"-d{s[-1]}" for f, s in CASES])
def test_bf16_forward_and_backward(features, shape):
    b, hq, hkv, sq, skv, d = shape
    features = {k: (torch.rand(hq, device="cuda") if v == "per-head" and k == "alibi_slopes" else
                    torch.randn(hq, device="cuda") if v == "per-head" else v) for k, v in features.items()}
    check(randn(b, hq, sq, d, dtype=BF16), randn(b, hkv, skv, d, dtype=BF16), randn(b, hkv, skv, d, dtype=BF16),
          **features)


@pytest.mark.parametrize("family", ["bwd", "bwd-atomic"])
@pytest.mark.parametrize("dims", [(256, 256), (192, 192), (192, 128), (80, 80), (32, 32)])
def test_default_tiles_every_head_dim(family, dims):
    d_qk, d_v = dims
    d = default_families("fwd", family)
    q, k, v = randn(2, 4, 200, d_qk, dtype=BF16, grad=True), randn(2, 2, 333, d_qk, dtype=BF16, grad=True), \
        randn(2, 2, 333, d_v, dtype=BF16, grad=True)
    out = tiledispatch.attention(q, k, v, causal="bottom_right", dispatcher=d)
    out.backward(torch.ones_like(out))
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ops = check_operands(q.detach(), k.detach(), v.detach(), options=AttentionOptions(causal=tiledispatch.ops.attention.
                                                                                       parse_causal("bottom_right")))
    ref, _ = reference_from(*leaves, ops.problem, scale=ops.scale)
    ref.backward(torch.ones_like(ref))
    assert compare_tensors(out, ref, tolerance(ops.problem.dtype)).passed
    for mine, theirs in zip((q, k, v), leaves):
        result = compare_tensors(mine.grad, theirs.grad, tolerance(ops.problem.dtype, gradient=True))
        assert result.passed, result


def test_varlen_bf16():
    lengths = [17, 128, 333, 77]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = randn(sum(lengths), 8, 128, dtype=BF16), randn(sum(lengths), 2, 128, dtype=BF16), \
        randn(sum(lengths), 2, 128, dtype=BF16)
    check(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)


@pytest.mark.parametrize("family", ["sdpa-flash", "sdpa-cudnn"])
@pytest.mark.parametrize("causal", [False, True])
def test_vendor_forward_with_and_without_lse(family, causal):
    d = default_families("fwd", "bwd", family)
    q, k, v = randn(2, 8, 256, 128, dtype=BF16), randn(2, 8, 256, 128, dtype=BF16), randn(2, 8, 256, 128, dtype=BF16)
    name = f"attention_fwd_bf16_{family}_{d.arch.tag}"
    out = tiledispatch.attention(q, k, v, causal=causal, dispatcher=d, kernel=name)
    ops = check_operands(q, k, v, options=AttentionOptions(causal=tiledispatch.ops.attention.parse_causal(causal)))
    ref, ref_lse = reference_from(q.double().cpu(), k.double().cpu(), v.double().cpu(), ops.problem, scale=ops.scale)
    assert compare_tensors(out, ref, tolerance(ops.problem.dtype)).passed
    out2, lse = tiledispatch.attention(q, k, v, causal=causal, dispatcher=d, kernel=name, return_lse=True)
    assert compare_tensors(out2, ref, tolerance(ops.problem.dtype)).passed
    assert compare_tensors(lse, ref_lse, 1e-3).passed
    assert lse.shape == (2, 8, 256) and lse.dtype == torch.float32 and lse.stride(-1) == 1  # the LSE contract


# -- cuDNN through its private ops: the forward that keeps the LSE, and the backward ------------
# cuDNN's bf16 errors against fp32 were 2.4e-3 on the H200 (B4 H32 S2048 D128): 1e-2 leaves 4x.
VENDOR_TOLERANCE = 1e-2
# (batch, heads_q, heads_kv, seqlen, head dim, causal, BSHD storage)
CUDNN_CASES = {
    "mha": (2, 8, 8, 256, 128, False, False),
    "mha-causal": (2, 8, 8, 256, 128, True, False),
    "gqa-causal-s300": (2, 8, 2, 300, 128, True, False),
    "mqa-d64": (2, 8, 1, 256, 64, False, False),
    "gqa-causal-bshd": (2, 8, 2, 256, 128, True, True),
    "mha-causal-d80": (1, 4, 4, 256, 80, True, False),
    "gqa-causal-d256": (1, 4, 2, 256, 256, True, False),
}


def cudnn(direction: str) -> str:
    return f"attention_{direction}_bf16_sdpa-cudnn_{current_arch().tag}"


def dispatcher_of(keep) -> Dispatcher:
    arch = current_arch()
    return Dispatcher(Registry.from_rule_set("attention", "default", arch).filter(keep), arch)


def inputs(b, hq, hkv, s, d, bshd, grad=False):
    if bshd:
        q, k, v = (randn(b, s, h, d, dtype=BF16).transpose(1, 2) for h in (hq, hkv, hkv))
    else:
        q, k, v = randn(b, hq, s, d, dtype=BF16), randn(b, hkv, s, d, dtype=BF16), randn(b, hkv, s, d, dtype=BF16)
    return [t.detach().requires_grad_(grad) for t in (q, k, v)]


def check_training(q, k, v, causal, **kwargs):
    """attention(...) with return_lse, then its backward, against the float64 reference."""
    out, lse = tiledispatch.attention(q, k, v, causal=causal, return_lse=True, **kwargs)
    grad = torch.randn_like(out)
    out.backward(grad)
    leaves = [t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v)]
    ops = check_operands(q.detach(), k.detach(), v.detach(),
                         options=AttentionOptions(causal=tiledispatch.ops.attention.parse_causal(causal)))
    ref, ref_lse = reference_from(*leaves, ops.problem, scale=ops.scale)
    ref.backward(grad.to("cpu", torch.float64))
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.stride(-1) == 1
    results = {"out": compare_tensors(out, ref, VENDOR_TOLERANCE), "lse": compare_tensors(lse, ref_lse, 1e-3)}
    for name, mine, leaf in zip(("dq", "dk", "dv"), (q, k, v), leaves):
        assert mine.grad.shape == mine.shape, name
        results[name] = compare_tensors(mine.grad, leaf.grad, VENDOR_TOLERANCE)
    assert all(r.passed for r in results.values()), {n: r.to_dict() for n, r in results.items()}


def skip_beyond_cudnn_head_dim(d):
    if d > vendor.cudnn_max_head_dim():
        pytest.skip(f"this runtime's cuDNN takes head dims up to {vendor.cudnn_max_head_dim()}")


@pytest.mark.parametrize("case", list(CUDNN_CASES))
def test_cudnn_forward_keeps_the_lse(case):
    b, hq, hkv, s, d, causal, bshd = CUDNN_CASES[case]
    skip_beyond_cudnn_head_dim(d)
    q, k, v = inputs(b, hq, hkv, s, d, bshd)
    disp = dispatcher_of(lambda spec: spec.family == "sdpa-cudnn")
    out, lse = tiledispatch.attention(q, k, v, causal=causal, return_lse=True, dispatcher=disp, kernel=cudnn("fwd"))
    ops = check_operands(q, k, v, options=AttentionOptions(causal=tiledispatch.ops.attention.parse_causal(causal)))
    ref, ref_lse = reference_from(q.double().cpu(), k.double().cpu(), v.double().cpu(), ops.problem, scale=ops.scale)
    assert lse.shape == (b, hq, s) and lse.dtype == torch.float32 and lse.stride(-1) == 1
    assert compare_tensors(out, ref, VENDOR_TOLERANCE).passed
    lse_check = compare_tensors(lse, ref_lse, 1e-3)
    assert lse_check.passed, lse_check


@pytest.mark.parametrize("case", list(CUDNN_CASES))
def test_cudnn_forward_and_backward(case):
    b, hq, hkv, s, d, causal, bshd = CUDNN_CASES[case]
    skip_beyond_cudnn_head_dim(d)
    disp = dispatcher_of(lambda spec: spec.family == "sdpa-cudnn")
    check_training(*inputs(b, hq, hkv, s, d, bshd, grad=True), causal, dispatcher=disp, kernel=cudnn("fwd"),
                   backward_kernel=cudnn("bwd"))


@pytest.mark.parametrize("native", [True, False], ids=["native", "expanded"])
def test_cudnn_backward_gqa(monkeypatch, native):
    """Tells whether cuDNN's backward takes K/V with fewer heads as they are ([native]); if only
    [expanded] passes, set vendor.CUDNN_BACKWARD_TAKES_GQA = False."""
    monkeypatch.setattr(vendor, "CUDNN_BACKWARD_TAKES_GQA", native)
    disp = dispatcher_of(lambda spec: spec.family in ("fwd", "sdpa-cudnn"))
    for causal in (False, True):
        check_training(*inputs(2, 8, 2, 384, 128, False, grad=True), causal, dispatcher=disp,
                       backward_kernel=cudnn("bwd"))
        check_training(*inputs(1, 8, 1, 256, 64, True, grad=True), causal, dispatcher=disp,
                       backward_kernel=cudnn("bwd"))


@pytest.mark.parametrize("case", ["mha-causal", "gqa-causal-s300", "gqa-causal-bshd", "mqa-d64"])
def test_triton_forward_then_cudnn_backward(case):
    b, hq, hkv, s, d, causal, bshd = CUDNN_CASES[case]
    disp = dispatcher_of(lambda spec: spec.family == "fwd" or spec.name.startswith("attention_bwd_bf16_sdpa-cudnn"))
    q, k, v = inputs(b, hq, hkv, s, d, bshd, grad=True)
    fwd = check_operands(q.detach(), k.detach(), v.detach(), options=AttentionOptions(
        causal=tiledispatch.ops.attention.parse_causal(causal), needs_lse=True)).problem
    assert disp.select(fwd).family == "fwd"
    check_training(q, k, v, causal, dispatcher=disp, backward_kernel=cudnn("bwd"))


@pytest.mark.parametrize("case", ["mha-causal", "gqa-causal-s300", "gqa-causal-bshd", "mqa-d64"])
def test_cudnn_forward_then_triton_backward(case):
    b, hq, hkv, s, d, causal, bshd = CUDNN_CASES[case]
    disp = dispatcher_of(lambda spec: spec.family == "bwd" or spec.name.startswith("attention_fwd_bf16_sdpa-cudnn"))
    q, k, v = inputs(b, hq, hkv, s, d, bshd, grad=True)
    bwd = check_operands(q.detach(), k.detach(), v.detach(), direction=Direction.BACKWARD, out=q.detach(),
                         lse=q.detach(), grad_out=q.detach(),
                         options=AttentionOptions(causal=tiledispatch.ops.attention.parse_causal(causal))).problem
    assert disp.select(bwd).family == "bwd"
    check_training(q, k, v, causal, dispatcher=disp, kernel=cudnn("fwd"))


def test_vendor_flash_backward_is_refused_with_its_reason():
    """Its private ATen entry point failed standalone on the H200; forcing it says so."""
    d = default_families("fwd", "sdpa-flash")
    q, k, v = (randn(2, 8, 256, 128, dtype=BF16, grad=True) for _ in range(3))
    out = tiledispatch.attention(q, k, v, causal=True, dispatcher=d,
                                 backward_kernel=f"attention_bwd_bf16_sdpa-flash_{d.arch.tag}")
    with pytest.raises(tiledispatch.UnsupportedError, match="flash backward"):
        out.backward(torch.ones_like(out))


@pytest.mark.parametrize("heads_kv", [16, 4], ids=["mha", "gqa"])
def test_default_dispatcher_training_step_on_the_suite_shape(heads_kv):
    """tiledispatch.attention(...).backward() with the default dispatcher: on sm_90 both directions go
    to cuDNN; gradients against SDPA's math in float32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tiledispatch.core.dispatcher import default_dispatcher

    q = randn(2, 16, 1024, 128, dtype=BF16, grad=True)
    k, v = (randn(2, heads_kv, 1024, 128, dtype=BF16, grad=True) for _ in range(2))
    out = tiledispatch.attention(q, k, v, causal=True)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_q, ref_k, ref_v = (t.detach().float().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        ref = torch.nn.functional.scaled_dot_product_attention(ref_q, ref_k, ref_v, is_causal=True,
                                                               enable_gqa=heads_kv != 16)
    ref.backward(grad.float())
    assert compare_tensors(out, ref.double(), VENDOR_TOLERANCE).passed
    for name, a, b in zip("qkv", (q, k, v), (ref_q, ref_k, ref_v)):
        result = compare_tensors(a.grad, b.grad.double(), VENDOR_TOLERANCE)
        assert result.passed, (f"d{name}", result)
    d = default_dispatcher()
    options = AttentionOptions(causal=tiledispatch.ops.attention.parse_causal(True), needs_lse=True)
    picks = {"fwd": d.select(check_operands(q.detach(), k.detach(), v.detach(), options=options).problem).family,
             "bwd": d.select(check_operands(q.detach(), k.detach(), v.detach(), options=options,
                                            direction=Direction.BACKWARD, out=out.detach(), lse=q.detach(),
                                            grad_out=grad).problem).family}
    print("default dispatcher picks", picks)
    if d.arch.sm == 90:
        assert picks == {"fwd": "sdpa-cudnn", "bwd": "sdpa-cudnn"}, picks


@pytest.mark.parametrize("keys", [512, 37])
@pytest.mark.parametrize("mask_kind", ["bool-b1ss", "bool-ss", "additive-bhss"])
@pytest.mark.parametrize("queries", [64, 1])
def test_cudnn_forward_with_a_mask_tensor(mask_kind, keys, queries):
    """cuDNN's inference forward with the mask as its bias (vendor.mask_bias): GQA, broadcast masks,
    a row that sees no key (0, as ours), keys that do not fill 16-byte rows; picked and replayed."""
    torch.manual_seed(keys + queries)
    q, (k, v) = randn(2, 8, queries, 128, dtype=BF16), (randn(2, 2, keys, 128, dtype=BF16) for _ in range(2))
    shape = {"bool-b1ss": (2, 1, queries, keys), "bool-ss": (queries, keys), "additive-bhss": (2, 8, queries, keys)}
    keep = torch.rand(shape[mask_kind], device=q.device) > 0.3
    keep[..., 0, :] = False  # the first query row sees no key
    mask = (torch.randn(keep.shape, device=q.device).to(BF16).masked_fill(~keep, float("-inf"))
            if mask_kind.startswith("additive") else keep)
    disp = dispatcher_of(lambda spec: spec.family == "sdpa-cudnn")
    ops = check_operands(q, k, v, options=AttentionOptions(), mask=mask)
    ref, _ = reference_from(q.double().cpu(), k.double().cpu(), v.double().cpu(), ops.problem, scale=ops.scale,
                            mask=mask.cpu() if mask.dtype == torch.bool else mask.double().cpu())
    for _ in range(2):  # the first call plans; the second replays (fastpath.VendorForward)
        out = tiledispatch.attention(q, k, v, mask=mask, dispatcher=disp, kernel=cudnn("fwd"))
        assert torch.equal(out[:, :, 0].float(), torch.zeros_like(out[:, :, 0].float()))
        result = compare_tensors(out, ref, VENDOR_TOLERANCE)
        assert result.passed, result


def test_a_masked_cudnn_forward_replays_in_a_cuda_graph():
    """The bias is made on the device from scalars (a CPU tensor would be a copy, refused in a capture)."""
    torch.manual_seed(1)
    q, k, v = randn(2, 8, 1, 128, dtype=BF16), randn(2, 2, 513, 128, dtype=BF16), randn(2, 2, 513, 128, dtype=BF16)
    mask = torch.rand(2, 1, 1, 513, device=q.device) > 0.3
    disp = dispatcher_of(lambda spec: spec.family == "sdpa-cudnn")
    tiledispatch.attention(q, k, v, mask=mask, dispatcher=disp)  # selected and planned ahead of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tiledispatch.attention(q, k, v, mask=mask, dispatcher=disp)
    mask.copy_(torch.rand(2, 1, 1, 513, device=q.device) > 0.3)
    expected = tiledispatch.attention(q, k, v, mask=mask, dispatcher=disp)
    graph.replay()
    assert torch.equal(out, expected)
