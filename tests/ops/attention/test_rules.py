"""Rule sets, validation, auto-correction, `supports`, ranking and the problem's FLOPs."""

from collections import Counter
from dataclasses import replace

import pytest

from tiledispatch import arch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.dtypes import DType
from tiledispatch.core.errors import InvalidConfigError
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.registry import Registry
from tiledispatch.ops.attention import (
    AttentionConfig,
    AttentionProblem,
    AttentionRule,
    AttentionVariant,
    Direction,
    Family,
    MaskKind,
    UserMask,
    VendorConfig,
    Window,
    auto_correct,
    supports,
    validate,
    vendor,
)
from tiledispatch.ops.attention.plan import kernel_units
from tiledispatch.ops.attention.ranking import computed_pairs, rule_score
from tiledispatch.ops.attention.rulesets import RULE_SETS

SM80, SM90, INTERP = arch.load("sm_80"), arch.load("sm_90"), arch.load("interpreter")


def names(rule_set):
    return [c.name for c in RULE_SETS[rule_set]()]


def test_rule_sets_nest_and_register():
    assert get_op(OpKind.ATTENTION).rule_sets is RULE_SETS and set(RULE_SETS) == set(RuleSet)
    tiny, tests, default, full = (set(names(r)) for r in RuleSet)
    assert tiny < tests < default < full


@pytest.mark.parametrize("rule_set", list(RuleSet), ids=lambda r: r.value)
def test_no_two_configs_share_a_name(rule_set):
    counts = Counter(names(rule_set))
    assert [n for n, c in counts.items() if c > 1] == []


def test_every_name_spells_its_fields():
    config = AttentionConfig(Family.FWD, DType.BF16, 192, 128, 128, 64, 8, 3)
    assert config.name == "attention_fwd_bf16_d192x128_fwd_128x64_w8_s3"
    assert VendorConfig(Family.SDPA_CUDNN, DType.FP16, Direction.FORWARD).name == "attention_fwd_fp16_sdpa-cudnn"


def test_registries_per_arch():
    interp = Registry.from_rule_set("attention", "default", INTERP)
    sm90 = Registry.from_rule_set("attention", "default", SM90)
    assert {s.dtype for s in interp} == {"fp16", "fp32", "fp8e4m3"}  # no bf16 tl.dot in the interpreter
    assert {s.family for s in sm90 if s.dtype == "fp8e4m3"} == {"fwd-tma"}  # fp8: the TMA forward only
    assert not any(s.dtype == "fp8e4m3" for s in Registry.from_rule_set("attention", "default", SM80))
    assert not any(s.family.startswith("sdpa") for s in interp)
    assert {"bf16", "fp16"} <= {s.dtype for s in sm90}
    families = {s.family for s in sm90}
    assert families == {"fwd", "fwd-tma", "fwd-ws", "bwd", "bwd-atomic", "bwd-ws", "sdpa-flash", "sdpa-cudnn"}
    assert not any(s.family.startswith("fwd-tma") for s in Registry.from_rule_set("attention", "default", SM80))
    assert any(s.family == "sdpa-cudnn" and s.name.startswith("attention_bwd") for s in sm90)  # cuDNN's backward
    assert len(Registry.from_rule_set("attention", "default", SM80)) > 0


def test_atomic_backward_counts_its_staged_dq_block():
    """bwd-atomic's dK/dV kernel also stages the fp32 dQ block it adds: at d=256 and 64x64 over 8
    warps that took it to 257 KiB on sm_90 (compiled), past the 227 KiB a block may have, while
    its deterministic twin compiled to 193 KiB and ran."""
    twin = AttentionConfig(Family.BWD, DType.BF16, 256, 256, 64, 64, 8, 2)
    atomic = replace(twin, family=Family.BWD_ATOMIC)
    assert validate(twin, SM90).ok
    assert AttentionRule.SHARED_MEMORY in validate(atomic, SM90).broken_rules()


