"""The ws-persistent family (Gluon, sm_90 only): its rules, its place in the rule sets, its
compiled form for sm_90 on this GPU-less machine, and where the ranking sends it.

Gluon kernels do not run under the interpreter; their results are checked on the GPU
(test_gpu.py: test_every_warp_specialised_tile, test_warp_specialised_epilogues). ws-pingpong
shares its rules, and one of its tiles is compiled here too.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tiledispatch import Dispatcher, Registry, arch
from tiledispatch.core import kernel
from tiledispatch.core.dtypes import DType
from tiledispatch.core.op import UnitKind
from tiledispatch.ops.gemm.config import Family, GemmConfig
from tiledispatch.ops.gemm.plan import kernel_units
from tiledispatch.ops.gemm.problem import Activation, Epilogue, GemmLayout, GemmProblem, GemmTypes
from tiledispatch.ops.gemm.rules import GemmRule, auto_correct, shared_memory_bytes, validate

SM80, SM90 = arch.load("sm_80"), arch.load("sm_90")
BF16 = GemmTypes(DType.BF16, DType.BF16, DType.BF16)
FP8 = GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16)
RCR = GemmLayout.parse("rcr")
WS = GemmConfig(Family.WS_PERSISTENT, BF16, RCR, Epilogue(), 128, 256, 64, 8, 8, 3)


def test_a_default_tile_is_valid_on_sm90_only():
    assert validate(WS, SM90).ok  # (a warning: 128 accumulator registers a thread, as tma-persistent's tile)
    assert GemmRule.FAMILY_ARCH in validate(WS, SM80).broken_rules()


@pytest.mark.parametrize("changes, rule, words", [
    (dict(num_warps=4), GemmRule.WS_OPTIONS, ["two MMA warpgroups", "num_warps=8"]),
    (dict(block_m=64, block_n=128), GemmRule.WS_OPTIONS, ["64 rows"]),
    (dict(layout=GemmLayout.parse("rrr")), GemmRule.LAYOUT, ["K-major", "rcr", "rrr"]),
    (dict(epilogue=Epilogue(True, Activation.GELU, True)), GemmRule.PERSISTENT_OPTIONS,
     ["no residual", "spill", "tma-persistent"]),
    (dict(split_k=2), GemmRule.PERSISTENT_OPTIONS, ["whole of K"]),
    (dict(epilogue=Epilogue(True, Activation.GELU, False)), GemmRule.REGISTER_BUDGET,
     ["bias and activation", "128 registers", "spill"]),
    (dict(types=GemmTypes(DType.FP32, DType.FP32, DType.FP32, allow_tf32=True)), GemmRule.PERSISTENT_OPTIONS,
     ["16-bit or fp8"]),
])
def test_what_the_family_refuses(changes, rule, words):
    result = validate(replace(WS, **changes), SM90)
    assert rule in result.broken_rules()
    message = " ".join(str(f) for f in result.errors if f.rule is rule)
    for word in words:
        assert word in message, (word, message)


def test_auto_correct_restores_two_warpgroups():
    fixed, corrections = auto_correct(replace(WS, num_warps=4), SM90)
    assert fixed == WS
    assert [(c.field, c.old, c.new) for c in corrections] == [("num_warps", 4, 8)]


def test_shared_memory_counts_the_ring_both_staging_halves_and_the_barriers():
    # 3 stages of A (128x64) and B (256x64) in bf16, C's two 64x256 halves, the barriers.
    assert shared_memory_bytes(WS) == 3 * (128 + 256) * 64 * 2 + 128 * 256 * 2 + 1024
    four = replace(WS, num_stages=4)  # 4 stages do not fit beside the staging buffers
    assert GemmRule.SHARED_MEMORY in validate(four, SM90).broken_rules()


def test_rule_sets_bind_it_to_rcr_16_bit_and_fp8_without_residual():
    registry = Registry.from_rule_set("gemm", "default", SM90)
    ws = [s.config for s in registry if s.config.family is Family.WS_PERSISTENT]
    assert ws
    assert {c.layout.name for c in ws} == {"rcr"}
    assert all(not c.epilogue.residual and c.types.a is not DType.FP32 for c in ws)
    assert {c.epilogue.activation for c in ws} == set(Activation) and any(c.epilogue.bias for c in ws)
    assert all(c.block_m * c.block_n <= 128 * 128 for c in ws if not c.epilogue.plain)  # WS_EPILOGUE_REGISTERS
    assert {c.types.a for c in ws} >= {DType.BF16, DType.FP16, DType.FP8E4M3}
    assert not [s for s in Registry.from_rule_set("gemm", "default", SM80) if s.family == "ws-persistent"]


def test_its_unit_is_a_gluon_kernel_of_half_tile_descriptors():
    (unit,) = kernel_units(WS)
    assert unit.kind is UnitKind.GLUON and unit.num_warps == 4
    # Three warpgroups (two MMA, the loader's padded to one) share the register file at launch.
    assert unit.max_registers == SM90.registers_per_sm // (3 * 128) // 8 * 8
    types = dict(unit.signature)
    assert types["a_desc"].startswith("tensordesc<bf16[1,64,64]")
    assert types["b_desc"].startswith("tensordesc<bf16[1,256,64]")
    assert types["c_desc"].startswith("tensordesc<bf16[1,64,256]")


def _big(m, n, k, types=BF16) -> GemmProblem:
    return GemmProblem(m, n, k, types=types, layout=RCR)


def test_triton_selection_takes_it_where_programs_walk_many_tiles():
    """On the H100 (results/h100/gemm_sweep_ws.csv) it led on the large cases and trailed
    tma-persistent on a single wave of tiles (llama3_8b_o_T1024)."""
    registry = Registry.from_rule_set("gemm", "default", SM90).filter(lambda s: s.family != "vendor")
    dispatcher = Dispatcher(registry, SM90)
    for problem in (_big(8192, 8192, 8192), _big(16384, 6144, 4096), _big(4096, 14336, 4096, FP8)):
        assert dispatcher.select(problem).family == "ws-persistent", problem
    assert dispatcher.select(_big(1024, 4096, 4096)).family == "tma-persistent"


@pytest.fixture(scope="module")
def built(private_cache):
    cache = private_cache("ws-build")
    registry = Registry.from_rule_set("gemm", "default", SM90)
    names = ["gemm_bf16_rcr_ws-persistent_128x256x64_w8_s3_g8_k1_none_sm90",
             "gemm_fp8e4m3-bf16_rcr_ws-persistent_128x256x128_w8_s3_g8_k1_none_sm90",
             "gemm_fp16_rcr_ws-persistent_128x128x64_w8_s6_g8_k1_bias-gelu_sm90"]
    pingpong = GemmConfig(Family.WS_PINGPONG, FP8, RCR, Epilogue(), 128, 128, 128, 8, 8, 5)
    specs = [registry.get(name) for name in names] + list(Registry.from_configs("gemm", [pingpong], SM90))
    return cache, specs, kernel.build_all(specs, cache, jobs=2)


def test_it_compiles_for_sm90_with_wgmma_and_register_moves(built):
    cache, specs, results = built
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    entries = list(cache.entries())
    assert {e.key.split(".")[0] for e in entries} == {s.name for s in specs}  # each in its AOT specialisations
    for entry in entries:
        ptx = entry.files[kernel.PTX_FILE].read_text()
        assert ".target sm_90" in ptx and "wgmma.mma_async" in ptx
        assert "setmaxnreg" in ptx  # the partitions' register split
        spec = next(s for s in specs if entry.key.startswith(s.name + "."))
        # The SHARED_MEMORY rule must not admit what fails at load time on the GPU.
        assert entry.metadata["shared_bytes"] <= shared_memory_bytes(spec.config), entry.key
