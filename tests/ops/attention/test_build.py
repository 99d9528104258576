"""Ahead-of-time builds of the attention kernels for sm_90 on this (GPU-less) machine.

Real compiles (Triton's CUDA backend in a spawned worker): one forward and one backward
spec, in the plain and the causal specialisation, checked to use the tensor cores.
"""


import pytest

from tiledispatch import arch
from tiledispatch.core import kernel
from tiledispatch.core.registry import Registry
from tiledispatch.ops.attention import AttentionVariant
from tiledispatch.ops.attention.rules import shared_memory_bytes

SM90 = arch.load("sm_90")
FWD = "attention_fwd_bf16_d128x128_fwd_128x64_w8_s3_sm90"
BWD = "attention_bwd_fp16_d64x64_bwd-atomic_64x64_w4_s2_sm90"
BWD_DETERMINISTIC = "attention_bwd_bf16_d128x128_bwd_64x64_w4_s2_sm90"
FEATURES = AttentionVariant(band=True, bias=True, alibi=True, softcap=True, sinks=True, dropout=True, varlen=False)


@pytest.fixture(scope="module")
def built(private_cache):
    cache = private_cache("attention-build")
    registry = Registry.from_rule_set("attention", "default", SM90)
    specs = [registry.get(FWD), registry.get(BWD), registry.get(BWD_DETERMINISTIC)]
    results = kernel.build_all(specs, cache, jobs=2, specializations=(AttentionVariant(band=True), FEATURES))
    return cache, specs, results


def test_every_stage_compiles_for_sm90(built):
    cache, specs, results = built
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    stages = sorted(e.metadata["stage"] for e in cache.entries())
    assert stages == sorted(["fwd"] * 2 + ["preprocess", "dkdv", "convert"] * 2 + ["preprocess", "dkdv", "dq"] * 2)


def test_the_dots_use_hopper_tensor_cores(built):
    cache, *_ = built
    for entry in cache.entries():
        ptx = entry.files[kernel.PTX_FILE].read_text()
        assert ".target sm_90" in ptx
        if entry.metadata["stage"] in ("fwd", "dkdv", "dq"):
            assert "wgmma" in ptx or "mma" in ptx, entry.key
        assert entry.metadata["shared_bytes"] <= SM90.shared_memory_per_block_optin


def test_the_shared_memory_rule_is_not_below_what_the_compiler_took(built):
    """The SHARED_MEMORY rule must not admit configs that fail at load time on the GPU."""
    cache, specs, _ = built
    for entry in cache.entries():
        spec = next(s for s in specs if entry.key.startswith(s.name + "."))
        if entry.metadata["stage"] in ("fwd", "dkdv", "dq"):
            assert entry.metadata["shared_bytes"] <= shared_memory_bytes(spec.config), entry.key


def test_compiled_soft_cap_takes_the_hardware_tanh(built):
    """Compiled for sm_90 the soft-cap's tanh is one tanh.approx.f32 a score (the sigmoid form
    spent an exp and IEEE divisions on the special-function unit); without a soft-cap, none."""
    cache, *_ = built
    for entry in cache.entries():
        if entry.metadata["stage"] not in ("fwd", "dkdv", "dq"):
            continue
        ptx = entry.files[kernel.PTX_FILE].read_text()
        capped = f".{FEATURES.tag}." in entry.key
        assert ("tanh.approx.f32" in ptx) == capped, entry.key
        assert "div.rn.f32" not in ptx, entry.key


HOPPER = ["attention_fwd_bf16_d128x128_fwd-tma_128x128_w8_s2_sm90",
          "attention_fwd_bf16_d128x128_fwd_128x128_w8_s2_sm90",
          "attention_bwd_bf16_d128x128_bwd_32x128_w8_s2_sm90"]


@pytest.fixture(scope="module")
def built_hopper(private_cache):
    cache = private_cache("attention-hopper")
    registry = Registry.from_rule_set("attention", "default", SM90)
    specs = [registry.get(name) for name in HOPPER]
    results = kernel.build_all(specs, cache, jobs=2, specializations=(AttentionVariant(),))
    return cache, specs, results


