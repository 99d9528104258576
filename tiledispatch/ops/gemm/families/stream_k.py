"""The stream-k family (kernels/stream_k.py, sm_90+): tma-persistent's main loop with the last
wave's K iterations dealt evenly over every program; a tile cut between programs is finished by
the program holding its last K iteration, which adds the others' fp32 partials (flagged in a
workspace) in a fixed order, so results are deterministic."""

from __future__ import annotations

import math

import torch

from ....core.arith import cdiv
from ..config import Family, GemmConfig
from ..family import FAMILIES, GemmFamily, register
from ..problem import GemmProblem
from .. import plan, ranking, rules
from . import realign, tma_persistent

MODULE = f"{plan.KERNELS}.stream_k"
# A stream-K owner loads another program's fp32 partial tile beside its accumulator: on sm_90
# (ptxas, Triton 3.6) accumulators of 64 registers per thread compiled to 192-222 registers,
# those of 128 (128x128 over 4 warps, 128x256 over 8) spilled 100-190 bytes.
STREAM_K_MAX_ACCUMULATOR_REGISTERS = 64
# Stream-K's hand-offs: the flags' zeroing (one memset before the kernel), and each owner's
# read of the other segments' fp32 partial tiles through its SM's port.
STREAM_K_FLAGS_SECONDS = 2e-6


def validate(config: GemmConfig, arch):
    yield from rules.output_tile_findings(config, rules.tensor_core_minimum(config))
    yield from rules.tma_findings(config, arch)
    if config.split_k != 1 or config.epilogue_split != 1 or config.flatten:
        yield rules.error(rules.GemmRule.PERSISTENT_OPTIONS, "stream-k splits K by its own schedule and stores "
                          "whole C tiles", "leave split_k, epilogue_split and flatten at 1, 1 and False "
                          "(or use tma-persistent)")
    yield from rules.shared_memory_findings(config, arch)
    regs = rules.accumulator_registers(config)
    if regs > STREAM_K_MAX_ACCUMULATOR_REGISTERS:
        yield rules.error(rules.GemmRule.REGISTER_BUDGET,
                          f"stream-k adds fp32 partial tiles beside the accumulator: {regs} registers per thread for "
                          f"the {config.block_m}x{config.block_n} accumulator over {config.num_warps} warps would "
                          f"spill", f"at most {STREAM_K_MAX_ACCUMULATOR_REGISTERS}: more warps or a smaller tile")
    yield from rules.register_findings(config, arch)
    yield from rules.dtype_findings(config, arch)


def stream_k_split(tiles: int, k_tiles: int, sms: int) -> tuple[int, int]:
    """(programs, stream-K tiles): the tiles of a last, partial wave have their K iterations
    dealt over every program; the rest are whole tiles, an equal number per program. At
    most one program per K iteration, so none is left without work."""
    programs = min(sms, tiles * k_tiles)
    return programs, tiles % programs


def kernel_units(config: GemmConfig, alignment, arch=None):
    main = tma_persistent.main_unit(config, alignment, MODULE, "gemm_stream_k", {},
                                    scratch=(("ws_ptr", "*fp32"), ("flags_ptr", "*i32")),
                                    dealt=(("sk_tiles", "i32"),))
    return plan.with_reduce(config, alignment, main)


def _scratch(config: GemmConfig, programs: int, sk_tiles: int, device) -> dict:
    """Stream-K's partial sums (a start and an end segment per program) and their ready flags,
    which start as zeros. Without stream-K tiles the kernel touches neither: one element each
    stands in, and nothing needs zeroing (on a replay either: the plan leaves it out of `zeroed`)."""
    if not sk_tiles:
        return {"ws_ptr": torch.empty(1, dtype=torch.float32, device=device),
                "flags_ptr": torch.empty(1, dtype=torch.int32, device=device), "sk_tiles": 0}
    return {"ws_ptr": torch.empty((programs, 2, config.block_m, config.block_n), dtype=torch.float32, device=device),
            "flags_ptr": torch.zeros((programs, 2), dtype=torch.int32, device=device), "sk_tiles": sk_tiles}


def _schedule(config: GemmConfig, p: GemmProblem, tiles: int, sms: int, device) -> tuple[int, dict, tuple]:
    programs, sk_tiles = stream_k_split(tiles, cdiv(p.k, config.block_k), sms)
    scratch = _scratch(config, programs, sk_tiles, device)
    return programs, scratch, (scratch["flags_ptr"],) if sk_tiles else ()


def launch_plan(config: GemmConfig, ops):
    return plan.persistent_plan(config, ops, plan.descriptor_blocks(config), _schedule)


def dealt(config: GemmConfig, p: GemmProblem, arch) -> ranking.DealtLoad:
    """What each program of the grid does (every program the same K iterations)."""
    tiles = math.ceil(p.m / config.block_m) * math.ceil(p.n / config.block_n) * p.batch
    k_tiles = math.ceil(p.k / config.block_k)
    programs, sk_tiles = stream_k_split(tiles, k_tiles, arch.sm_count)
    # Each program's range is one segment, plus one for each of the sk_tiles - 1 tile
    # boundaries that fall inside a range.
    loops = tiles // programs + ((1 + (sk_tiles - 1) / programs) if sk_tiles else 0)
    partials = math.ceil(programs / sk_tiles) if sk_tiles else 0  # partial tiles an owner adds
    handoff_s = (STREAM_K_FLAGS_SECONDS
                 + partials * config.block_m * config.block_n * 4 / arch.calibration.tma_port_bytes_per_s)
    return ranking.DealtLoad(programs, tiles * k_tiles / programs, loops, handoff_s)


KERNEL = ranking.TileKernel(tma_persistent.TMA_FRACTION, ranking.TMA_BANDWIDTH_FRACTION, persistent=True,
                            dealt=dealt)


def device_score(config: GemmConfig, problem, arch):
    return ranking.tile_score(config, problem, arch, KERNEL)


def host_launches(config: GemmConfig, problem) -> int:
    return ranking.split_launches(config, problem) + 1  # and the flags' zeroing


FAMILY = register(realign.variant(GemmFamily(
    op=FAMILIES.op, name=Family.STREAM_K.value, config_type=GemmConfig, validate=validate,
    supports=rules.tma_tile_reason, score=ranking.rule_score, kernel_units=kernel_units, plan=launch_plan,
    correction=rules.tile_correction, device_score=device_score, host_launches=host_launches,
    shared_memory_bytes=tma_persistent.shared_memory_bytes, accumulator_registers=tma_persistent.accumulator_registers,
    fits=rules.tma_fits, uses_tma=True, tile_kernel=KERNEL,
)))
