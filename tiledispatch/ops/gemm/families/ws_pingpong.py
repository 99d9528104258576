"""The ws-pingpong family (kernels/ws_pingpong.py, sm_90, Gluon): ws-persistent with each MMA
warpgroup on whole tiles of its own, in turns, so that one stores while the other computes. Its
rules, unit and model are ws-persistent's (`ws_persistent.ws_findings`, `ws_unit`, `ws_fits`),
with 64 or 128 rows a tile, a staging buffer a warpgroup and four warps to an accumulator."""

from __future__ import annotations

from ..config import Family, GemmConfig
from ..family import FAMILIES, GemmFamily, register
from ..problem import Alignment
from .. import plan, ranking, rules
from . import realign, ws_persistent


def _always(config: GemmConfig) -> bool:
    return True


# Its warpgroups store while the other computes: the loop runs on across tiles, filling once.
KERNEL = ranking.TileKernel(ws_persistent.WS_FRACTION, ranking.TMA_BANDWIDTH_FRACTION, persistent=True,
                            start_seconds=ws_persistent.WS_START_SECONDS, loops_across_tiles=_always,
                            fills_once=_always)


def validate(config: GemmConfig, arch):
    yield from rules.output_tile_findings(config, rules.tensor_core_minimum(config))
    yield from rules.tma_findings(config, arch)
    yield from ws_persistent.ws_findings(config, arch, (64, 128))
    yield from rules.resource_and_dtype_findings(config, arch)


def shared_memory_bytes(config: GemmConfig) -> int:
    """Each warpgroup stages a whole tile of its own."""
    return rules.pipeline_bytes(config, rules.c_staging_bytes(config) * 2 + ws_persistent.WS_BARRIER_BYTES)


def accumulator_registers(config: GemmConfig) -> int:
    return rules.tile_registers(config, 4)  # one warpgroup holds a whole tile


def kernel_units(config: GemmConfig, alignment: Alignment, arch=None):
    return (ws_persistent.ws_unit(config, alignment, arch, f"{plan.KERNELS}.ws_pingpong", "gemm_ws_pingpong", None),)


def launch_plan(config: GemmConfig, ops):
    return plan.persistent_plan(config, ops, plan.descriptor_blocks(config))


def device_score(config: GemmConfig, problem, arch):
    return ranking.tile_score(config, problem, arch, KERNEL)


FAMILY = register(realign.variant(GemmFamily(
    op=FAMILIES.op, name=Family.WS_PINGPONG.value, config_type=GemmConfig, validate=validate,
    supports=rules.tma_tile_reason, score=ranking.rule_score, kernel_units=kernel_units, plan=launch_plan,
    correction=rules.tile_correction, device_score=device_score, host_launches=ranking.split_launches,
    shared_memory_bytes=shared_memory_bytes, accumulator_registers=accumulator_registers,
    fits=ws_persistent.ws_fits, uses_tma=True, warp_specialised=True, tile_kernel=KERNEL,
)))
