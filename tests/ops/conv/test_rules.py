"""Conv configs: each validity rule, auto-correction, `supports`, the rule sets and the ranking."""

from __future__ import annotations

import dataclasses

import pytest

from tiledispatch import InvalidConfigError, Registry, arch
from tiledispatch.core.dtypes import DType
from tiledispatch.core.op import RuleSet
from tiledispatch.ops.conv import (
    ConvRule,
    ConvSignature,
    ConvTypes,
    DirectConfig,
    Direction,
    Family,
    ImplicitGemmConfig,
    SplitMode,
    VendorConfig,
    auto_correct,
    supports,
    validate,
)
from tiledispatch.ops.conv.problem import ConvEpilogue
from tiledispatch.ops.conv.rulesets import RULE_SETS
from tiledispatch.ops.gemm.problem import Activation

from .helpers import problem

SM90 = arch.load("sm_90")
INTERP = arch.load("interpreter")
FWD16 = ConvSignature(Direction.FORWARD, ConvTypes(DType.FP16))
BWDW16 = ConvSignature(Direction.BWD_WEIGHT, ConvTypes(DType.FP16))
GOOD = ImplicitGemmConfig(FWD16, 128, 64, 64, 8, 4, 4)


def broken(config, target=SM90) -> set:
    return set(validate(config, target).broken_rules())


@pytest.mark.parametrize("change, rule", [
    ({"block_m": 96}, ConvRule.TILE_POWER_OF_TWO),
    ({"block_k": 8}, ConvRule.TENSOR_CORE_MINIMUM),
    ({"block_m": 16, "block_n": 512, "num_warps": 16, "num_stages": 1}, ConvRule.TILE_MAXIMUM),
    ({"num_warps": 3}, ConvRule.WARPS),
    ({"num_stages": 0}, ConvRule.STAGES),
    ({"group_m": 0}, ConvRule.GROUP_M),
    ({"split_k": 2}, ConvRule.SPLIT_K),  # forward does not split
    ({"signature": BWDW16, "split_k": 65}, ConvRule.SPLIT_K),
    ({"signature": BWDW16, "split_mode": SplitMode.ATOMIC}, ConvRule.SPLIT_MODE),
    ({"groups_per_tile": 3}, ConvRule.GROUP_MERGE),
    ({"signature": BWDW16, "groups_per_tile": 4}, ConvRule.GROUP_MERGE),
    ({"block_m": 256, "block_n": 256, "block_k": 64, "num_stages": 4, "num_warps": 16}, ConvRule.SHARED_MEMORY),
    ({"block_m": 256, "block_n": 256, "num_warps": 4, "num_stages": 1, "block_k": 16}, ConvRule.REGISTER_BUDGET),
    ({"signature": ConvSignature(Direction.FORWARD, ConvTypes(DType.FP16, True))}, ConvRule.TF32),
    ({"signature": ConvSignature(Direction.BWD_DATA, ConvTypes(DType.FP16), ConvEpilogue(bias=True))},
     ConvRule.EPILOGUE_DIRECTION),
])
def test_each_rule_breaks_alone(change, rule):
    assert validate(GOOD, SM90).ok
    assert broken(dataclasses.replace(GOOD, **change)) == {rule}


def test_bf16_and_the_vendor_on_the_interpreter():
    bf16 = dataclasses.replace(GOOD, signature=ConvSignature(Direction.FORWARD, ConvTypes(DType.BF16)))
    assert validate(bf16, SM90).ok and broken(bf16, INTERP) == {ConvRule.DTYPE_ARCH}
    vendor = VendorConfig(FWD16)
    assert validate(vendor, SM90).ok and broken(vendor, INTERP) == {ConvRule.FAMILY_ARCH}


