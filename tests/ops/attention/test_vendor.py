"""The SDPA candidates without a GPU: what they take and refuse (and why), the LSE contract,
the plan's wiring, and the ranking between the backends.

The library calls themselves are replaced by a float64 stand-in that computes what cuDNN
computes from the tensors and the LSE it is handed, so a Triton forward feeding a "cuDNN"
backward (and the reverse) is checked here for shapes, views and numbers; test_gpu.py runs
the real library on the GPU.
"""

import inspect
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import tiledispatch
from tiledispatch import arch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.dtypes import DType
from tiledispatch.core.kernel import PythonLauncher
from tiledispatch.core.launch import execute
from tiledispatch.core.registry import Registry
from tiledispatch.ops.attention import (
    AttentionOptions,
    AttentionProblem,
    AttentionRule,
    AttentionVariant,
    Direction,
    Family,
    MaskKind,
    VendorConfig,
    Window,
    check_operands,
    parse_causal,
    supports,
    validate,
    vendor,
)
from tiledispatch.ops.attention.plan import AttentionResult, kernel_units, plan
from tiledispatch.ops.attention.families.sdpa import vendor_head_dim_factor
from tiledispatch.ops.attention.ranking import rule_score
from tiledispatch.ops.attention.reference import compare_tensors, reference_from, tolerance

from .helpers import dispatcher, randn

SM80, SM90, INTERP = arch.load("sm_80"), arch.load("sm_90"), arch.load("interpreter")
SUITE = Path(__file__).parents[3] / "benchmarks" / "suites" / "attention.json"
CUDNN_FWD = VendorConfig(Family.SDPA_CUDNN, DType.BF16, Direction.FORWARD)
CUDNN_BWD = VendorConfig(Family.SDPA_CUDNN, DType.BF16, Direction.BACKWARD)
FLASH_FWD = VendorConfig(Family.SDPA_FLASH, DType.BF16, Direction.FORWARD)
FLASH_BWD = VendorConfig(Family.SDPA_FLASH, DType.BF16, Direction.BACKWARD)
BAND = AttentionVariant(band=True)


def problem(**kw):
    base = dict(batch=2, heads_q=8, heads_kv=8, seqlen_q=512, seqlen_kv=512, head_dim_qk=128, head_dim_v=128,
                dtype=DType.BF16)
    return AttentionProblem(**{**base, **kw})


@pytest.fixture
def hopper_cudnn(monkeypatch):
    """The runtime of the H200 (cuDNN >= 9.10 on sm_90): cuDNN takes head dims up to 256."""
    monkeypatch.setattr(vendor, "cudnn_max_head_dim", lambda: vendor.CUDNN_HOPPER_MAX_HEAD_DIM)


# -- what cuDNN takes and refuses ---------------------------------------------------------
@pytest.mark.parametrize("heads_kv", [8, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128])
def test_cudnn_takes_the_training_forward_and_the_backward(heads_kv, causal, head_dim):
    p = problem(heads_kv=heads_kv, head_dim_qk=head_dim, head_dim_v=head_dim,
                **({"mask": MaskKind.CAUSAL_TOP_LEFT, "variant": BAND} if causal else {}))
    assert supports(CUDNN_FWD, p) is None
    assert supports(CUDNN_FWD, replace(p, needs_lse=True)) is None
    assert supports(CUDNN_BWD, replace(p, direction=Direction.BACKWARD)) is None
    # bottom-right causal on a square problem is the same mask
    assert supports(CUDNN_BWD, replace(p, direction=Direction.BACKWARD, mask=MaskKind.CAUSAL_BOTTOM_RIGHT,
                                       variant=BAND)) is None


