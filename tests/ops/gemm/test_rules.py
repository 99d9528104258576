"""GEMM config rules: one predicate, per-rule findings, the auto-corrector and `supports`."""

import math
from dataclasses import replace

import pytest

from tiledispatch import arch
from tiledispatch.core.dtypes import DType
from tiledispatch.core.errors import InvalidConfigError
from tiledispatch.core.validation import Correction, Severity
from tiledispatch.ops.gemm.config import Family, GemmConfig
from tiledispatch.ops.gemm.problem import Activation, Epilogue, GemmLayout, GemmProblem, GemmTypes
from tiledispatch.ops.gemm.rules import (
    GemmRule,
    accumulator_registers,
    auto_correct,
    shared_memory_bytes,
    supports,
    validate,
)

SM80, SM86, SM89, SM90 = (arch.load(n) for n in ("sm_80", "sm_86", "sm_89", "sm_90"))
INTERP = arch.load("interpreter")

FP16 = GemmTypes(DType.FP16, DType.FP16, DType.FP16)
BF16 = GemmTypes(DType.BF16, DType.BF16, DType.BF16)
FP8 = GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16)
RCR = GemmLayout.parse("rcr")

# Valid everywhere, warning-free: 64x64x32, 4 warps, 3 stages (24 KiB of shared memory).
BASE = GemmConfig(Family.TILED, FP16, RCR, Epilogue(), 64, 64, 32, group_m=8, num_warps=4, num_stages=3)


def config(**changes) -> GemmConfig:
    return replace(BASE, **changes)


def test_base_is_valid_and_clean_everywhere():
    for target in (SM80, SM86, SM89, SM90, INTERP):
        assert validate(BASE, target).findings == ()


# --- one config per error rule, breaking exactly that rule -----------------------------

# rule -> (changes to BASE, substrings the error message must contain)
BREAKERS = {
    GemmRule.TILE_POWER_OF_TWO: (dict(block_m=48), ["block_m=48", "power of two"]),
    GemmRule.TENSOR_CORE_MINIMUM: (dict(types=FP8, block_k=16), ["64x64x16", "16x16x32", "fp8e4m3"]),
    GemmRule.TILE_MAXIMUM: (dict(block_m=512, block_n=16), ["512", "256"]),
    GemmRule.WARPS: (dict(num_warps=3), ["num_warps=3", "(1, 2, 4, 8, 16)"]),
    GemmRule.STAGES: (dict(num_stages=9), ["num_stages=9", "1..8"]),
    GemmRule.GROUP_M: (dict(group_m=0), ["group_m=0", "at least 1"]),
    GemmRule.SPLIT_K: (dict(split_k=129), ["split_k=129", "1..128"]),
    # 4 x (128x128 + 128x128) x 2 B = 262144 B > 232448 B on sm_90.
    GemmRule.SHARED_MEMORY: (dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4),
                             ["4 stages", "262144 B", "232448 B", "sm_90"]),
    # 256 x 256 fp32 words over 128 threads = 512 registers > 255 - 64.
    GemmRule.REGISTER_BUDGET: (dict(block_m=256, block_n=256, block_k=32, num_stages=2),
                               ["256x256", "512 registers", "4 warps", "191"]),
    GemmRule.DTYPE_ARCH: (dict(types=GemmTypes(DType.FP8E4M3, DType.FP8E5M2, DType.BF16)),
                          ["fp8e4m3", "fp8e5m2", "sm_90"]),  # checked on sm_80 below
    GemmRule.TF32: (dict(types=GemmTypes(DType.FP16, DType.FP16, DType.FP16, allow_tf32=True)),
                    ["allow_tf32", "fp16"]),
    GemmRule.ACCUMULATOR: (dict(types=GemmTypes(DType.BF16, DType.BF16, DType.BF16, DType.FP16)),
                           ["accumulator fp16", "bf16"]),
    GemmRule.OUTPUT_DTYPE: (dict(types=GemmTypes(DType.FP16, DType.FP16, DType.BF16)),
                            ["output dtype bf16", "fp16 inputs"]),
    GemmRule.PERSISTENT_OPTIONS: (dict(epilogue_split=2), ["epilogue_split", "tma-persistent"]),
}
# The arch each breaker is checked on (DTYPE_ARCH needs one without fp8).
BREAK_ON = {GemmRule.DTYPE_ARCH: SM80}


