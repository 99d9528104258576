"""Alignment in bytes: operands whose strides are multiples of 16 bytes but not of 16 elements.

A bf16 matrix with rows of 1000 elements has 2000-byte rows: 16-byte vectors and TMA are
legal, though 1000 % 16 == 8. Such problems are `Align.BYTES16`: computed right by the
tiled and tma-persistent kernels (here, under the interpreter, in fp16), told to the
compiler as divisibility 8 (elements) so that it emits 16-byte vectors (the sm_90 PTX
below), and taken by tma-persistent. Sizes that are not multiples of 16 bytes (K=1001)
stay element by element, and correct.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core import kernel
from tiledispatch.core.cache import KernelCache
from tiledispatch.core.op import OpKind, RuleSet
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import Align, Alignment, Family, GemmLayout, GemmTypes, check_operands, kernel_units, supports
from tiledispatch.ops.gemm.reference import compare

from ...conftest import on_gpu

ARCH = current_arch()
DEVICE = "cuda" if on_gpu() else "cpu"
B16, E16, NONE = Align.BYTES16, Align.ELEMS16, Align.NONE
TILED = "gemm_fp16_rcr_tiled_128x64x32_w4_s3_g8_k1_none_" + ARCH.tag
SPLIT = "gemm_fp16_rcr_tiled_32x128x32_w4_s2_g4_k2_none_" + ARCH.tag
PERSISTENT = "gemm_fp16_rcr_tma-persistent_64x32x32_w4_s3_g8_k1_e1f_none_" + ARCH.tag


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def rcr(m: int, n: int, k: int, *, row_a: int | None = None, row_b: int | None = None, row_c: int | None = None,
        seed: int = 0):
    """fp16 A (m x k, row-major), B (k x n, column-major) and a NaN-poisoned C (m x n, row-major)
    whose row strides are `row_*` elements (default: the dim itself, contiguous); fresh values."""
    g = torch.Generator().manual_seed(seed)

    def rows(count: int, length: int, stride: int | None) -> torch.Tensor:
        buffer = torch.randn(count, stride or length, generator=g) / k**0.25
        return buffer.to(DEVICE, torch.float16)[:, :length]

    a, b_t = rows(m, k, row_a), rows(n, k, row_b)
    out = rows(m, n, row_c).fill_(float("nan"))
    return a, b_t.t(), out


def run(dispatcher: Dispatcher, name: str, a, b, out, want: Alignment):
    ops = check_operands(a, b, out=out)
    assert ops.problem.layout == GemmLayout.parse("rcr")
    assert ops.problem.alignment == want, ops.problem.alignment.tag
    dispatcher.run(ops, kernel=name)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    result = compare(out, ops)  # float64 reference; NaN left anywhere fails
    assert result.passed, (name, result.to_dict())


@pytest.mark.parametrize("name", [TILED, PERSISTENT], ids=["tiled", "tma-persistent"])
def test_rows_of_1000(dispatcher, name):
    """odd_1000 of the suite (1000 cubed) in 200 rows of A: every row 2000 bytes, every size a multiple of
    8 elements, the last tile partial along M, N and K."""
    run(dispatcher, name, *rcr(200, 1000, 1000), Alignment(B16, B16, B16, B16, B16, B16))


@pytest.mark.parametrize("name", [TILED, SPLIT, PERSISTENT], ids=["tiled", "split-k", "tma-persistent"])
def test_padded_rows_of_16_bytes(dispatcher, name):
    """40 x 24 x 1000 with rows padded to 1016 (A), 1032 (B) and 40 (C) halves: 16-byte
    multiples, none a multiple of 16 elements; C's row is longer than N."""
    a, b, out = rcr(40, 24, 1000, row_a=1016, row_b=1032, row_c=40, seed=1)
    run(dispatcher, name, a, b, out, Alignment(B16, B16, B16, B16, B16, B16))


@pytest.mark.parametrize("name", [TILED, PERSISTENT], ids=["tiled", "tma-persistent"])
def test_aligned_rows_odd_k(dispatcher, name):
    """K=1001 in rows of 1016 halves: the operands take vectors and TMA, the K edge is masked
    element by element (K is NONE)."""
    a, b, out = rcr(40, 24, 1001, row_a=1016, row_b=1016, seed=2)
    run(dispatcher, name, a, b, out, Alignment(B16, B16, B16, B16, B16, NONE))