def test_direct_rules():
    good = DirectConfig(FWD16, 32, 64, 4)
    assert validate(good, SM90).ok
    assert broken(dataclasses.replace(good, block_c=48)) == {ConvRule.TILE_POWER_OF_TWO}
    assert broken(dataclasses.replace(good, block_p=512, block_c=512, num_warps=1)) == {ConvRule.REGISTER_BUDGET}
    assert broken(dataclasses.replace(good, split_k=4)) == {ConvRule.SPLIT_K}
    narrow = validate(dataclasses.replace(good, block_c=4), SM90)
    assert narrow.ok and {f.rule for f in narrow.warnings} == {ConvRule.VECTOR_WIDTH}


def test_auto_correct_moves_the_tile_and_refuses_semantics():
    bad = dataclasses.replace(GOOD, block_m=96, num_stages=9)
    fixed, corrections = auto_correct(bad, SM90)
    assert validate(fixed, SM90).ok and {c.field for c in corrections} == {"block_m", "num_stages"}
    assert auto_correct(GOOD, SM90) == (GOOD, ())
    big = dataclasses.replace(GOOD, block_m=256, block_n=256, block_k=64, num_stages=4)
    fixed, _ = auto_correct(big, SM90)
    assert validate(fixed, SM90).ok
    direct, _ = auto_correct(DirectConfig(FWD16, 512, 512, 1), SM90)
    assert validate(direct, SM90).ok
    with pytest.raises(InvalidConfigError, match="tf32"):
        auto_correct(dataclasses.replace(GOOD, signature=ConvSignature(Direction.FORWARD,
                                                                        ConvTypes(DType.FP16, True))), SM90)
    with pytest.raises(InvalidConfigError, match="family-arch"):
        auto_correct(VendorConfig(FWD16), INTERP)


def test_supports_says_why_not():
    p = problem("forward", 2, 64, 64, 2, (8, 8), (3, 3), 1, 1)
    assert supports(GOOD, p) is None
    assert "bwd_weight" in supports(ImplicitGemmConfig(BWDW16, 32, 32, 32), p)
    assert "fp32" in supports(GOOD, problem("forward", 2, 64, 64, 2, (8, 8), (3, 3), dtype="fp32"))
    relu = problem("forward", 2, 64, 64, 2, (8, 8), (3, 3), epilogue=ConvEpilogue(activation=Activation.RELU))
    assert "relu" in supports(GOOD, relu)
    assert "up to 16 channels per group" in supports(DirectConfig(FWD16, 32, 64, 4), p)
    assert supports(DirectConfig(FWD16, 32, 64, 4), problem("forward", 2, 64, 64, 64, (8, 8), (3, 3))) is None
    assert supports(VendorConfig(FWD16), p) is None and "relu" in supports(VendorConfig(FWD16), relu)


# -- rule sets -----------------------------------------------------------------------------------------
def configs(rule_set: RuleSet) -> set:
    return set(RULE_SETS[rule_set]())


def test_rule_sets_nest():
    tiny, tests, default, full = (configs(r) for r in (RuleSet.TINY, RuleSet.TESTS, RuleSet.DEFAULT, RuleSet.FULL))
    assert tiny < tests < default < full


@pytest.mark.parametrize("rule_set", list(RuleSet), ids=lambda r: r.value)
def test_names_are_unique_and_registries_build(rule_set):
    every = list(RULE_SETS[rule_set]())
    assert len({c.name for c in every}) == len(every) == len(set(every))
    registry = Registry.from_rule_set("conv", rule_set, SM90)  # raises on a repeated name
    assert len(registry) > 0.8 * len(every)  # what sm_90 drops is the odd shared-memory or register breaker
    assert all(validate(spec.config, SM90).ok for spec in registry)


def test_every_signature_has_every_family():
    registry = Registry.from_rule_set("conv", "default", SM90)
    counts = registry.counts()
    assert set(counts["by_family"]) == {f.value for f in Family}
    assert set(counts["by_dtype"]) == {"fp16", "bf16", "fp32", "tf32"}
    interp = Registry.from_rule_set("conv", "tiny", INTERP)
    assert "vendor" not in interp.counts()["by_family"] and "bf16" not in interp.counts()["by_dtype"]