# Broken only by the vendor, tma-persistent, gemv and ws-persistent families (tested with them below, in
# test_gemv.py and in test_ws_persistent.py).
FAMILY_ONLY = {GemmRule.FAMILY_ARCH, GemmRule.LAYOUT, GemmRule.GEMV_OPTIONS, GemmRule.WS_OPTIONS}


def test_every_error_rule_has_a_breaker():
    warning_only = {GemmRule.WARPS_FOR_TILE}
    assert set(BREAKERS) == set(GemmRule) - warning_only - FAMILY_ONLY


@pytest.mark.parametrize("rule", list(BREAKERS), ids=lambda r: r.value)
def test_config_breaking_exactly_one_rule(rule):
    changes, words = BREAKERS[rule]
    target = BREAK_ON.get(rule, SM90)
    if rule is GemmRule.DTYPE_ARCH:
        words = [w.replace("sm_90", "sm_80") for w in words]
    result = validate(config(**changes), target)
    assert not result.ok
    assert result.broken_rules() == frozenset({rule})
    (finding,) = [f for f in result.errors if f.rule is rule][:1]
    assert finding.severity is Severity.ERROR
    message = " ".join(str(f) for f in result.errors)
    for word in words:
        assert word in message, (word, message)
    assert f"[{rule.value}]" in str(finding)
    with pytest.raises(InvalidConfigError, match=rule.value):
        result.raise_if_invalid("the config")


@pytest.mark.parametrize("changes, text", [
    (dict(num_stages=0), "num_stages=0"),
    (dict(split_k=0), "split_k=0"),
    (dict(block_n=8), "64x8x32"),
    (dict(block_k=8), "64x64x8"),
])
def test_lower_bounds(changes, text):
    result = validate(config(**changes), SM90)
    assert not result.ok and text in " ".join(str(f) for f in result.errors)


def test_output_dtype_rules():
    assert validate(config(types=GemmTypes(DType.FP16, DType.FP16, DType.FP32)), SM90).ok
    assert validate(config(types=GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.FP16)), SM90).ok
    bad = validate(config(types=GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.FP8E4M3)), SM90)
    assert bad.broken_rules() == {GemmRule.OUTPUT_DTYPE} and "fp8e4m3 is not supported" in str(bad.errors[0])


def test_fp16_accumulator_only_for_all_fp16():
    assert validate(config(types=GemmTypes(DType.FP16, DType.FP16, DType.FP16, DType.FP16)), SM90).ok
    mixed = validate(config(types=GemmTypes(DType.FP16, DType.FP16, DType.FP32, DType.FP16)), SM90)
    assert mixed.broken_rules() == {GemmRule.ACCUMULATOR}


def test_shared_memory_and_register_arithmetic():
    c = config(block_m=128, block_n=64, block_k=32, num_stages=4)
    assert shared_memory_bytes(c) == 4 * (128 * 32 * 2 + 32 * 64 * 2)
    assert shared_memory_bytes(replace(c, types=FP8)) == 4 * (128 * 32 + 32 * 64)
    assert accumulator_registers(c) == 128 * 64 // 128


# --- architecture-dependent rules ------------------------------------------------------