def test_validation_names_the_rule():
    good = AttentionConfig(Family.FWD, DType.FP16, 128, 128, 128, 64, 8, 3)
    assert validate(good, SM90).ok
    cases = {
        replace(good, block_m=96): AttentionRule.TILE_POWER_OF_TWO,
        replace(good, block_n=8): AttentionRule.TENSOR_CORE_MINIMUM,
        replace(good, num_warps=3): AttentionRule.WARPS,
        replace(good, num_stages=9): AttentionRule.STAGES,
        replace(good, head_dim_qk=256, head_dim_v=256, block_m=256, block_n=128, num_stages=4):
            AttentionRule.SHARED_MEMORY,
        replace(good, block_m=256, block_n=256, num_warps=1): AttentionRule.REGISTER_BUDGET,
        replace(good, head_dim_qk=72): AttentionRule.HEAD_DIM,
        replace(good, family=Family.SDPA_FLASH): AttentionRule.FAMILY_DIRECTION,
    }
    for config, rule in cases.items():
        assert rule in validate(config, SM90).broken_rules(), (config, validate(config, SM90))
    assert AttentionRule.DTYPE_ARCH in validate(replace(good, dtype=DType.BF16), INTERP).broken_rules()
    vendor = VendorConfig(Family.SDPA_FLASH, DType.FP16, Direction.FORWARD)
    assert AttentionRule.FAMILY_ARCH in validate(vendor, INTERP).broken_rules()
    assert AttentionRule.FAMILY_ARCH in validate(replace(vendor, family=Family.SDPA_CUDNN), SM80).broken_rules()


def test_auto_correct_moves_the_fewest_powers_of_two():
    bad = AttentionConfig(Family.FWD, DType.FP16, 256, 256, 256, 128, 8, 5)
    fixed, corrections = auto_correct(bad, SM90)
    assert validate(fixed, SM90).ok and corrections
    assert all("shared-memory" in c.rules or "register-budget" in c.rules for c in corrections)
    assert auto_correct(fixed, SM90) == (fixed, ())
    with pytest.raises(InvalidConfigError, match="dtype-arch"):
        auto_correct(replace(bad, dtype=DType.BF16), INTERP)


def problem(**kw):
    base = dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=256, seqlen_kv=256, head_dim_qk=128, head_dim_v=128)
    return AttentionProblem(**{**base, **kw})


def test_supports_says_why():
    fwd = AttentionConfig(Family.FWD, DType.FP16, 128, 128, 64, 64)
    assert supports(fwd, problem()) is None
    assert "bwd" in supports(fwd, problem(direction=Direction.BACKWARD))
    assert "bf16" in supports(fwd, problem(dtype=DType.BF16))
    assert "64/64" in supports(fwd, problem(head_dim_qk=64, head_dim_v=64)).replace("128/128", "")
    atomic = AttentionConfig(Family.BWD_ATOMIC, DType.FP16, 128, 128, 64, 64)
    assert "deterministic" in supports(atomic, problem(direction=Direction.BACKWARD, deterministic=True))
    flash = VendorConfig(Family.SDPA_FLASH, DType.FP16, Direction.FORWARD)
    assert supports(flash, problem()) is None  # GQA inference through enable_gqa
    assert "GQA" in supports(flash, problem(needs_lse=True))
    assert "soft-cap" in supports(flash, problem(heads_kv=8, variant=AttentionVariant(softcap=True)))
    assert "window" in supports(flash, problem(heads_kv=8, mask=MaskKind.SLIDING_WINDOW, window=Window(4, 0),
                                               variant=AttentionVariant(band=True)))
    assert "seqlen_q == seqlen_kv" in supports(flash, problem(seqlen_q=100, mask=MaskKind.CAUSAL_TOP_LEFT,
                                                              variant=AttentionVariant(band=True)))
    cudnn = VendorConfig(Family.SDPA_CUDNN, DType.FP16, Direction.FORWARD)
    d256 = problem(heads_kv=8, head_dim_qk=256, head_dim_v=256)
    if vendor.cudnn_max_head_dim() < 256:  # the runtime's cuDNN decides (9.10+ on sm_90 takes 256)
        assert "up to 128" in supports(cudnn, d256)
    else:
        assert supports(cudnn, d256) is None


