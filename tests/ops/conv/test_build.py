"""Conv kernels compile ahead of time for sm_90 on this GPU-less machine, one per family and stage.

Compiling is real (Triton's CUDA backend and its bundled ptxas, in spawned workers),
so a handful of specs is built once for the module; the PTX is checked for what each
specialisation promises (tensor-core MMAs, 16-byte copies when aligned).
"""

from __future__ import annotations

import pytest

from tiledispatch import Registry, arch
from tiledispatch.core import kernel
from tiledispatch.core.cache import CacheEntry, KernelCache
from tiledispatch.ops.conv import ConvSpecialization

SM90 = arch.load("sm_90")
ALIGNED = ConvSpecialization()
UNALIGNED = ConvSpecialization(aligned=False)
POINTWISE = ConvSpecialization(pointwise=True)
DEPTHWISE = ConvSpecialization(groups_aligned=False, depthwise=True)
DENSE = ConvSpecialization(unit_stride=True, channel_multiple=128)  # resnet's 256-channel 3x3 convs
STEM = ConvSpecialization(aligned=False, outputs_aligned=True)  # C=3, K=64
BUILDS = {  # kernel -> the specialisations built for it
    "conv_fwd_fp16_igemm_32x32x32_w4_s2_g4_k1_none_sm90": (ALIGNED, UNALIGNED, POINTWISE),
    "conv_fwd_bf16_igemm_32x32x32_w4_s2_g4_k1_bias-relu-res_sm90": (ALIGNED,),
    "conv_bwdd_fp16_igemm_32x32x32_w4_s2_g4_k1_none_sm90": (ALIGNED,),
    "conv_fwd_bf16_igemm_128x128x64_w8_s3_g8_k1_none_sm90": (DENSE,),
    "conv_bwdd_bf16_igemm_128x128x64_w8_s3_g8_k1_none_sm90": (DENSE,),
    "conv_bwdw_bf16_igemm_128x128x64_w4_s3_g8_k8ws_none_sm90": (DENSE,),
    "conv_fwd_bf16_igemm_128x64x64_w4_s3_g8_k1_gt8_none_sm90": (ALIGNED,),
    "conv_bwdd_fp16_igemm_128x32x32_w4_s3_g8_k1_gt4_none_sm90": (ALIGNED,),
    "conv_bwdw_fp16_igemm_32x16x16_w2_s2_g2_k3ws_none_sm90": (ALIGNED,),
    "conv_bwdw_bf16_igemm_16x32x32_w2_s2_g1_k2at_none_sm90": (ALIGNED,),
    "conv_fwd_fp16_direct_16x16_w2_k1_none_sm90": (DEPTHWISE, UNALIGNED),
    "conv_bwdd_fp32_direct_16x16_w2_k1_none_sm90": (DEPTHWISE,),
    "conv_bwdw_fp16_direct_32x8_w2_k3_none_sm90": (DEPTHWISE,),
    "conv_fwd_bf16_direct_16x64_w4_k1_win3r8_none_sm90": (DEPTHWISE,),
    "conv_bwdd_fp16_direct_16x64_w4_k1_win7r4_none_sm90": (DEPTHWISE,),
    "conv_fwd_bf16_igemm-tma_8x16x128x64_w8_s3_k1_none_sm90": (DENSE,),
    "conv_bwdw_bf16_igemm-tma_1x128x128x128_w8_s3_k4ws_none_sm90": (DENSE,),
    "conv_bwdw_bf16_igemm-tma_8x16x128x128_w8_s3_k1_none_sm90": (DENSE,),
    "conv_fwd_bf16_igemm-flat_128x64x32_w4_s3_g8_k1_pc_none_sm90": (STEM,),
    "conv_bwdw_bf16_igemm-flat_64x64x64_w4_s3_g8_k16ws_pc_none_sm90": (STEM,),
    "conv_fwd_bf16_toeplitz_16x32_w16_r28_f7_bias-gelu-res_sm90": (DEPTHWISE,),
    "conv_bwdd_fp16_toeplitz_16x16_w8_r14_f3_none_sm90": (DEPTHWISE,),
    "conv_bwdw_bf16_toeplitz_16x32_w16_r56_f7_k8_none_sm90": (DEPTHWISE,),
}


@pytest.fixture(scope="module")
def built(private_cache):
    cache = private_cache("conv-build")
    registry = Registry.from_rule_set("conv", "full", SM90)
    # One pool for every build: each spawned worker imports torch once (seconds), not once a specialisation.
    results = kernel.build_each(((registry.get(name), wanted) for name, wanted in BUILDS.items()), cache, jobs=2)
    return cache, registry, results


