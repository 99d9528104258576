"""The ws-persistent family (kernels/ws_persistent.py, sm_90, Gluon): a loader warp keeps a ring
of TMA buffers full while two MMA warpgroups each compute half of every tile, persistent over
tiles; rcr products in 16-bit and fp8, with fp8 scales, bias and activation on 128x128 tiles, a
residual left to tma-persistent. ws-pingpong, its twin with each warpgroup on tiles of its own,
shares its rules, unit and terms (`ws_findings`, `ws_unit`, `ws_fits`, `WS_FRACTION`)."""

from __future__ import annotations

from .... import arch as arch_facts
from ....core.dtypes import DType
from ....core.op import KernelUnit, UnitKind
from ..config import Family, GemmConfig
from ..family import FAMILIES, GemmFamily, register
from ..problem import Activation, Alignment, GemmLayout, Layout
from .. import plan, ranking, rules
from ..rules import GemmRule, error
from . import realign

WS_BARRIER_BYTES = 1024  # ws-persistent's ring barriers (sm_90 compiles: the tiles and staging + 240 B)
# The warp-specialised families' epilogue runs in the MMA warpgroups' registers: with bias and GELU,
# 128x256 tiles (128 accumulator registers a thread) spilled 208 B and ran 0.71-0.85x cuBLAS plus
# PyTorch's steps, where 128x128 tiles (64) ran 1.07-1.29x
# (results/h100/gemm_epilogue_spilling_tiles.csv).
WS_EPILOGUE_REGISTERS = 64
# On the H100 sweep (results/h100/gemm_sweep_ws.csv) its 128x256x64 tile over 3 stages ran
# 1.02-1.055x the tma pick (128x256x64 over 4) in bf16, and in fp8 its 128x256 tiles 1.06-1.11x
# tma's, where each program walks many tiles; with the tile overhead of a non-flattened loop (its
# epilogue is not overlapped, see ranking._persistent_terms) that is this fraction. On a single
# wave (llama3_8b_o_T1024) it ran 0.96-0.99x: the partitions' start and the split tile cost about
# a microsecond and a half a call.
WS_FRACTION = 0.90
WS_START_SECONDS = 1.5e-6
_K_MAJOR = GemmLayout.parse("rcr")


def _always(config: GemmConfig) -> bool:
    return True


# Its loader runs ahead across tiles (the latency chain fills once), but both warpgroups store
# each tile before the next one's MMAs: batched_attn_scores (K = 128) ran 0.87-0.89x cuBLAS with
# its 128x128 tile where tma-persistent's flattened 128x256 ran 0.94-1.0x.
KERNEL = ranking.TileKernel(WS_FRACTION, ranking.TMA_BANDWIDTH_FRACTION, persistent=True,
                            start_seconds=WS_START_SECONDS, fills_once=_always)


def ws_findings(config: GemmConfig, arch, rows: tuple[int, int]):
    """The warp-specialised families are Gluon written for sm_90's warpgroup MMA: two warpgroups
    of 4 warps, on half of each tile's rows (ws-persistent: 64 or 128 each) or on tiles of their
    own (ws-pingpong: 64 or 128 rows), A and B K-major (nn.Linear's weight is), 16-bit or fp8
    operands into fp32, and every epilogue but a residual (bias and activation on 128x128 tiles).
    `rows`: the block_m it takes."""
    t, family = config.types, config.family.value
    if not arch.has(arch_facts.Feature.WGMMA):
        yield error(GemmRule.FAMILY_ARCH, f"{family} is written for Hopper's warpgroup MMA (sm_90); {arch.name} "
                    "has none", "use tma-persistent or the tiled family")
    if (config.layout.a, config.layout.b) != (Layout.ROW, Layout.COL):
        yield error(GemmRule.LAYOUT, f"{family} reads A and B K-major (layout rcr), not {config.layout.name}",
                    "use tma-persistent")
    if t.a is DType.FP32 or t.acc is not DType.FP32:
        yield error(GemmRule.PERSISTENT_OPTIONS, f"{family} computes 16-bit or fp8 products into fp32, not {t.name}",
                    "use tma-persistent (tf32) or the tiled family")
    if config.epilogue.residual:
        yield error(GemmRule.PERSISTENT_OPTIONS, f"{family} adds no residual: beside a warpgroup's accumulator its "
                    "addresses spill (sm_90, 128x256 tiles: 2.8 KB a thread with bias and GELU)", "use tma-persistent")
    regs = rules.accumulator_registers(config)
    if (config.epilogue.bias or config.epilogue.activation is not Activation.NONE) and regs > WS_EPILOGUE_REGISTERS:
        yield error(GemmRule.REGISTER_BUDGET, f"{family} applies bias and activation beside the accumulator: {regs} "
                    f"registers a thread for the {config.block_m}x{config.block_n} tile spill (at most "
                    f"{WS_EPILOGUE_REGISTERS})", "a 128x128 tile")
    if config.split_k != 1 or config.epilogue_split != 1 or config.flatten:
        yield error(GemmRule.PERSISTENT_OPTIONS, f"{family} stores whole tiles by warpgroup, over the whole of K",
                    "leave split_k, epilogue_split and flatten at 1, 1 and False")
    if config.num_warps != 8 or config.block_m not in rows:
        yield error(GemmRule.WS_OPTIONS, f"{family} runs two MMA warpgroups of 4 warps: num_warps=8 and block_m "
                    f"{rows[0]} or {rows[1]}, not {config.num_warps} warps on {config.block_m} rows",
                    f"num_warps=8, block_m={rows[0]} or {rows[1]}")