def test_flops_count_what_the_mask_keeps():
    full = problem(batch=1, heads_q=1, heads_kv=1, seqlen_q=4, seqlen_kv=6, head_dim_qk=32, head_dim_v=64)
    assert full.visible_pairs() == 24 and full.forward_flops() == 2 * 96 * 24
    top_left = replace(full, mask=MaskKind.CAUSAL_TOP_LEFT, variant=AttentionVariant(band=True))
    assert top_left.visible_pairs() == 1 + 2 + 3 + 4
    bottom_right = replace(top_left, mask=MaskKind.CAUSAL_BOTTOM_RIGHT)
    assert bottom_right.visible_pairs() == 3 + 4 + 5 + 6
    window = replace(top_left, mask=MaskKind.SLIDING_WINDOW, window=Window(1, 0))
    assert window.visible_pairs() == 2 + 2 + 2 + 2
    backward = replace(full, direction=Direction.BACKWARD)
    assert backward.flops() == 2.5 * full.flops() and full.training_flops() == 3.5 * full.flops()
    varlen = replace(full, batch=2, seqlens=((4, 6), (2, 3)), layout=full.layout.THD,
                     variant=AttentionVariant(varlen=True))
    assert varlen.visible_pairs() == 24 + 6


def test_ranking_prefers_sensible_tiles_and_skips_the_masked_blocks():
    p = problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_kv=4096)
    big = AttentionConfig(Family.FWD, DType.FP16, 128, 128, 128, 64, 8, 3)
    tiny = AttentionConfig(Family.FWD, DType.FP16, 128, 128, 16, 16, 2, 1)
    assert rule_score(big, p, SM90).value > rule_score(tiny, p, SM90).value
    causal = replace(p, mask=MaskKind.CAUSAL_TOP_LEFT, variant=AttentionVariant(band=True))
    assert computed_pairs(causal, 128, 64) < 0.6 * computed_pairs(p, 128, 64)
    assert 0 < rule_score(big, causal, SM90).terms["band"] <= 1


def test_explain_lists_refusals_and_scores():
    d = Dispatcher(Registry.from_rule_set("attention", "tests", SM90), SM90)
    doc = d.explain(problem(dtype=DType.BF16)).to_dict()
    assert doc["selected"] and doc["accepted"] > 0 and doc["refused_count"] > 0
    assert all("score" in c for c in doc["ranking"]) and all(c["refused"] for c in doc["refused"])


def test_kernel_units_follow_the_variant():
    config = AttentionConfig(Family.BWD_ATOMIC, DType.FP16, 64, 64, 32, 32)
    stages = [u.stage for u in kernel_units(config, AttentionVariant())]
    assert stages == ["preprocess", "dkdv", "convert"]
    assert [u.stage for u in kernel_units(replace(config, family=Family.BWD))] == ["preprocess", "dkdv", "dq"]
    plain = dict(kernel_units(config, AttentionVariant())[1].constexprs)
    causal = dict(kernel_units(config, AttentionVariant(band=True, bias_grad=True))[1].constexprs)
    assert (plain["HAS_BAND"], causal["HAS_BAND"], causal["HAS_DBIAS"], plain["ATOMIC_DQ"]) == (False, True, True, True)
    unaligned = kernel_units(config, AttentionVariant(aligned=False))[1]
    assert unaligned.divisible_by_16 == () and "Q" in kernel_units(config, AttentionVariant())[1].divisible_by_16
    assert AttentionVariant(band=True).tag != AttentionVariant().tag


def test_tma_families_name_the_rule_they_break():
    good = AttentionConfig(Family.FWD_TMA, DType.BF16, 128, 128, 128, 128, 8, 2)
    assert validate(good, SM90).ok
    cases = {
        (good, SM80): AttentionRule.FAMILY_ARCH,
        (replace(good, dtype=DType.FP32), SM90): AttentionRule.FAMILY_DTYPE,
        (replace(good, head_dim_qk=96, head_dim_v=96), SM90): AttentionRule.FAMILY_HEAD_DIM,
        (replace(good, num_stages=3), SM90): AttentionRule.SHARED_MEMORY,  # 3 x 64 KiB of K/V + Q
    }
    for (config, arch_info), rule in cases.items():
        assert rule in validate(config, arch_info).broken_rules(), (config, validate(config, arch_info))
    with pytest.raises(InvalidConfigError, match="family-dtype"):
        auto_correct(replace(good, dtype=DType.FP32), SM90)