def ptx(cache: KernelCache, spec, specialization, stage: str = "main") -> str:
    unit = next(u for u in kernel.units(spec, specialization) if u.stage == stage)
    entry = cache.lookup(kernel.unit_key(spec, unit, specialization))
    assert isinstance(entry, CacheEntry), f"{spec.name} {specialization.tag} {stage} was not built"
    return entry.read_bytes(kernel.PTX_FILE).decode()


def test_every_build_succeeds(built):
    _, _, results = built
    failed = [(r.name, r.error) for r in results if not r.ok]
    assert not failed
    assert {r.name for r in results} == set(BUILDS)


def test_implicit_gemm_uses_tensor_cores_and_16_byte_copies_when_aligned(built):
    cache, registry, _ = built
    spec = registry.get("conv_fwd_fp16_igemm_32x32x32_w4_s2_g4_k1_none_sm90")
    aligned, unaligned = ptx(cache, spec, ALIGNED), ptx(cache, spec, UNALIGNED)
    assert ".target sm_90" in aligned and "mma" in aligned and "mma" in unaligned
    assert "cp.async.cg.shared.global" in aligned and "0x10" in aligned
    assert "cp.async.cg.shared.global" not in unaligned
    assert "mma" in ptx(cache, registry.get("conv_fwd_bf16_igemm_32x32x32_w4_s2_g4_k1_bias-relu-res_sm90"), ALIGNED)


def test_split_backward_weight_builds_both_stages(built):
    cache, registry, _ = built
    for name in ("conv_bwdw_fp16_igemm_32x16x16_w2_s2_g2_k3ws_none_sm90",
                 "conv_bwdw_bf16_igemm_16x32x32_w2_s2_g1_k2at_none_sm90"):
        spec = registry.get(name)
        assert [u.stage for u in kernel.units(spec, ALIGNED)] == ["main", "reduce"]
        assert "mma" in ptx(cache, spec, ALIGNED)
        assert ptx(cache, spec, ALIGNED, "reduce")
    assert "atom.global" in ptx(cache, registry.get("conv_bwdw_bf16_igemm_16x32x32_w2_s2_g1_k2at_none_sm90"),
                                ALIGNED)


def test_direct_family_vectorises_depthwise_channels(built):
    cache, registry, _ = built
    spec = registry.get("conv_fwd_fp16_direct_16x16_w2_k1_none_sm90")
    depthwise, unaligned = ptx(cache, spec, DEPTHWISE), ptx(cache, spec, UNALIGNED)
    assert "mma" not in depthwise
    assert "ld.global.v" in depthwise and "ld.global.v" not in unaligned


def test_dense_tiles_use_wgmma_in_a_pipelined_loop(built):
    """The 128x128 dense tiles: Hopper wgmma, 16-byte cp.async into a multi-stage pipeline."""
    cache, registry, _ = built
    for name in ("conv_fwd_bf16_igemm_128x128x64_w8_s3_g8_k1_none_sm90",
                 "conv_bwdd_bf16_igemm_128x128x64_w8_s3_g8_k1_none_sm90",
                 "conv_bwdw_bf16_igemm_128x128x64_w4_s3_g8_k8ws_none_sm90"):
        code = ptx(cache, registry.get(name), DENSE)
        assert "wgmma.mma_async" in code
        assert "cp.async.cg.shared.global" in code and "0x10" in code
        assert "cp.async.wait_group" in code


def test_weight_gradient_loop_has_no_division(built):
    """Backward-weight carries its pixel coordinates (`advance_pixel`): its pipelined loop divides nothing.

    The divisions left in the PTX come before the first MMA (splitting the tap and the first pixels)."""
    cache, registry, _ = built
    code = ptx(cache, registry.get("conv_bwdw_bf16_igemm_128x128x64_w4_s3_g8_k8ws_none_sm90"), DENSE)
    assert "div.s32" in code  # the prologue's
    after = code[code.index("wgmma.mma_async"):]
    assert "div.s32" not in after and "rem.s32" not in after