def validate(config: GemmConfig, arch):
    yield from rules.output_tile_findings(config, rules.tensor_core_minimum(config))
    yield from rules.tma_findings(config, arch)
    yield from ws_findings(config, arch, (128, 256))
    yield from rules.resource_and_dtype_findings(config, arch)


def ws_fits(config: GemmConfig) -> bool:
    """Both operands K-major, 16-bit or fp8 into fp32, no residual; and what every TMA family needs."""
    t = config.types
    if config.layout != _K_MAJOR or t.a is DType.FP32 or t.acc is not DType.FP32 or config.epilogue.residual:
        return False
    return rules.tma_fits(config)


def shared_memory_bytes(config: GemmConfig) -> int:
    return rules.pipeline_bytes(config, rules.c_staging_bytes(config) + WS_BARRIER_BYTES)


def accumulator_registers(config: GemmConfig) -> int:
    return rules.tile_registers(config, config.num_warps)


def ws_unit(config: GemmConfig, alignment: Alignment, arch: arch_facts.ArchInfo | None, module: str,
            function: str, rows: int | None) -> KernelUnit:
    """The Gluon families' one unit; A's and C's descriptors cover `rows` rows (None: block_m). Each
    launches as one warpgroup (the first MMA partition); the second and the loader's warp are
    added by `warp_specialize`, so the launch's registers are capped at what all three
    warpgroups share (the partitions then move them by setmaxnreg)."""
    from triton.experimental.gluon import language as gl

    t = config.types
    dtypes = {"a_desc": t.a, "b_desc": t.b, "c_desc": t.c}
    descriptors = [(name, f"tensordesc<{dtypes[name].triton}[{','.join(map(str, block))}],"
                          f"{gl.NVMMASharedLayout.get_default_for(list(block), gl.dtype(dtypes[name].triton))!r}>")
                   for name, block in plan.descriptor_blocks(config, rows).items()]
    args = descriptors + [
        ("bias_ptr", f"*{t.c.triton}"), ("res_ptr", f"*{t.c.triton}"), ("scale_a_ptr", "*fp32"),
        ("scale_b_ptr", "*fp32"), ("M", "i32"), ("N", "i32"), ("K", "i32"), ("batch", "i32"),
        ("a_batch_step", "i32"), ("b_batch_step", "i32"), *plan.EPILOGUE_STRIDES,
    ]
    constexprs = {"GROUP_M": config.group_m, "STAGES": config.num_stages, **plan.epilogue_constexprs(config)}
    signature = tuple(args + [(name, "constexpr") for name in constexprs])
    threads = (config.num_warps + 4) * 32  # the MMA warpgroups and the loader's (registers go by warpgroup)
    # No arch: the one the Gluon families are written for (the one with warpgroup MMA).
    arch = arch or next(a for a in map(arch_facts.load, arch_facts.available()) if a.has(arch_facts.Feature.WGMMA))
    return KernelUnit(
        stage="main", module=module, function=function, signature=signature,
        constexprs=tuple(sorted(constexprs.items())), num_warps=4, num_stages=1,
        divisibility=plan.divisibility(alignment, t, signature, False), kind=UnitKind.GLUON,
        max_registers=arch.registers_per_sm // threads // 8 * 8,
    )


def _rows(config: GemmConfig) -> int:
    return config.block_m // 2  # A and C by warpgroup: half a tile's rows each


def kernel_units(config: GemmConfig, alignment: Alignment, arch=None) -> tuple[KernelUnit, ...]:
    return (ws_unit(config, alignment, arch, f"{plan.KERNELS}.ws_persistent", "gemm_ws_persistent", _rows(config)),)


def launch_plan(config: GemmConfig, ops):
    return plan.persistent_plan(config, ops, plan.descriptor_blocks(config, _rows(config)))


def device_score(config: GemmConfig, problem, arch):
    return ranking.tile_score(config, problem, arch, KERNEL)


FAMILY = register(realign.variant(GemmFamily(
    op=FAMILIES.op, name=Family.WS_PERSISTENT.value, config_type=GemmConfig, validate=validate,
    supports=rules.tma_tile_reason, score=ranking.rule_score, kernel_units=kernel_units, plan=launch_plan,
    correction=rules.tile_correction, device_score=device_score, host_launches=ranking.split_launches,
    shared_memory_bytes=shared_memory_bytes, accumulator_registers=accumulator_registers,
    fits=ws_fits, uses_tma=True, warp_specialised=True, tile_kernel=KERNEL,
)))