REFUSALS = {
    "dropout": (dict(variant=AttentionVariant(dropout=True)), "dropout"),
    "bias": (dict(variant=AttentionVariant(bias=True)), "bias"),
    "alibi": (dict(variant=AttentionVariant(alibi=True)), "ALiBi"),
    "softcap": (dict(variant=AttentionVariant(softcap=True)), "soft-cap"),
    "sinks": (dict(variant=AttentionVariant(sinks=True)), "sinks"),
    "window": (dict(mask=MaskKind.SLIDING_WINDOW, window=Window(64, 0), variant=BAND), "sliding window"),
    "causal-rectangular": (dict(seqlen_q=100, mask=MaskKind.CAUSAL_TOP_LEFT, variant=BAND), "seqlen_q == seqlen_kv"),
    "head-dim-256": (dict(head_dim_qk=256, head_dim_v=256), "up to 128"),
    "unequal-head-dims": (dict(head_dim_qk=192, head_dim_v=128), "equal Q/K and V head dims"),
    "fp32": (dict(dtype=DType.FP32), "built for bf16"),
    "one-key": (dict(seqlen_kv=1), "key/value length of 1"),
    "unaligned": (dict(variant=AttentionVariant(aligned=False)), "16-byte aligned"),
}


@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
@pytest.mark.parametrize("case", list(REFUSALS))
def test_cudnn_refusals_say_why(case, direction, monkeypatch):
    kw, reason = REFUSALS[case]
    # The head-dim limit is the runtime's (256 with cuDNN >= 9.10 on sm_90): check the 128 one.
    monkeypatch.setattr(vendor, "cudnn_max_head_dim", lambda: 128)
    config = CUDNN_FWD if direction is Direction.FORWARD else CUDNN_BWD
    p = problem(direction=direction, **kw)
    for needs_lse in ((False, True) if direction is Direction.FORWARD else (False,)):
        refusal = supports(config, replace(p, needs_lse=needs_lse))
        assert refusal is not None and reason in refusal, (case, refusal)


MASKED = AttentionVariant(user_mask=tiledispatch.ops.attention.UserMask.BOOLEAN)


def test_cudnn_takes_a_mask_tensor_in_an_inference_forward_only():
    """Its LSE and backward with a bias are not checked against ours (families/sdpa.py)."""
    p = problem(heads_kv=2, variant=MASKED)
    assert supports(CUDNN_FWD, p) is None
    assert supports(CUDNN_FWD, replace(p, mask=MaskKind.CAUSAL_TOP_LEFT, variant=replace(MASKED, band=True))) is None
    for config, refused in ((CUDNN_FWD, replace(p, needs_lse=True)),
                            (CUDNN_BWD, replace(p, direction=Direction.BACKWARD)), (FLASH_FWD, p)):
        reason = supports(config, refused)
        assert reason is not None and "a mask tensor (sdpa-cudnn takes one in an inference forward" in reason


@pytest.mark.parametrize("mask_shape, additive", [((2, 1, 40, 37), False), ((40, 37), False), ((2, 4, 40, 37), True)],
                         ids=["bool-b1ss", "bool-ss", "additive-bhss"])
def test_a_mask_is_cudnns_bias_on_its_own_dims_in_aligned_rows(mask_shape, additive):
    torch.manual_seed(3)
    q = torch.randn(2, 4, 40, 32, dtype=torch.bfloat16)
    mask = torch.rand(mask_shape) > 0.3
    if additive:
        mask = torch.randn(mask_shape).to(torch.bfloat16).masked_fill(~mask, float("-inf"))
    full = (2, 4, 40, 37)
    bias = vendor.mask_bias(mask, q, full)
    expected = mask if additive else torch.zeros(()).masked_fill(~mask, float("-inf"))
    assert bias.shape == full and bias.dtype == q.dtype
    assert torch.equal(bias.float(), expected.float().expand(full))
    assert bias.stride(-2) % 8 == 0 and bias.stride(-1) == 1  # 16-byte rows
    stored = bias.untyped_storage().nbytes() // 2
    assert stored == math.prod(mask_shape[:-1]) * 40  # the mask's own dims, rows of 37 padded to 40
    # our kernels' view of a bool mask (uint8, broadcast dims of stride 0) makes the same bias
    view = check_operands(q, q[:, :, :37], q[:, :, :37], mask=mask).mask
    assert torch.equal(vendor.mask_bias(view, q, full).float(), bias.float())