def test_tma_supports_the_common_case_only():
    tma = AttentionConfig(Family.FWD_TMA, DType.FP16, 128, 128, 128, 64, 8, 3)
    plain = problem(seqlen_kv=512)
    causal = replace(plain, mask=MaskKind.CAUSAL_TOP_LEFT, variant=AttentionVariant(band=True))
    assert supports(tma, plain) is None and supports(tma, replace(plain, seqlen_kv=500)) is None
    assert supports(tma, replace(causal, variant=AttentionVariant(band=True, softcap=True, sinks=True))) is None
    assert "bias" in supports(tma, replace(plain, variant=AttentionVariant(bias=True)))
    assert "dropout" in supports(tma, replace(plain, variant=AttentionVariant(dropout=True)))
    assert "aligned" in supports(tma, replace(plain, variant=AttentionVariant(aligned=False)))


def test_ranking_at_d128_follows_the_interleaved_h200_sweep():
    """Long sequences at d=128 (benchmarks/results/h200/attention_sweep.csv, kernels timed in
    turns): fwd-tma 64x64 w4 s3 ran 528 TFLOP/s, the best tile; in the pointer-load family
    64x64 w4 s3 ran 419 and 128x64 w8 s3 447 (64x128 w4 s2 285, 128x64 w4 265: it spills).
    And the TMA kernel beats the pointer-load one, with and without a band."""
    p = problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_kv=4096, dtype=DType.BF16)
    registry = Registry.from_rule_set("attention", "default", SM90).filter(
        lambda s: s.family in ("fwd", "fwd-tma", "bwd", "bwd-atomic"))  # fwd-ws: the test after this one
    ranked = Dispatcher(registry, SM90).explain(p).ranked
    best = ranked[0].spec.config
    assert (best.family, best.block_m, best.block_n, best.num_warps, best.num_stages) == (Family.FWD_TMA, 64, 64, 4, 3)
    fwd = [c.spec.config for c in ranked if c.spec.family == "fwd"]
    assert (fwd[0].block_m, fwd[0].block_n, fwd[0].num_warps) in ((64, 64, 4), (128, 64, 8))
    causal = replace(p, mask=MaskKind.CAUSAL_TOP_LEFT, variant=AttentionVariant(band=True))
    assert Dispatcher(registry, SM90).explain(causal).ranked[0].spec.family == "fwd-tma"
    small = problem(batch=16, heads_q=16, heads_kv=16, seqlen_q=2048, seqlen_kv=2048, head_dim_qk=64,
                    head_dim_v=64, dtype=DType.BF16)
    fwd64 = [c.spec.config for c in Dispatcher(registry, SM90).explain(small).ranked if c.spec.family == "fwd"]
    assert fwd64[0].num_warps == 4  # measured: 128x64 over 4 warps 339 TFLOP/s, over 8 280, at d=64


def test_backward_ranking_owns_128_rows():
    p = problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_kv=4096, dtype=DType.BF16,
                direction=Direction.BACKWARD)
    registry = Registry.from_rule_set("attention", "default", SM90).filter(lambda s: s.family == "bwd")
    best = Dispatcher(registry, SM90).explain(p).ranked[0].spec.config
    assert best.block_n == 128 and best.block_m in (32, 64)


WS = AttentionConfig(Family.FWD_WS, DType.BF16, 128, 128, 128, 128, 8, 2)