def test_sliding_windows_load_each_source_vector_once_a_filter_row(built):
    """The window kernels' loop over filter rows: per thread, run + window - 1 16-byte source
    vectors, window x 8 weight elements, and run x window x 8 FMAs (one run of 8 channels a thread).

    On sm_90 SASS the 3x3 run-8 body is ~470 instructions for its 192 FMAs, against 385 a tap
    for 64 in the per-tap kernel (ranking.py, WINDOW_* constants)."""
    cache, registry, _ = built
    for name, run, window in (("conv_fwd_bf16_direct_16x64_w4_k1_win3r8_none_sm90", 8, 3),
                              ("conv_bwdd_fp16_direct_16x64_w4_k1_win7r4_none_sm90", 4, 7)):
        code = ptx(cache, registry.get(name), DEPTHWISE)
        assert "mma" not in code
        assert code.count("ld.global.v4.b32") == run + window - 1, name
        assert code.count("ld.global.b16") == window * 8, name
        assert code.count("fma.rn.f32") == run * window * 8, name


def test_padded_stem_gathers_vectors(built):
    """With its channels padded (pad_channels), the stem's igemm-flat is built for C/G = 8: its x and w
    gathers are 16-byte vectors, where the unpadded build for the same problem loads elements."""
    cache, registry, _ = built
    for name in ("conv_fwd_bf16_igemm-flat_128x64x32_w4_s3_g8_k1_pc_none_sm90",
                 "conv_bwdw_bf16_igemm-flat_64x64x64_w4_s3_g8_k16ws_pc_none_sm90"):
        code = ptx(cache, registry.get(name), STEM)
        assert "ld.global.v4.b32" in code or "cp.async.cg.shared.global" in code, name
        assert "ld.global.b16" not in code, name
    pad = ptx(cache, registry.get("conv_fwd_bf16_igemm-flat_128x64x32_w4_s3_g8_k1_pc_none_sm90"), STEM, "pad")
    assert "st.global" in pad and "mma" not in pad


def test_tma_family_moves_boxes_by_tma_into_wgmma(built):
    """igemm-tma: operands by cp.async.bulk.tensor (5-D activation boxes, the forward's 2-D weight box),
    MMAs by wgmma, no pointer loads in the loop. Forward and one-row backward-weight boxes feed
    wgmma from shared memory; a taller backward-weight box copies dy^T to registers (ldmatrix)."""
    cache, registry, _ = built
    forward = ptx(cache, registry.get("conv_fwd_bf16_igemm-tma_8x16x128x64_w8_s3_k1_none_sm90"), DENSE)
    one_row = ptx(cache, registry.get("conv_bwdw_bf16_igemm-tma_1x128x128x128_w8_s3_k4ws_none_sm90"), DENSE)
    tall = ptx(cache, registry.get("conv_bwdw_bf16_igemm-tma_8x16x128x128_w8_s3_k1_none_sm90"), DENSE)
    for code in (forward, one_row, tall):
        assert "cp.async.bulk.tensor.5d" in code and "wgmma.mma_async" in code and "mbarrier.try_wait" in code
        assert "ld.global" not in code  # every operand comes by TMA (bias and residual are off)
    assert "cp.async.bulk.tensor.2d" in forward
    assert "ldmatrix" not in forward and "ldmatrix" not in one_row and "ldmatrix" in tall
    assert "st.global.v4" in forward  # the epilogue stores 16-byte vectors of channels


def test_toeplitz_walk_is_a_gluon_kernel_on_mma_sync_with_16_byte_rows(built):
    """The walk (Gluon, GPU only) is compiled here so that its front end is exercised without a GPU:
    mma.sync on 16-bit operands and 16-byte loads of a pixel's channels, in one launch that gathers
    its banded filters itself."""
    cache, registry, _ = built
    for name in ("conv_fwd_bf16_toeplitz_16x32_w16_r28_f7_bias-gelu-res_sm90",
                 "conv_bwdd_fp16_toeplitz_16x16_w8_r14_f3_none_sm90"):
        spec = registry.get(name)
        assert [u.stage for u in kernel.units(spec, DEPTHWISE)] == ["main"]
        walk = ptx(cache, spec, DEPTHWISE)
        assert "mma.sync.aligned.m16n8k16" in walk and "ld.global.v4" in walk, name


def test_toeplitz_weight_walk_is_the_forward_walk_with_the_pixels_as_reduction(built):
    """Backward-weight's walk: x and dy rows as 16-byte loads, mma.sync over the pixels, the band's
    diagonals gathered within the warp at the end, then the sum of its slabs."""
    cache, registry, _ = built
    spec = registry.get("conv_bwdw_bf16_toeplitz_16x32_w16_r56_f7_k8_none_sm90")
    assert [u.stage for u in kernel.units(spec, DEPTHWISE)] == ["main", "reduce"]
    walk = ptx(cache, spec, DEPTHWISE)
    assert "mma.sync.aligned.m16n8k16" in walk and "ld.global.v4" in walk
    assert "shfl.sync" in walk and "cp.async" not in walk