@pytest.mark.parametrize("heads_kv", [4, 2], ids=["mha", "gqa"])
def test_a_masked_cudnn_forward_matches_the_reference(monkeypatch, heads_kv):
    """A stand-in cuDNN adds the bias it is handed (rows that see no key give 0, as cuDNN's do on the
    H200: results/h200/attention_masked.txt); the plan and the fast path hand it the mask as a bias."""
    from tiledispatch.ops.attention.fastpath import VendorForward

    q, k, v = _inputs(heads_kv, bshd=False)
    mask = torch.rand(q.shape[0], 1, q.shape[2], k.shape[2], device=q.device) > 0.4
    mask[0, 0, 3] = False  # a row that sees no key
    calls = []

    def stand_in_forward(q_, k_, v_, scale, causal_, keep_lse=True, bias=None):
        calls.append(bias)
        group = q_.shape[1] // k_.shape[1]
        kk, vv = (t.double().repeat_interleave(group, 1) for t in (k_, v_))
        scores = q_.double() @ kk.transpose(-1, -2) * scale + bias.double()
        return (torch.softmax(scores, -1).nan_to_num(0.0) @ vv).to(q_.dtype), None

    monkeypatch.setattr(vendor, "cudnn_forward_op", stand_in_forward)
    ops = check_operands(q, k, v, options=AttentionOptions(), mask=mask)
    expected, _ = reference_from(*(t.double().cpu() for t in (q, k, v)), ops.problem, scale=ops.scale,
                                 mask=mask.cpu())
    config = VendorConfig(Family.SDPA_CUDNN, DType.FP16, Direction.FORWARD)
    assert supports(config, ops.problem) is None
    planned = execute(plan(config, ops), {"vendor": PythonLauncher(kernel_units(config)[0])}, None).out
    replayed = VendorForward(config, ops)(q, k, v, None, mask, None, None, 0, 0).out
    assert len(calls) == 2 and all(b is not None for b in calls)
    for got in (planned, replayed):
        assert torch.equal(got[0, :, 3], torch.zeros_like(got[0, :, 3]))
        assert compare_tensors(got, expected, tolerance(DType.FP16)).passed


def test_cudnn_ranks_first_for_a_masked_llama_prefill_and_decode(hopper_cudnn):
    """The pointer forward with a mask ran 143 and 20 us where cuDNN with the bias ran 45 and 14
    (H200, Llama 4x16 heads over 4, d=128, 512 keys: results/h200/attention_masked_before.txt)."""
    registry = Registry.from_rule_set("attention", "default", SM90)
    d = Dispatcher(registry, SM90)
    for seqlen_q in (512, 1):
        p = problem(batch=4, heads_q=16, heads_kv=4, seqlen_q=seqlen_q, variant=MASKED)
        assert d.select(p).config.family is Family.SDPA_CUDNN, seqlen_q


def test_cudnn_backward_refuses_deterministic_and_the_other_direction():
    back = problem(direction=Direction.BACKWARD)
    assert "deterministic" in supports(CUDNN_BWD, replace(back, deterministic=True))
    assert "a bwd kernel, the problem is fwd" in supports(CUDNN_BWD, problem())
    assert "a fwd kernel, the problem is bwd" in supports(CUDNN_FWD, back)


def test_cudnn_head_dims_up_to_256_where_the_runtime_takes_them(hopper_cudnn):
    for d in (192, 256):
        p = problem(head_dim_qk=d, head_dim_v=d, mask=MaskKind.CAUSAL_TOP_LEFT, variant=BAND)
        assert supports(CUDNN_FWD, replace(p, needs_lse=True)) is None
        assert supports(CUDNN_BWD, replace(p, direction=Direction.BACKWARD)) is None


def test_cudnn_head_dim_limit_without_a_gpu_is_128():
    if torch.cuda.is_available():
        pytest.skip("the runtime's own limit applies on a GPU")
    vendor.cudnn_max_head_dim.cache_clear()
    assert vendor.cudnn_max_head_dim() == 128


def test_flash_keeps_its_refusals():
    assert supports(FLASH_FWD, problem(heads_kv=2)) is None  # inference GQA through enable_gqa
    assert supports(FLASH_FWD, problem(needs_lse=True)) is None
    assert "equal head counts" in supports(FLASH_FWD, problem(heads_kv=2, needs_lse=True))
    assert "flash backward" in supports(FLASH_BWD, problem(direction=Direction.BACKWARD))