def test_shared_memory_limit_differs_by_arch():
    # 4 x (128x64 + 64x128) x 2 B = 131072 B: fits sm_90 (232448) and sm_80 (166912), not sm_86 (101376).
    c = config(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
    assert shared_memory_bytes(c) == 131072
    assert validate(c, SM90).ok and validate(c, SM80).ok
    bad = validate(c, SM86)
    assert bad.broken_rules() == {GemmRule.SHARED_MEMORY}
    assert "131072 B" in str(bad.errors[0]) and "101376 B" in str(bad.errors[0]) and "sm_86" in str(bad.errors[0])


def test_fp8_needs_sm89():
    c = config(types=FP8)
    on_80 = validate(c, SM80)
    assert on_80.broken_rules() == {GemmRule.DTYPE_ARCH}
    assert "fp8e4m3" in str(on_80.errors[0]) and "sm_80" in str(on_80.errors[0])
    assert validate(c, SM86).broken_rules() == {GemmRule.DTYPE_ARCH}
    assert validate(c, SM89).ok and validate(c, SM90).ok


def test_bf16_is_invalid_on_the_interpreter():
    c = config(types=BF16)
    result = validate(c, INTERP)
    assert result.broken_rules() == {GemmRule.DTYPE_ARCH}
    assert {f.message.split()[0] for f in result.errors} == {"A", "B"}
    assert all("bf16" in f.message and "interpreter" in f.message for f in result.errors)
    assert validate(c, SM80).ok and validate(c, SM90).ok


def test_fp32_never_breaks_dtype_arch():
    for types in (GemmTypes(DType.FP32, DType.FP32, DType.FP32),
                  GemmTypes(DType.FP32, DType.FP32, DType.FP32, allow_tf32=True)):
        for target in (SM80, SM86, INTERP):
            assert validate(config(types=types, num_stages=2), target).ok


# --- warnings ------------------------------------------------------------------------


def test_warnings_do_not_make_a_config_invalid():
    idle = validate(config(block_m=16, block_n=16, num_warps=4), SM90)  # 4 warps on a 16x16 tile
    assert idle.ok and idle.errors == () and idle.broken_rules() == frozenset()
    assert [f.rule for f in idle.warnings] == [GemmRule.WARPS_FOR_TILE]
    assert "4 warps share a 16x16 tile" in idle.warnings[0].message
    idle.raise_if_invalid("a slow config")  # no raise

    heavy = validate(config(block_m=128, block_n=128), SM90)  # 128 accumulator registers per thread
    assert heavy.ok and [f.rule for f in heavy.warnings] == [GemmRule.REGISTER_BUDGET]
    assert "128 registers" in heavy.warnings[0].message


# --- auto-correction -----------------------------------------------------------------


def test_auto_correct_valid_config_is_unchanged():
    fixed, corrections = auto_correct(BASE, SM90)
    assert fixed is BASE and corrections == ()
    slow = config(block_m=16, block_n=16)  # only a warning
    assert auto_correct(slow, SM90) == (slow, ())


@pytest.mark.parametrize("value, nearest", [(100, 128), (90, 64), (48, 64), (40, 32), (17, 16), (300, 256), (8, 16)])
def test_auto_correct_block_to_nearest_power_of_two(value, nearest):
    fixed, corrections = auto_correct(config(block_m=value), SM90)
    assert validate(fixed, SM90).ok
    assert fixed == config(block_m=nearest)
    assert len(corrections) == 1
    (c,) = corrections
    assert (c.field, c.old, c.new) == ("block_m", value, nearest)
    assert c.rules  # names the rules that were broken
    assert str(c).startswith(f"block_m: {value} -> {nearest} (")


def test_auto_correct_100_goes_up_not_down():
    fixed, corrections = auto_correct(config(block_m=100), SM90)
    assert fixed.block_m == 128
    assert corrections == (Correction("block_m", 100, 128, ("tile-power-of-two",)),)


@pytest.mark.parametrize("target", [SM90, SM86], ids=["sm_90", "sm_86"])
def test_auto_correct_shared_memory_lowers_stages_or_block_k(target):
    broken = config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4)
    assert validate(broken, target).broken_rules() == {GemmRule.SHARED_MEMORY}
    fixed, corrections = auto_correct(broken, target)
    assert validate(fixed, target).ok
    assert {c.field for c in corrections} <= {"num_stages", "block_k"} and corrections
    assert (fixed.block_m, fixed.block_n, fixed.num_warps) == (128, 128, 8)
    assert (fixed.types, fixed.layout, fixed.epilogue, fixed.group_m, fixed.split_k) == (
        broken.types, broken.layout, broken.epilogue, broken.group_m, broken.split_k)
    assert fixed.num_stages <= broken.num_stages and fixed.block_k <= broken.block_k
    for c in corrections:
        assert c.rules == ("shared-memory",) and c.old == getattr(broken, c.field) and c.new == getattr(fixed, c.field)