def test_registry_json_round_trip():
    registry = Registry.from_rule_set("conv", "tiny", SM90)
    back = Registry.from_json(registry.to_json())
    assert [s.name for s in back] == [s.name for s in registry]
    assert [s.config for s in back] == [s.config for s in registry]


# -- ranking -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sm90_dispatcher():
    from tiledispatch import Dispatcher

    return Dispatcher(Registry.from_rule_set("conv", "default", SM90), SM90)


def ranked(dispatcher, p):
    p = dataclasses.replace(p, specialization=p.dense_specialization())
    return [c.spec for c in dispatcher.explain(p).ranked]


def test_depthwise_prefers_the_direct_family(sm90_dispatcher):
    for direction in (Direction.FORWARD, Direction.BWD_DATA):
        p = problem(direction, 32, 384, 384, 384, (28, 28), (3, 3), 1, 1, 1, "bf16")
        triton = [s for s in ranked(sm90_dispatcher, p) if s.family != "vendor"]
        assert triton[0].family == "direct"


def test_grouped_prefers_triton_and_long_weight_reductions_split(sm90_dispatcher):
    p = problem("forward", 32, 512, 512, 16, (2048,), (3,), 1, 1, 1, "bf16")
    assert ranked(sm90_dispatcher, p)[0].family == "igemm"
    w = problem("bwd_weight", 32, 512, 512, 16, (2048,), (3,), 1, 1, 1, "bf16")
    best = next(s for s in ranked(sm90_dispatcher, w) if s.family == "igemm")
    assert best.config.split_k > 1 and best.config.split_mode is SplitMode.WORKSPACE


def test_small_groups_are_merged(sm90_dispatcher):
    p = problem("forward", 32, 256, 256, 32, (28, 28), (3, 3), 1, 1, 1, "bf16")  # ResNeXt: C/G = K/G = 8
    best = next(s for s in ranked(sm90_dispatcher, p) if s.family == "igemm")
    assert best.config.groups_per_tile > 1


def test_unaligned_channels_rank_lower():
    from tiledispatch.ops.conv.ranking import rule_score

    aligned = problem("forward", 8, 64, 64, 1, (32, 32), (3, 3), 1, 1)
    unaligned = dataclasses.replace(aligned, specialization=dataclasses.replace(aligned.specialization,
                                                                                aligned=False))
    assert rule_score(GOOD, unaligned, SM90).value < rule_score(GOOD, aligned, SM90).value


def test_merged_groups_must_fit_one_channel_block():
    p = problem("forward", 2, 64, 64, 4, (8, 8), (3, 3), 1, 1)  # C/G = K/G = 16
    fits = ImplicitGemmConfig(FWD16, 32, 32, 32, groups_per_tile=2)
    too_deep = ImplicitGemmConfig(FWD16, 32, 32, 16, groups_per_tile=2)
    assert supports(fits, p) is None
    assert "exceed block_k=16" in supports(too_deep, p)


def test_large_tiles_rank_first_for_dense_convs(sm90_dispatcher):
    """98 tiles of 128x128 keep 98 SMs busy: the wave model must not halve them for a second resident slot."""
    for direction in (Direction.FORWARD, Direction.BWD_DATA):
        p = problem(direction, 32, 256, 256, 1, (14, 14), (3, 3), 1, 1, 1, "bf16")  # resnet50 3x3
        best = next(s for s in ranked(sm90_dispatcher, p) if s.family == "igemm")
        assert (best.config.block_m, best.config.block_n, best.config.num_warps) == (128, 128, 8)


def test_tall_direct_tiles_rank_first_for_depthwise(sm90_dispatcher):
    """Among the per-tap kernels (the sliding windows: test_window.py)."""
    p = problem("forward", 16, 2048, 2048, 2048, (4096,), (4,), 1, 1, 1, "bf16")  # mamba's causal conv1d
    best = next(s for s in ranked(sm90_dispatcher, p) if s.family == "direct" and not s.config.window)
    assert best.config.block_p * best.config.block_c // (best.config.num_warps * 32) >= 32  # >= 4 rows a thread