def test_the_warp_specialised_forward_is_hopper_only_and_names_its_rules():
    assert validate(WS, SM90).ok and validate(replace(WS, head_dim_qk=64, head_dim_v=64, block_n=64), SM90).ok
    cases = {
        (WS, SM80): AttentionRule.FAMILY_ARCH,
        (WS, arch.load("sm_100")): AttentionRule.FAMILY_ARCH,  # tcgen05, not warpgroup MMA
        (WS, INTERP): AttentionRule.FAMILY_ARCH,  # Triton's interpreter cannot run Gluon
        (replace(WS, dtype=DType.FP8E4M3), SM90): AttentionRule.FAMILY_DTYPE,
        (replace(WS, head_dim_qk=96, head_dim_v=96), SM90): AttentionRule.FAMILY_HEAD_DIM,
        (replace(WS, head_dim_qk=256, head_dim_v=256), SM90): AttentionRule.SHARED_MEMORY,  # 128 x 64 fits
        (replace(WS, head_dim_v=64), SM90): AttentionRule.FAMILY_HEAD_DIM,
        (replace(WS, num_warps=4), SM90): AttentionRule.WARPGROUP_ROWS,  # 128 rows over one warpgroup
        (replace(WS, block_m=64, num_warps=4), SM90): AttentionRule.WARPGROUP_ROWS,  # correct, but slow
        (replace(WS, num_stages=1), SM90): AttentionRule.STAGES,  # the loader could not run ahead
        (replace(WS, num_stages=4), SM90): AttentionRule.SHARED_MEMORY,  # 32 + 4 x 64 KiB of Q, K and V
    }
    for (config, arch_info), rule in cases.items():
        assert rule in validate(config, arch_info).broken_rules(), (config.name, arch_info.name)
    default = {s.config.name for s in Registry.from_rule_set("attention", "default", SM90) if s.family == "fwd-ws"}
    assert WS.name in default
    for other in (SM80, INTERP, arch.load("sm_100")):
        assert "fwd-ws" not in {s.family for s in Registry.from_rule_set("attention", "full", other)}


def test_the_warp_specialised_forward_takes_bands_soft_cap_sinks_and_gqa():
    plain = problem(seqlen_q=1000, seqlen_kv=1100, heads_q=8, heads_kv=2, dtype=DType.BF16)
    assert supports(WS, plain) is None
    causal = replace(plain, mask=MaskKind.CAUSAL_TOP_LEFT,
                     variant=AttentionVariant(band=True, softcap=True, sinks=True))
    assert supports(WS, causal) is None
    for feature in ("bias", "dropout", "alibi"):
        reason = supports(WS, replace(plain, variant=AttentionVariant(**{feature: True})))
        assert reason is not None and "fwd-ws" in reason, feature
    assert "fwd-ws" in supports(WS, replace(plain, variant=AttentionVariant(user_mask=UserMask.BOOLEAN)))
    assert "aligned" in supports(WS, replace(plain, variant=AttentionVariant(aligned=False)))


def test_the_warp_specialised_unit_is_a_gluon_kernel_with_a_register_cap():
    from tiledispatch.core.op import UnitKind

    (unit,) = kernel_units(WS, AttentionVariant(band=True))
    assert unit.kind is UnitKind.GLUON and unit.function == "attention_fwd_ws"
    assert unit.max_registers == 168  # 12 warps (8 MMA, the loader's warpgroup) share 64 K registers
    kinds = dict(unit.signature)
    assert kinds["q_desc"].startswith("tensordesc<bf16[1, 1, 64, 128],NVMMASharedLayout(")  # a warpgroup's rows
    assert unit.num_warps == 4  # the first MMA warpgroup; warp_specialize adds the others
    assert dict(unit.constexprs)["HAS_BAND"] is True and dict(unit.constexprs)["STAGES"] == 2