def test_auto_correct_shared_memory_by_one_stage_on_sm90():
    broken = config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4)
    fixed, corrections = auto_correct(broken, SM90)
    assert fixed == replace(broken, num_stages=3)  # 196608 B fits; one stage is the smallest move
    assert corrections == (Correction("num_stages", 4, 3, ("shared-memory",)),)


def _steps(old: GemmConfig, new: GemmConfig) -> float:
    """Powers of two moved over the tunable fields (stages count half), as the corrector measures."""
    weights = {"block_m": 1, "block_n": 1, "block_k": 1, "num_warps": 1, "num_stages": 0.5}
    return sum(w * abs(math.log2(getattr(new, f)) - math.log2(max(getattr(old, f), 1))) for f, w in weights.items())


def test_auto_correct_register_budget_is_nearest():
    broken = config(block_m=256, block_n=256, block_k=32, num_stages=2)  # 512 registers on 4 warps
    assert validate(broken, SM90).broken_rules() == {GemmRule.REGISTER_BUDGET}
    fixed, corrections = auto_correct(broken, SM90)
    assert validate(fixed, SM90).ok
    assert accumulator_registers(fixed) <= SM90.registers_per_thread_max - 64
    # A 4x cut of registers per thread takes two powers of two (warps up or the tile down) ...
    assert _steps(broken, fixed) == 2
    assert {c.field for c in corrections} <= {"block_m", "block_n", "num_warps"}
    # ... and no single step is enough.
    for field, choices in (("block_m", (128,)), ("block_n", (128,)), ("num_warps", (2, 8))):
        for value in choices:
            assert not validate(replace(broken, **{field: value}), SM90).ok


def test_auto_correct_fixes_group_m_and_split_k():
    fixed, corrections = auto_correct(config(group_m=0, split_k=200), SM90)
    assert (fixed.group_m, fixed.split_k) == (1, 128)
    assert {(c.field, c.old, c.new) for c in corrections} == {("group_m", 0, 1), ("split_k", 200, 128)}
    assert all(set(c.rules) == {"group-m", "split-k"} for c in corrections)


def test_auto_correct_several_rules_at_once():
    fixed, corrections = auto_correct(config(block_m=100, num_warps=3, num_stages=0), SM90)
    assert validate(fixed, SM90).ok
    assert (fixed.block_m, fixed.num_warps, fixed.num_stages) == (128, 4, 1)
    assert {c.field for c in corrections} == {"block_m", "num_warps", "num_stages"}
    assert set(corrections[0].rules) == {"tile-power-of-two", "warps", "stages"}


@pytest.mark.parametrize("changes, target, rule", [
    (dict(types=FP8), SM80, "dtype-arch"),
    (dict(types=BF16), INTERP, "dtype-arch"),
    (dict(types=GemmTypes(DType.FP16, DType.FP16, DType.FP16, allow_tf32=True)), SM90, "tf32"),
    (dict(types=GemmTypes(DType.BF16, DType.BF16, DType.BF16, DType.FP16)), SM90, "accumulator"),
    (dict(types=GemmTypes(DType.FP16, DType.FP16, DType.BF16)), SM90, "output-dtype"),
    (dict(types=FP8, block_m=100), SM80, "dtype-arch"),  # a tile error does not hide the semantic one
])
def test_auto_correct_refuses_semantic_rules(changes, target, rule):
    c = config(**changes)
    with pytest.raises(InvalidConfigError) as info:
        auto_correct(c, target)
    message = str(info.value)
    assert f"[{rule}]" in message and c.name in message and target.name in message


# --- supports ------------------------------------------------------------------------