def test_unaligned_odd_k_is_still_correct(dispatcher):
    a, b, out = rcr(40, 24, 1001, seed=3)  # rows of 1001 halves: 2002 bytes
    run(dispatcher, TILED, a, b, out, Alignment(NONE, NONE, B16, B16, B16, NONE))
    ops = check_operands(a, b, out=out)
    spec = dispatcher.registry.get(PERSISTENT)
    assert "16-byte aligned" in supports(spec.config, ops.problem)


def test_tma_persistent_takes_16_byte_strides():
    types, layout = GemmTypes.parse("bf16"), GemmLayout.parse("rcr")
    registry = Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, arch.load("sm_90"))
    spec = next(s for s in registry if s.config.family is Family.TMA_PERSISTENT and s.config.types == types
                and s.config.layout == layout and s.config.epilogue.name == "none")
    a = torch.empty(1000, 1000, dtype=torch.bfloat16, device="meta")
    problem = check_operands(a, a.t()).problem
    assert problem.alignment == Alignment(B16, B16, B16, B16, B16, B16)
    assert supports(spec.config, problem) is None
    rows_999 = torch.empty(1000, 999, dtype=torch.bfloat16, device="meta")  # rows of 1998 bytes
    odd = check_operands(rows_999, rows_999.t()).problem
    assert "16-byte aligned" in supports(spec.config, odd)


# -- what the compiler is told -------------------------------------------------------------------------------------


def divisibility(config, alignment: Alignment, stage: int = 0) -> dict[str, int]:
    return dict(kernel_units(config, alignment)[stage].divisibility)


def config_of(name: str):
    return Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, arch.load("sm_90")).get(name).config


def test_divisibility_follows_the_levels():
    config = config_of("gemm_bf16_rcr_tiled_64x64x32_w4_s3_g8_k1_none_sm90")
    # ELEMS16: the divisibility-16 hints Triton's JIT would give (pointers in bytes, integers in elements).
    assert divisibility(config, Alignment()) == {
        "a_ptr": 16, "b_ptr": 16, "c_ptr": 16, "M": 16, "N": 16, "K": 16, "stride_ab": 16, "stride_am": 16,
        "stride_bb": 16, "stride_bn": 16, "stride_cb": 16, "stride_cm": 16}
    # BYTES16 in bf16: strides and sizes are multiples of 8 elements; pointers still 16 bytes.
    odd = divisibility(config, Alignment(B16, B16, B16, B16, B16, B16))
    assert odd == {"a_ptr": 16, "b_ptr": 16, "c_ptr": 16, "M": 8, "N": 8, "K": 8, "stride_ab": 8, "stride_am": 8,
                   "stride_bb": 8, "stride_bn": 8, "stride_cb": 8, "stride_cm": 8}
    # NONE: nothing is claimed.
    assert divisibility(config, Alignment(*[NONE] * 6)) == {}
    assert divisibility(config, Alignment(NONE, B16, E16, NONE, B16, NONE)) == {
        "b_ptr": 16, "c_ptr": 16, "N": 8, "stride_bb": 8, "stride_bn": 8, "stride_cb": 16, "stride_cm": 16}


def test_divisibility_of_fp32_fp8_and_the_split_k_stages():
    fp32 = config_of("gemm_fp32_rcr_tiled_64x64x32_w4_s3_g8_k1_none_sm90")
    assert divisibility(fp32, Alignment(B16, B16, B16, B16, B16, B16))["stride_am"] == 4
    fp8 = config_of("gemm_fp8e4m3-bf16_rcr_tiled_64x64x64_w4_s4_g8_k1_none_sm90")
    # fp8 in, bf16 out: K runs along A and B (16 bytes = 16 elements), N along B and C (16 bytes of the smaller).
    got = divisibility(fp8, Alignment(E16, E16, B16, NONE, E16, E16))
    assert (got["K"], got["N"], got["stride_am"], got["stride_cm"]) == (16, 16, 16, 8) and "M" not in got
    split = next(s for s in Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, arch.load("sm_90"))
                 if s.config.family is Family.TILED and s.config.split_k > 1 and s.config.types.name == "bf16"
                 and s.config.layout.name == "rcr" and s.config.epilogue.name == "none").config
    level = Alignment(B16, B16, B16, B16, B16, B16)
    main, reduce = divisibility(split, level, 0), divisibility(split, level, 1)
    assert main["c_ptr"] == 16 and main["stride_cm"] == 16  # the fp32 workspace is ours (strides passed as 0)
    assert reduce == {"ws_ptr": 16, "c_ptr": 16, "M": 8, "N": 8, "stride_cb": 8, "stride_cm": 8}