def test_the_rules_follow_the_forward_a_b_on_the_h100(monkeypatch):
    """Timed in turns (benchmarks/studies/attention_forward_ab.py): fwd-ws 128x128 ran 1.26-1.47x fwd-tma's
    best at d=128 and 0.88-0.95x at d=64; against cuDNN 1.01-1.10x at S4096, 1.00-1.09x causal,
    1.03-1.12x on GQA causal S8192 and 0.84-0.89x at S1024; at d=256 128x64 1.035-1.09x."""
    monkeypatch.setattr(vendor, "cudnn_max_head_dim", lambda: 256)  # cuDNN 9.10+ on sm_90, as on the H100
    registry = Registry.from_rule_set("attention", "default", SM90)
    triton = Dispatcher(registry.filter(lambda s: not s.family.startswith("sdpa")), SM90)
    everything = Dispatcher(registry, SM90)
    causal = {"mask": MaskKind.CAUSAL_TOP_LEFT, "variant": AttentionVariant(band=True)}
    s4096 = problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_kv=4096, dtype=DType.BF16)
    s1024 = replace(s4096, batch=16, seqlen_q=1024, seqlen_kv=1024)
    gqa = problem(batch=4, heads_q=32, heads_kv=8, seqlen_q=8192, seqlen_kv=8192, dtype=DType.BF16, **causal)
    d64 = replace(s4096, batch=16, seqlen_q=2048, seqlen_kv=2048, head_dim_qk=64, head_dim_v=64)
    for p in (s4096, s1024, gqa, replace(s4096, **causal)):
        assert triton.select(p).family == "fwd-ws", p.describe()
    assert triton.select(d64).family == "fwd-tma"
    d256 = problem(batch=4, heads_q=8, heads_kv=8, seqlen_q=2048, seqlen_kv=2048, head_dim_qk=256, head_dim_v=256,
                   dtype=DType.BF16)
    assert triton.select(d256).name.startswith("attention_fwd_bf16_d256x256_fwd-ws_128x64_w8_s2")  # 1.26x fwd-tma
    assert everything.select(s1024).family == "sdpa-cudnn"
    for p in (s4096, gqa, replace(s4096, **causal), d256, replace(d256, needs_lse=True)):
        assert everything.select(p).family == "fwd-ws", p.describe()
    assert everything.select(d64).family == "sdpa-cudnn"


BWD_WS = AttentionConfig(Family.BWD_WS, DType.BF16, 128, 128, 32, 128, 8, 3)


def test_the_warp_specialised_backward_names_its_rules_and_takes_the_common_case():
    assert validate(BWD_WS, SM90).ok and validate(replace(BWD_WS, head_dim_qk=64, head_dim_v=64, block_m=64), SM90).ok
    wide = replace(BWD_WS, head_dim_qk=256, head_dim_v=256, block_n=64, num_stages=2)
    assert validate(wide, SM90).ok and [u.function for u in kernel_units(wide)][1:] == [
        "attention_bwd_dkdv_ws_wide", "attention_bwd_dq_ws"]
    cases = {
        (BWD_WS, SM80): AttentionRule.FAMILY_ARCH,
        (replace(BWD_WS, block_m=64), SM90): AttentionRule.WARPGROUP_ROWS,  # spills at d=128 (sm_90 compile)
        (replace(BWD_WS, block_n=64, num_warps=4), SM90): AttentionRule.WARPGROUP_ROWS,
        (replace(BWD_WS, head_dim_qk=192, head_dim_v=192), SM90): AttentionRule.FAMILY_HEAD_DIM,
        (replace(BWD_WS, head_dim_qk=256, head_dim_v=256), SM90): AttentionRule.WARPGROUP_ROWS,  # 64 keys there
        (replace(BWD_WS, head_dim_qk=256, head_dim_v=256, block_m=64, block_n=64), SM90): AttentionRule.WARPGROUP_ROWS,
        (replace(BWD_WS, num_stages=1), SM90): AttentionRule.STAGES,
    }
    for (config, arch_info), rule in cases.items():
        assert rule in validate(config, arch_info).broken_rules(), (config.name, arch_info.name)
    plain = problem(seqlen_q=1000, seqlen_kv=1100, heads_q=8, heads_kv=2, dtype=DType.BF16,
                    direction=Direction.BACKWARD)
    assert supports(BWD_WS, plain) is None
    assert supports(BWD_WS, replace(plain, mask=MaskKind.CAUSAL_TOP_LEFT, variant=AttentionVariant(band=True))) is None
    assert supports(BWD_WS, replace(plain, variant=AttentionVariant(softcap=True, sinks=True))) is None
    for feature in ("bias", "dropout", "alibi"):
        reason = supports(BWD_WS, replace(plain, variant=AttentionVariant(**{feature: True})))
        assert reason is not None and "the bwd family" in reason, feature
    stages = [u.stage for u in kernel_units(BWD_WS)]
    kinds = [u.kind.value for u in kernel_units(BWD_WS)]
    assert stages == ["preprocess", "dkdv", "dq"] and kinds == ["triton", "gluon", "gluon"]