def test_specialisation_channel_multiple():
    from tiledispatch.core.errors import InvalidProblemError
    from tiledispatch.ops.conv import ConvSpecialization
    from tiledispatch.ops.conv.problem import channel_multiple

    assert channel_multiple(256, 256) == 128 and channel_multiple(56, 56) == 8 and channel_multiple(3, 64) == 1
    p = problem("bwd_data", 2, 64, 96, 2, (8, 8), (3, 3), 1, 1).dense_specialization()
    assert p.channel_multiple == 16 and p.unit_stride and p.tag == "al11-s1-c16"
    assert not problem("forward", 2, 64, 96, 2, (9, 9), (3, 3), 2, 1).dense_specialization().unit_stride
    with pytest.raises(InvalidProblemError, match="power of two"):
        ConvSpecialization(channel_multiple=24)


def test_vendor_against_triton_follows_the_measured_direction(sm90_dispatcher):
    """ResNet-50's 3x3 on the H100 (results/h100/conv.csv): cuDNN beats the Triton kernels in every direction,
    backward-data too once it is called with a channels-last stand-in for x (16.6 us against 25.5; with
    torch.nn.grad's expanded stand-in it took 42, and the ranking had learnt the Triton kernel as faster)."""
    for direction, family in ((Direction.BWD_DATA, "vendor"), (Direction.FORWARD, "vendor"),
                              (Direction.BWD_WEIGHT, "vendor")):
        p = problem(direction, 32, 256, 256, 1, (14, 14), (3, 3), 1, 1, 1, "bf16")  # resnet50 3x3
        assert ranked(sm90_dispatcher, p)[0].family == family, direction


def test_direct_weight_gradient_is_not_taken_for_gathered_channels(sm90_dispatcher):
    """ResNeXt's C/G = 8 backward-weight ran 3.9 ms in the direct family, 0.09 ms in igemm-flat (every tap's
    8 channels one 72-wide N, gathered as vectors) and 0.27-0.55 in igemm and igemm-tma (conv.csv)."""
    p = problem("bwd_weight", 32, 256, 256, 32, (28, 28), (3, 3), 1, 1, 1, "bf16")
    triton = [s for s in ranked(sm90_dispatcher, p) if s.family != "vendor"]
    assert triton[0].family == "igemm-flat"


def test_backward_data_prefers_the_tile_that_rereads_less(sm90_dispatcher):
    """conv.csv on the H200: 128x256 ran dilated_3x3_d2's backward-data 1.7x faster than 128x128, and
    256x128 unet_3x3's 1.24x, where waves and waste tie them: each tile's operands come through its
    SM's L2 port, and the larger tile reads fewer bytes per FLOP (ranking._intake_seconds)."""
    cases = ((problem("bwd_data", 16, 256, 256, 1, (32, 32), (3, 3), 1, 2, 2, "bf16"), 128 * 256),
             (problem("bwd_data", 8, 128, 128, 1, (128, 128), (3, 3), 1, 1, 1, "bf16"), 256 * 128))
    for p, area in cases:
        best = next(s for s in ranked(sm90_dispatcher, p) if s.family == "igemm")
        assert best.config.block_m * best.config.block_n == area, best.name


def test_forward_boxes_of_fewer_pixels_than_a_wgmma_pay_for_its_rows(sm90_dispatcher):
    """conv3d_g4 forward on the H200: the 2x16-pixel TMA box, modelled fastest, ran 59 us against
    the 128x32 implicit GEMM's 32: a warpgroup's wgmma computes 64 rows whatever the box holds."""
    p = problem("forward", 4, 128, 128, 4, (8, 28, 28), (3, 3, 3), 1, 1, 1, "bf16")
    best = next(s for s in ranked(sm90_dispatcher, p) if s.family != "vendor")
    assert not (best.family == "igemm-tma" and best.config.pixels < 64), best.name