def problem(**changes) -> GemmProblem:
    return replace(GemmProblem(m=100, n=60, k=40, types=FP16, layout=RCR), **changes)


def test_supports_matching_problem():
    assert supports(BASE, problem()) is None
    assert supports(BASE, problem(m=1, n=1, k=1, batch=7)) is None  # sizes never matter


def test_supports_generic_strided_layouts():
    generic = config(layout=GemmLayout.parse("sss"))
    for text in ("rcr", "rrr", "ccr", "sss", "rsc"):
        assert supports(generic, problem(layout=GemmLayout.parse(text))) is None
    partly = config(layout=GemmLayout.parse("rsr"))
    assert supports(partly, problem(layout=GemmLayout.parse("rcr"))) is None
    assert "layout rsr" in supports(partly, problem(layout=GemmLayout.parse("ccr")))


@pytest.mark.parametrize("changes, words", [
    (dict(types=BF16), ["fp16", "bf16"]),
    (dict(types=GemmTypes(DType.FP16, DType.FP16, DType.FP32)), ["fp16", "fp16-fp32"]),
    (dict(epilogue=Epilogue(bias=True)), ["epilogue none", "bias"]),
    (dict(epilogue=Epilogue(activation=Activation.GELU)), ["epilogue none", "gelu"]),
    (dict(layout=GemmLayout.parse("rrr")), ["layout rcr", "rrr"]),
    (dict(layout=GemmLayout.parse("rcs")), ["layout rcr", "rcs"]),  # specialised kernels refuse strided
])
def test_supports_refuses_with_a_reason(changes, words):
    reason = supports(BASE, problem(**changes))
    assert isinstance(reason, str)
    for word in words:
        assert word in reason


def test_split_k_refused_where_its_workspace_would_be_huge():
    split = config(split_k=64)
    assert supports(split, problem(m=256, n=256, k=131072)) is None  # 16 MiB of partial sums
    reason = supports(split, problem(m=16384, n=28672, k=4096))  # 112 GiB: it ran the H200 out of memory
    assert "workspace" in reason and "GiB" in reason and "fewer splits" in reason


# -- the vendor candidate --------------------------------------------------------------
def test_vendor_config_rules():
    from tiledispatch.ops.gemm import VendorConfig

    bf16 = GemmTypes(DType.BF16, DType.BF16, DType.BF16)
    good = VendorConfig(bf16, GemmLayout.parse("sss"), Epilogue())
    assert good.name == "gemm_bf16_sss_vendor_none"
    assert validate(good, SM90).ok
    assert auto_correct(good, SM90) == (good, ())
    on_cpu = validate(good, arch.load("interpreter"))
    assert on_cpu.broken_rules() == frozenset({GemmRule.FAMILY_ARCH})
    pinned = VendorConfig(bf16, GemmLayout.parse("rcr"), Epilogue())
    assert validate(pinned, SM90).broken_rules() == frozenset({GemmRule.LAYOUT})
    with pytest.raises(InvalidConfigError, match="layout"):
        auto_correct(pinned, SM90)
    fp8 = VendorConfig(GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16), GemmLayout.parse("sss"), Epilogue())
    assert validate(fp8, SM80).broken_rules() == frozenset({GemmRule.DTYPE_ARCH})


def test_vendor_supports_any_layout_but_fp8_needs_rcr():
    from tiledispatch.ops.gemm import VendorConfig

    bf16 = GemmTypes(DType.BF16, DType.BF16, DType.BF16)
    vendor = VendorConfig(bf16, GemmLayout.parse("sss"), Epilogue())
    assert supports(vendor, GemmProblem(33, 65, 7, types=bf16, layout=GemmLayout.parse("csc"))) is None
    assert "epilogue" in supports(vendor, GemmProblem(8, 8, 8, types=bf16, epilogue=Epilogue(bias=True)))
    fp8_types = GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16)
    fp8 = VendorConfig(fp8_types, GemmLayout.parse("sss"), Epilogue())
    assert supports(fp8, GemmProblem(64, 64, 64, types=fp8_types, layout=GemmLayout.parse("rcr"))) is None
    assert "column-major" in supports(fp8, GemmProblem(64, 64, 64, types=fp8_types, layout=GemmLayout.parse("rrr")))
    assert "multiples of 16" in supports(fp8, GemmProblem(64, 64, 72 + 1, types=fp8_types,
                                                          layout=GemmLayout.parse("rcr")))