def test_the_rules_take_the_warp_specialised_backward_among_triton_kernels():
    """Timed in turns on the H100: bwd-ws 32x128 w8 s3 ran 1.24-1.47x bwd's 64x128 w8 s3 at d=128
    and bwd-ws 64x128 w8 s2 1.45-1.47x at d=64; cuDNN's backward ran faster still there, so the
    dispatcher keeps it."""
    registry = Registry.from_rule_set("attention", "default", SM90)
    triton = Dispatcher(registry.filter(lambda s: not s.family.startswith("sdpa")), SM90)
    for d in (64, 128):
        p = problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_kv=4096, head_dim_qk=d, head_dim_v=d,
                    dtype=DType.BF16, direction=Direction.BACKWARD)
        tile = "64x128_w8_s2" if d == 64 else "32x128_w8_s3"  # 64-row steps spill at d=128
        assert triton.select(p).name == f"attention_bwd_bf16_d{d}x{d}_bwd-ws_{tile}_sm90"
        for causal in (False, True):
            band = replace(p, mask=MaskKind.CAUSAL_TOP_LEFT, variant=AttentionVariant(band=True)) if causal else p
            assert Dispatcher(registry, SM90).select(band).family == "sdpa-cudnn", (d, causal)
    # At d=256 the role-split bwd-ws ran 2.07x bwd's best tile, and fwd-ws with it 1.05x cuDNN's
    # forward+backward (d256_S2048): the dispatcher takes it over cuDNN's backward.
    wide = problem(batch=4, heads_q=8, heads_kv=8, seqlen_q=2048, seqlen_kv=2048, head_dim_qk=256, head_dim_v=256,
                   dtype=DType.BF16, direction=Direction.BACKWARD)
    assert Dispatcher(registry, SM90).select(wide).name == "attention_bwd_bf16_d256x256_bwd-ws_32x64_w8_s2_sm90"


def _launch_args(plan, stage, config, variant):
    """A plan stage's arguments by name (the unit's signature order)."""
    unit = next(u for u in kernel_units(config, variant) if u.stage == stage)
    launch = next(launch for launch in plan.launches if launch.stage == stage)
    return dict(zip((name for name, _ in unit.signature), launch.args))