def test_one_warpgroup_box_alone_on_its_sm_ranks_first_for_resnet_3x3(sm90_dispatcher):
    """ResNet's 3x3 on the H100 (conv_sweep_igemm-tma_forward_dense.csv): the 4-warp 128x128 box,
    one program an SM, ran 15.8 us forward and 15.7 backward-data, two 4-warp 64-pixel programs
    sharing an SM 18.2 and 19.2: one warpgroup keeps wgmma busy, and the larger box reads its L2
    port less (ranking.TMA_WARPS_TO_FILL_SM, TMA_PORT_BYTES_PER_S)."""
    for direction in (Direction.FORWARD, Direction.BWD_DATA):
        p = problem(direction, 32, 256, 256, 1, (14, 14), (3, 3), 1, 1, 1, "bf16")
        best = next(s for s in ranked(sm90_dispatcher, p) if s.family != "vendor")
        assert best.family == "igemm-tma" and best.config.num_warps == 4 and best.config.pixels == 128, best.name


def test_a_conv_of_one_channel_box_a_tap_prefers_igemm_in_3d(sm90_dispatcher):
    """The 3-D video conv (C = K = 64) on the H100: every TMA box of `full` ran 144-147 us, each step
    a new tap, where igemm's 128x64x64 ran 129 (ranking.TMA_TAP_STEP_EFFICIENCY). ResNet's 3x3, four
    channel blocks a tap, keeps its TMA box (the test above)."""
    for direction in (Direction.FORWARD, Direction.BWD_DATA):
        video = problem(direction, 4, 64, 64, 1, (16, 56, 56), (3, 3, 3), 1, 1, 1, "bf16")
        best = next(s for s in ranked(sm90_dispatcher, video) if s.family != "vendor")
        assert best.family == "igemm", best.name


@pytest.mark.parametrize("rule_set", list(RuleSet), ids=lambda r: r.value)
def test_a_signature_class_generates_exactly_its_configs_in_the_whole_set_s_order(rule_set):
    """The lazy registry's premise (core.registry.RuleSetSource): `within=signature` yields the
    whole set's configs of that signature, in the same order, and every config has one."""
    from tiledispatch.ops.conv import rulesets

    whole = list(rulesets.RULE_SETS[rule_set]())
    seen = 0
    for sig in rulesets.signatures():
        part = list(rulesets.RULE_SETS[rule_set](within=sig))
        assert part == [c for c in whole if c.signature == sig]
        seen += len(part)
    assert seen == len(whole)


def test_the_vendor_s_3d_depthwise_weight_cliff_is_never_picked(sm90_dispatcher):
    """Issue 41's case on the H200: a 3-D depthwise backward-weight took cuDNN 50.8 ms where the 2-D fit
    modelled 87 us and a direct kernel ran in about 85: the vendor ranks below every Triton candidate,
    modelled hundreds of times slower than the best of them, while 2-D depthwise keeps the fitted model."""
    p3 = problem("bwd_weight", 8, 256, 256, 256, (8, 28, 28), (3, 3, 3), 1, 1, 1, "bf16")
    p2 = problem("bwd_weight", 8, 256, 256, 256, (28, 28), (3, 3), 1, 1, 1, "bf16")
    order = sm90_dispatcher.explain(p3).ranked
    vendor3 = next(c for c in order if c.spec.family == "vendor")
    assert order[0].spec.family != "vendor" and order[0].score.value > 100 * vendor3.score.value
    vendor2 = next(c for c in sm90_dispatcher.explain(p2).ranked if c.spec.family == "vendor")
    per_flop3 = vendor3.score.terms["modelled_us"] / p3.flops()
    per_flop2 = vendor2.score.terms["modelled_us"] / p2.flops()
    assert per_flop3 > 100 * per_flop2