def test_validate_lets_the_cudnn_backward_in_on_sm90_only():
    assert validate(CUDNN_BWD, SM90).ok
    assert AttentionRule.FAMILY_ARCH in validate(CUDNN_BWD, SM80).broken_rules()
    assert AttentionRule.FAMILY_ARCH in validate(CUDNN_BWD, INTERP).broken_rules()
    assert AttentionRule.DTYPE_ARCH in validate(replace(CUDNN_BWD, dtype=DType.FP32), SM90).broken_rules()
    registry = Registry.from_rule_set("attention", "tests", SM90)
    assert {(s.family, s.name.split("_")[1]) for s in registry if s.family.startswith("sdpa")} == {
        ("sdpa-cudnn", "fwd"), ("sdpa-cudnn", "bwd"), ("sdpa-flash", "fwd"), ("sdpa-flash", "bwd")}


# -- the LSE contract and the plan's wiring ----------------------------------------------------
def test_vendor_units_name_the_functions_arguments():
    for direction, function in ((Direction.FORWARD, vendor.forward), (Direction.BACKWARD, vendor.backward)):
        unit = kernel_units(VendorConfig(Family.SDPA_CUDNN, DType.BF16, direction))[0]
        assert [name for name, _ in unit.signature] == list(inspect.signature(function).parameters)


def test_cudnn_lse_is_handed_back_as_a_view_in_our_layout():
    b, h, s = 2, 4, 24
    cudnn_lse = torch.randn(b, h, s, 1)  # cuDNN's (B, H, S, 1), strides (H*S, S, 1, 1)
    q = torch.empty(b, s, h, 32).transpose(1, 2)  # BSHD storage: the LSE does not follow it
    ours = vendor._lse_bhs(cudnn_lse, q)
    assert ours.shape == (b, h, s) and ours.dtype == torch.float32 and ours.stride(-1) == 1
    assert ours.data_ptr() == cudnn_lse.data_ptr()  # a view, no copy
    assert ours.unsqueeze(-1).stride() == cudnn_lse.stride()  # and back to cuDNN's, as the backward reads it