# --- tma-persistent ----------------------------------------------------------------------

PERSISTENT = replace(BASE, family=Family.TMA_PERSISTENT, block_m=128, block_n=128, block_k=64, num_warps=8,
                     num_stages=4, epilogue_split=2)


def test_persistent_name_spells_its_options():
    assert PERSISTENT.name == "gemm_fp16_rcr_tma-persistent_128x128x64_w8_s4_g8_k1_e2_none"
    assert replace(PERSISTENT, flatten=True).name.endswith("_k1_e2f_none")
    assert "_e" not in BASE.name  # the tiled family's names are unchanged


def test_persistent_needs_tma_and_counts_the_store_buffer():
    assert validate(PERSISTENT, SM90).ok and validate(PERSISTENT, INTERP).ok
    on_ampere = validate(PERSISTENT, SM80)
    assert on_ampere.broken_rules() == {GemmRule.FAMILY_ARCH} and "tensor memory accelerator" in str(on_ampere.errors[0])
    with pytest.raises(InvalidConfigError, match="family-arch"):
        auto_correct(PERSISTENT, SM80)
    # 4 stages x (128x64 + 64x128) x 2 B, plus one 128x64 fp16 slice of C staged for the TMA store.
    assert shared_memory_bytes(PERSISTENT) == 4 * (128 * 64 * 2 + 64 * 128 * 2) + 128 * 64 * 2


@pytest.mark.parametrize("changes, rule, words", [
    (dict(layout=GemmLayout.parse("ssr")), GemmRule.LAYOUT, ["row- or column-major", "ssr"]),
    (dict(layout=GemmLayout.parse("rrc")), GemmRule.LAYOUT, ["C row-major"]),
    (dict(types=FP8, layout=GemmLayout.parse("rrr")), GemmRule.LAYOUT, ["K-major", "rcr"]),
    (dict(split_k=0), GemmRule.SPLIT_K, ["split_k=0"]),
    (dict(epilogue_split=4), GemmRule.PERSISTENT_OPTIONS, ["epilogue_split=4"]),
    (dict(block_n=16), GemmRule.PERSISTENT_OPTIONS, ["block_n=16"]),
])
def test_persistent_rules(changes, rule, words):
    result = validate(replace(PERSISTENT, **changes), SM90)
    assert result.broken_rules() == {rule}
    message = " ".join(str(f) for f in result.errors)
    assert all(word in message for word in words), message


def test_persistent_layouts_and_fp8():
    for layout in ("rrr", "rcr", "crr", "ccr"):
        assert validate(replace(PERSISTENT, layout=GemmLayout.parse(layout)), SM90).ok
    assert validate(replace(PERSISTENT, types=FP8, block_k=128, num_stages=3), SM90).ok


def test_persistent_split_k_stages_fp32_partials():
    split = replace(PERSISTENT, split_k=8)
    assert validate(split, SM90).ok
    # The TMA store stages the fp32 partial sum, twice the bytes of the fp16 output tile.
    assert shared_memory_bytes(split) - shared_memory_bytes(PERSISTENT) == 128 * 64 * 2


def test_persistent_supports_only_aligned_operands():
    problem = GemmProblem(256, 256, 256, types=FP16, layout=RCR)
    assert supports(PERSISTENT, problem) is None
    unaligned = replace(problem, alignment=replace(problem.alignment, a=False, c=False))
    reason = supports(PERSISTENT, unaligned)
    assert "16-byte aligned" in reason and "a, c are not" in reason
    tiled = replace(PERSISTENT, family=Family.TILED, epilogue_split=1)
    assert supports(tiled, unaligned) is None  # the tiled family serves every alignment