def _entries(cache, name):
    return {e.metadata["stage"]: e for e in cache.entries() if e.key.startswith(name + ".")}


def test_tma_forward_uses_bulk_tensor_copies_and_wgmma(built_hopper):
    """The Hopper family exists for TMA and warpgroup MMA: a compile that lost either fails here."""
    cache, specs, results = built_hopper
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    ptx = _entries(cache, HOPPER[0])["fwd"].files[kernel.PTX_FILE].read_text()
    assert "cp.async.bulk.tensor" in ptx and "wgmma" in ptx, HOPPER[0]


def test_pointer_forward_and_backward_vectorise_and_pipeline(built_hopper):
    """Aligned operands: 16-byte cp.async copies into the software pipeline, wgmma dots."""
    cache, *_ = built_hopper
    for name, stages in ((HOPPER[1], ("fwd",)), (HOPPER[2], ("dkdv", "dq"))):
        entries = _entries(cache, name)
        for stage in stages:
            ptx = entries[stage].files[kernel.PTX_FILE].read_text()
            assert "cp.async.cg.shared.global" in ptx and "wgmma" in ptx, (name, stage)


def test_shared_memory_rule_covers_the_hopper_kernels(built_hopper):
    cache, specs, _ = built_hopper
    for spec in specs:
        for stage, entry in _entries(cache, spec.name).items():
            if stage in ("fwd", "dkdv", "dq"):
                assert entry.metadata["shared_bytes"] <= shared_memory_bytes(spec.config), (spec.name, stage)


WS = "attention_fwd_bf16_d128x128_fwd-ws_128x128_w8_s3_sm90"  # 3 stages: the most shared memory the family takes


@pytest.fixture(scope="module")
def built_ws(private_cache):
    cache = private_cache("attention-ws")
    spec = Registry.from_rule_set("attention", "full", SM90).get(WS)
    results = kernel.build_all([spec], cache, jobs=2, specializations=(AttentionVariant(), AttentionVariant(band=True)))
    return cache, spec, results


def test_the_gluon_forward_compiles_warp_specialised(built_ws):
    """fwd-ws through the Gluon front end: the loader and MMA warps trade registers (setmaxnreg),
    operands arrive by TMA, scores and P V run on warpgroup MMA, within the shared-memory rule."""
    cache, spec, results = built_ws
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    entries = list(cache.entries())
    assert len(entries) == 2 and all(".r168-" in e.key for e in entries)  # plain and band; the cap in the key
    for entry in entries:
        ptx = entry.files[kernel.PTX_FILE].read_text()
        assert ".target sm_90a" in ptx and "setmaxnreg" in ptx, entry.key
        assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx, entry.key
        assert entry.metadata["shared_bytes"] <= shared_memory_bytes(spec.config) <= SM90.shared_memory_per_block_optin


@pytest.mark.parametrize("tile", ["d128x128_bwd-ws_32x128_w8_s3", "d256x256_bwd-ws_32x64_w8_s2"])
def test_the_gluon_backward_stages_compile_warp_specialised(private_cache, tile):
    """Both stages of bwd-ws, the d=256 one with its warpgroups split by role (the largest of
    the family's shared-memory footprints)."""
    cache = private_cache("attention-bwd-ws")
    registry = Registry.from_rule_set("attention", "default", SM90)
    spec = registry.get(f"attention_bwd_bf16_{tile}_sm90")
    results = kernel.build_all([spec], cache, jobs=1, specializations=(AttentionVariant(band=True),))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for stage in ("dkdv", "dq"):
        entry = next(e for e in cache.entries() if e.metadata["stage"] == stage)
        ptx = entry.files[kernel.PTX_FILE].read_text()
        assert "setmaxnreg" in ptx and "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx, stage
        assert entry.metadata["shared_bytes"] <= shared_memory_bytes(spec.config) <= SM90.shared_memory_per_block_optin