def _stand_in_backward(calls, gqa_native):
    """What cuDNN's backward computes, in float64, from the LSE it is given (P = exp(S - LSE))."""

    def run(grad_out, q, k, v, out, lse4, scale, causal):
        b, hq, sq, _ = q.shape
        assert lse4.shape == (b, hq, sq, 1) and lse4.dtype == torch.float32, lse4.shape
        if not gqa_native:
            assert k.shape[1] == hq, "K/V must come expanded to the query heads"
        calls.append({"kv_heads": k.shape[1], "lse_stride": lse4.stride()})
        f = [t.detach().double() for t in (grad_out, q, k, v, out)]
        do, q64, k64, v64, o64 = f
        group = hq // k.shape[1]
        ke, ve = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
        scores = q64 @ ke.transpose(-1, -2) * scale
        if causal:
            skv = k.shape[2]
            scores = scores.masked_fill(torch.ones(sq, skv, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        p = torch.exp(scores - lse4.double())
        dv = p.transpose(-1, -2) @ do
        ds = p * (do @ ve.transpose(-1, -2) - (do * o64).sum(-1, keepdim=True))
        dq, dk = ds @ ke * scale, ds.transpose(-1, -2) @ q64 * scale
        if group > 1:
            dk = dk.reshape(b, k.shape[1], group, *dk.shape[2:]).sum(2)
            dv = dv.reshape(b, k.shape[1], group, *dv.shape[2:]).sum(2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    return run


def _inputs(heads_kv, bshd, d=32, s=40, dtype=torch.float16):
    b, hq = 2, 4
    if bshd:
        q, k, v = (randn(b, s, h, d, dtype=dtype).transpose(1, 2) for h in (hq, heads_kv, heads_kv))
    else:
        q, k, v = randn(b, hq, s, d, dtype=dtype), randn(b, heads_kv, s, d, dtype=dtype), \
            randn(b, heads_kv, s, d, dtype=dtype)
    return q, k, v


def _reference(q, k, v, causal, grad):
    leaves = [t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v)]
    ops = check_operands(q.detach(), k.detach(), v.detach(), options=AttentionOptions(causal=parse_causal(causal)))
    out, lse = reference_from(*leaves, ops.problem, scale=ops.scale)
    out.backward(grad.to("cpu", torch.float64))
    return out, lse, [t.grad for t in leaves]


@pytest.mark.parametrize("gqa_native", [True, False], ids=["gqa-native", "gqa-expanded"])
@pytest.mark.parametrize("heads_kv, bshd", [(4, False), (2, False), (1, True)], ids=["mha", "gqa", "mqa-bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_triton_forward_feeds_the_cudnn_backward(monkeypatch, gqa_native, heads_kv, bshd, causal):
    calls = []
    monkeypatch.setattr(vendor, "CUDNN_BACKWARD_TAKES_GQA", gqa_native)
    monkeypatch.setattr(vendor, "cudnn_backward_op", _stand_in_backward(calls, gqa_native))
    q, k, v = _inputs(heads_kv, bshd)
    out, lse = tiledispatch.attention(q, k, v, causal=causal, return_lse=True, dispatcher=dispatcher("fwd", "bwd"))
    grad = randn(*out.shape, dtype=out.dtype)
    options = AttentionOptions(causal=parse_causal(causal))
    ops = check_operands(q, k, v, options=options, direction=Direction.BACKWARD, out=out, lse=lse, grad_out=grad)
    config = VendorConfig(Family.SDPA_CUDNN, DType.FP16, Direction.BACKWARD)
    assert supports(config, ops.problem) is None
    grads = execute(plan(config, ops), {"vendor": PythonLauncher(kernel_units(config)[0])}, None)
    assert calls and calls[0]["kv_heads"] == (heads_kv if gqa_native else 4)
    assert calls[0]["lse_stride"][:3] == lse.stride()  # our LSE, viewed as (B, H, S, 1), never copied
    _, _, ref_grads = _reference(q, k, v, causal, grad)
    for name, mine, ref in zip("qkv", (grads.dq, grads.dk, grads.dv), ref_grads):
        assert mine.shape == ref.shape, name
        result = compare_tensors(mine, ref, tolerance(DType.FP16, gradient=True))
        assert result.passed, (f"d{name}", result)


@pytest.mark.parametrize("heads_kv, bshd", [(4, False), (2, True)], ids=["mha", "gqa-bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_forward_feeds_the_triton_backward(monkeypatch, heads_kv, bshd, causal):
    """A stand-in cuDNN forward hands back (B, H, S, 1) statistics; the Triton backward reads our view of them."""
    q, k, v = _inputs(heads_kv, bshd)
    options = AttentionOptions(causal=parse_causal(causal), needs_lse=True)
    fwd_ops = check_operands(q, k, v, options=options)

    def stand_in_forward(q_, k_, v_, scale, causal_, keep_lse=True, bias=None):
        out, lse = reference_from(*(t.to("cpu", torch.float64) for t in (q_, k_, v_)), fwd_ops.problem, scale=scale)
        return out.to(q_.device, q_.dtype), lse.to(q_.device, torch.float32).unsqueeze(-1)  # cuDNN's shapes

    monkeypatch.setattr(vendor, "cudnn_forward_op", stand_in_forward)
    config = VendorConfig(Family.SDPA_CUDNN, DType.FP16, Direction.FORWARD)
    assert supports(config, fwd_ops.problem) is None
    result = execute(plan(config, fwd_ops), {"vendor": PythonLauncher(kernel_units(config)[0])}, None)
    assert isinstance(result, AttentionResult)
    b, hq, s = q.shape[:3]
    assert result.lse.shape == (b, hq, s) and result.lse.dtype == torch.float32 and result.lse.stride(-1) == 1
    grad = randn(*result.out.shape, dtype=q.dtype)
    ops = check_operands(q, k, v, options=options, direction=Direction.BACKWARD, out=result.out, lse=result.lse,
                         grad_out=grad)
    grads = dispatcher("fwd", "bwd").run(ops)
    _, ref_lse, ref_grads = _reference(q, k, v, causal, grad)
    assert compare_tensors(result.lse, ref_lse, 1e-5).passed
    for name, mine, ref in zip("qkv", (grads.dq, grads.dk, grads.dv), ref_grads):
        result_ = compare_tensors(mine, ref, tolerance(DType.FP16, gradient=True))
        assert result_.passed, (f"d{name}", result_)


def test_the_flash_backward_is_never_called():
    with pytest.raises(tiledispatch.UnsupportedError, match="sdpa-flash has no backward"):
        vendor.backward(Family.SDPA_FLASH, None, *(torch.empty(1, 1, 1, 1),) * 6, 1.0, False)


# -- ranking --------------------------------------------------------------------------------
def test_vendor_scores_follow_the_measured_ratios():
    p = problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_kv=4096)
    cudnn, flash = rule_score(CUDNN_FWD, p, SM90).value, rule_score(FLASH_FWD, p, SM90).value
    assert cudnn / flash == pytest.approx(660 / 338, rel=0.05)  # H200: 660 and 338 TFLOP/s
    back = rule_score(CUDNN_BWD, replace(p, direction=Direction.BACKWARD), SM90).value
    assert back / cudnn == pytest.approx(495 / 660, rel=0.05)
    causal = rule_score(CUDNN_FWD, replace(p, mask=MaskKind.CAUSAL_TOP_LEFT, variant=BAND), SM90)
    assert causal.value < cudnn and causal.terms["mask"] < 1
    assert vendor_head_dim_factor(Family.SDPA_CUDNN, Direction.FORWARD, 64) == pytest.approx(0.70)
    assert vendor_head_dim_factor(Family.SDPA_CUDNN, Direction.FORWARD, 80) == pytest.approx(80 / 128)
    assert vendor_head_dim_factor(Family.SDPA_CUDNN, Direction.BACKWARD, 32) < \
        vendor_head_dim_factor(Family.SDPA_CUDNN, Direction.BACKWARD, 64)


def _suite_problems():
    for case in json.loads(SUITE.read_text())["cases"]:
        if case["mode"] != "prefill":
            continue
        mask, window = (MaskKind.CAUSAL_TOP_LEFT if case.get("causal") else MaskKind.NONE), Window()
        if "window" in case:
            mask, window = MaskKind.SLIDING_WINDOW, Window(case["window"][0], 0)
        p = AttentionProblem(case["B"], case["Hq"], case["Hkv"], case["Sq"], case["Skv"], case["D"], case["D"],
                             DType.BF16, mask=mask, window=window,
                             variant=AttentionVariant(band=mask is not MaskKind.NONE, softcap="softcap" in case))
        yield case["name"], {"fwd": p, "fwd-lse": replace(p, needs_lse=True),
                             "bwd": replace(p, direction=Direction.BACKWARD)}


def test_cudnn_is_the_vendor_pick_for_every_suite_case_it_takes(hopper_cudnn):
    """Among the vendor candidates on sm_90 (the Triton side is ranked by its own model)."""
    vendors = Dispatcher(Registry.from_rule_set("attention", "default", SM90).filter(
        lambda s: s.family.startswith("sdpa")), SM90)
    taken = 0
    for name, problems in _suite_problems():
        for kind, p in problems.items():
            explanation = vendors.explain(p)
            if supports(CUDNN_FWD if kind != "bwd" else CUDNN_BWD, p) is None:
                taken += 1
                assert explanation.selected.family == "sdpa-cudnn", (name, kind, explanation.to_dict(limit=3))
            else:
                assert "window" in name or "softcap" in name, (name, kind)
    assert taken == 3 * 7  # every prefill case but the window and soft-cap ones, in all three problems


def test_explain_shows_the_cudnn_backward_and_its_refusals():
    d = Dispatcher(Registry.from_rule_set("attention", "tests", SM90), SM90)
    doc = d.explain(problem(direction=Direction.BACKWARD)).to_dict(limit=None)
    assert any(c["kernel"].startswith("attention_bwd_bf16_sdpa-cudnn") for c in doc["ranking"])
    doc = d.explain(problem(direction=Direction.BACKWARD, deterministic=True)).to_dict(limit=None)
    refused = {c["kernel"]: c["refused"] for c in doc["refused"]}
    assert "deterministic" in next(r for n, r in refused.items() if n.startswith("attention_bwd_bf16_sdpa-cudnn"))