def test_specialisation_key_tells_the_levels_apart():
    spec = Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, arch.load("sm_90")).get(
        "gemm_bf16_rcr_tiled_64x64x32_w4_s3_g8_k1_none_sm90")
    (unit,) = kernel.units(spec, Alignment())
    keys = {kernel.unit_key(spec, unit, Alignment(level, level, level, level, level, level)) for level in Align}
    assert len(keys) == 3


# -- sm_90 PTX, compiled ahead of time on this machine ---------------------------------------------------------------


def sixteen_byte_copies(ptx: str) -> int:
    """Asynchronous global-to-shared copies of 16 bytes (the pipelined operand loads)."""
    return len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^\n]*, (?:16|0x10)[;,]", ptx))


def test_sm90_ptx_has_16_byte_vectors_for_rows_of_1000_bf16(tmp_path):
    """odd_1000 in bf16 (rows of 2000 bytes) is compiled to the same 16-byte copies and stores as
    an aligned problem; with the old 16-element rule it was element by element. The TMA family,
    which the rules now pick there, compiles for it too."""
    os.chmod(tmp_path, 0o700)
    cache = KernelCache(tmp_path / "cache")
    registry = Registry.from_rule_set(OpKind.GEMM, RuleSet.DEFAULT, arch.load("sm_90"))
    tiled = registry.get("gemm_bf16_rcr_tiled_64x64x32_w4_s3_g8_k1_none_sm90")
    persistent = registry.get("gemm_bf16_rcr_tma-persistent_64x128x128_w4_s4_g8_k1_e1_none_sm90")
    a = torch.empty(1000, 1000, dtype=torch.bfloat16, device="meta")
    odd_1000 = check_operands(a, a.t()).problem.alignment
    unaligned = Alignment(*[NONE] * 6)
    results = kernel.build_all([tiled], cache, jobs=1, specializations=(odd_1000, unaligned))
    results += kernel.build_all([persistent], cache, jobs=1, specializations=(odd_1000,))
    assert all(r.ok for r in results), [r.error for r in results]
    ptx = {(e.key.split(".")[0], e.key.split(".")[1]): e.files[kernel.PTX_FILE].read_text() for e in cache.entries()}
    vectorised, scalar = ptx[tiled.name, odd_1000.tag], ptx[tiled.name, unaligned.tag]
    assert sixteen_byte_copies(vectorised) >= 2 and "st.global.v4" in vectorised  # A and B tiles, the C store
    assert sixteen_byte_copies(scalar) == 0 and "st.global.v4" not in scalar
    assert "cp.async.bulk.tensor" in ptx[persistent.name, odd_1000.tag]


def test_a_single_column_is_not_16_byte_aligned(dispatcher):
    """K = 1: A (20 x 1, contiguous) is row-major with rows 2 bytes apart. Its one unit stride
    is a step between rows, not the contiguous dim, so A is NONE (no descriptor takes it: the
    plain TMA kernels refused to build one), and every kernel that takes it is right."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(20, 1, generator=g).to(DEVICE, torch.float16)
    b = torch.randn(1, 32, generator=g).to(DEVICE, torch.float16)
    ops = check_operands(a, b)
    assert ops.problem.alignment.a == NONE and ops.problem.alignment.b == E16
    names = [s.name for s in dispatcher.registry if s.family != "vendor" and supports(s.config, ops.problem) is None]
    assert any("realign" in name for name in names) and not any(
        "tma-persistent" in name and "realign" not in name for name in names)
    for name in names:
        out = torch.full((20, 32), float("nan"), dtype=torch.float16, device=DEVICE)
        with_out = check_operands(a, b, out=out)
        dispatcher.run(with_out, kernel=name)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        result = compare(out, with_out)
        assert result.passed, (name, result.to_dict())