def test_the_warp_specialised_plans_bind_their_descriptors():
    """The Gluon stages cannot run here; their plans can: each descriptor describes the tensor and
    the block its kernel was compiled for, O's and dK/dV's the plan's own outputs, and an
    expanded dO (zero strides, which TMA cannot step) a dense copy of it."""
    import torch

    from tiledispatch.ops.attention import AttentionOptions, check_operands
    from tiledispatch.ops.attention.plan import plan

    q = torch.randn(1, 4, 200, 128, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 300, 128, dtype=torch.bfloat16), torch.randn(1, 2, 300, 128, dtype=torch.bfloat16)
    options = AttentionOptions(causal=MaskKind.CAUSAL_BOTTOM_RIGHT, needs_lse=True)
    ops = check_operands(q, k, v, options=options)
    forward = plan(WS, ops)
    args = _launch_args(forward, "fwd", WS, ops.problem.variant)
    assert forward.launches[0].grid == (2, 4, 1)
    assert args["q_desc"].base is q and list(args["q_desc"].block_shape) == [1, 1, 64, 128]
    assert args["k_desc"].base is k and list(args["k_desc"].block_shape) == [1, 1, 128, 128]
    assert args["o_desc"].base is forward.output.out and args["LSE"] is forward.output.lse
    assert (args["HAS_BAND"], args["seqlen_q"], args["seqlen_kv"], args["group"]) == (True, 200, 300, 2)

    out, lse = torch.randn(1, 4, 200, 128, dtype=torch.bfloat16), torch.randn(1, 4, 200)
    grad_out = torch.randn(128, dtype=torch.bfloat16).expand(1, 4, 200, 128)  # strides (0, 0, 0, 1)
    ops = check_operands(q, k, v, options=options, direction=Direction.BACKWARD, out=out, lse=lse, grad_out=grad_out)
    backward = plan(BWD_WS, ops)
    assert [launch.stage for launch in backward.launches] == ["preprocess", "dkdv", "dq"]
    args = _launch_args(backward, "dkdv", BWD_WS, ops.problem.variant)
    assert backward.launches[1].grid == (3, 2, 1)  # 128 keys a program, one program per K/V head
    assert list(args["k_desc"].block_shape) == [1, 1, 64, 128] and list(args["q_desc"].block_shape) == [1, 1, 32, 128]
    assert args["dk_desc"].base is backward.output.dk and args["dv_desc"].base is backward.output.dv
    dense = args["do_desc"].base
    assert dense is not grad_out and dense.is_contiguous() and torch.equal(dense, grad_out)
    args = _launch_args(backward, "dq", BWD_WS, ops.problem.variant)
    assert backward.launches[2].grid == (2, 4, 1)  # 128 query rows a program, one program per query head
    assert list(args["q_desc"].block_shape) == [1, 1, 64, 128] and list(args["k_desc"].block_shape) == [1, 1, 64, 128]
    assert args["q_desc"].base is q and args["k_desc"].base is k and args["v_desc"].base is v
    assert args["dq_desc"].base is backward.output.dq and args["do_desc"].base is dense
    assert args["LSE"] is lse and args["DELTA"] is backward.output.delta

    # d = 256: 64 keys a dK/dV program, shared by the two warpgroups; dQ steps 32 keys
    wide = replace(BWD_WS, head_dim_qk=256, head_dim_v=256, block_n=64, num_stages=2)
    q, k, v = (torch.randn(1, h, n, 256, dtype=torch.bfloat16) for h, n in ((4, 200), (2, 300), (2, 300)))
    out = torch.randn(1, 4, 200, 256, dtype=torch.bfloat16)
    ops = check_operands(q, k, v, options=options, direction=Direction.BACKWARD, out=out, lse=lse,
                         grad_out=torch.randn_like(out))
    backward = plan(wide, ops)
    assert [(launch.stage, launch.grid) for launch in backward.launches] == [
        ("preprocess", backward.launches[0].grid), ("dkdv", (5, 2, 1)), ("dq", (2, 4, 1))]
    args = _launch_args(backward, "dkdv", wide, ops.problem.variant)
    assert list(args["k_desc"].block_shape) == [1, 1, 64, 256] and list(args["q_desc"].block_shape) == [1, 1, 32, 256]
    assert args["dk_desc"].base is backward.output.dk and args["dv_desc"].base is backward.output.dv
    args = _launch_args(backward, "dq", wide, ops.problem.variant)
    assert list(args["k_desc"].block_shape) == [1, 1, 32, 256] and list(args["q_desc"].block_shape) == [1, 1, 64, 256]
    assert args["dq_desc"].base is backward.output.dq


@pytest.mark.parametrize("rule_set", list(RuleSet), ids=lambda r: r.value)
def test_a_dtype_class_generates_exactly_its_configs_in_the_whole_set_s_order(rule_set):
    """The lazy registry's premise (core.registry.RuleSetSource): `within=dtype` yields the whole
    set's configs of that dtype, in the same order, and every config has one dtype."""
    from tiledispatch.ops.attention.rulesets import RULE_SETS

    whole = list(RULE_SETS[rule_set]())
    parts = {dtype: list(RULE_SETS[rule_set](within=dtype)) for dtype in DType}
    for dtype, part in parts.items():
        assert part == [c for c in whole if c.dtype is dtype]
    assert sum(map(len, parts.values())) == len(whole)
