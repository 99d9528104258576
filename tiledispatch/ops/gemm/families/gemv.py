"""The gemv family (kernels/gemv.py): one row of A (M = 1), the decode step of a language model.
B is streamed through the CUDA cores in long runs of each column, whole K per program (never
split), one launch, `num_stages` K steps loaded together; the rule sets register a tile per
element size of B."""

from __future__ import annotations

import math
from dataclasses import replace

from ....core.op import Score
from ....heuristics.analytic import blocks_per_sm, tile_efficiency
from ....heuristics.roofline import dram_bytes_per_s, fma_flops, soft_max
from ..config import Family, GemmConfig
from ..family import FAMILIES, GemmFamily, register
from ..problem import GemmProblem, Layout
from .. import plan, ranking, rules
from ..rules import GemmRule, accumulator_registers, shared_memory_bytes
from . import realign

MODULE = f"{plan.KERNELS}.gemv"
# gemv streams B through the CUDA cores: on the H100 (results/h100/gemm_decode.csv) it moved 0.92
# and 0.94 of the 3.35 TB/s on llama3_8b_up_T1 and llama3_70b_up_T1 (235 and 940 MB), launch
# included, where cuBLAS moved 0.86.
GEMV_BANDWIDTH_FRACTION = 0.92
# Each B element costs a conversion to fp32 beside its FMA.
GEMV_FMA_FRACTION = 0.5
# A DRAM read moves whole 32-byte sectors: shorter runs of B along its contiguous dim waste the
# rest. Longer runs still pay up to about 2 KB a column step: on the H100 sweep, tiles of 128-byte
# runs ran 0.84-0.88x the best, of 512 bytes 0.86-0.94x, of 1 KB 0.90-0.97x (mean by dtype):
# min(1, run / 2 KB) ** 0.07.
SECTOR_BYTES = 32
GEMV_RUN_BYTES = 2048
GEMV_RUN_EXPONENT = 0.07
# Registers a gemv program holds besides its accumulator: addresses, one step of A and B.
GEMV_REGISTER_RESERVE = 32
# The bytes a multiprocessor's gemv programs must have requested to keep its share of DRAM busy: a
# kernel term fitted to the gemv kernels alone, beside the machine's bytes_in_flight_per_sm that the
# tiled kernels read. On the H100 sweep, fp8 1x1x2048 tiles over 4 warps (about 10 resident, 20 KB)
# kept pace with tiles of 8x more bytes a step.
GEMV_BYTES_IN_FLIGHT_PER_SM = 16 * 1024


def _minimum(config: GemmConfig) -> list:
    """gemv computes one row with CUDA-core FMAs over whole columns of B: no tensor-core minimum,
    but one row and no split."""
    if config.block_m != 1 or config.split_k != 1 or config.block_k < 16:
        return [rules.error(GemmRule.GEMV_OPTIONS,
                            f"gemv reduces one row of A over the whole of K in steps of >= 16: block_m=1, "
                            f"split_k=1, not {config.block_m}x{config.block_n}x{config.block_k} with "
                            f"split_k={config.split_k}", "block_m=1, split_k=1, block_k >= 16 (or the tiled family)")]
    return []


def validate(config: GemmConfig, arch):
    # its work per program is a K step of each column
    yield from rules.tile_findings(config, _minimum(config), config.block_m * config.block_n * config.block_k,
                                   f"{config.block_n}x{config.block_k} step")
    yield from rules.pointer_options(config)
    yield from rules.resource_and_dtype_findings(config, arch)


_CHOICES = {**rules.CHOICES, "block_m": (1,), "block_n": (1, 2, 4, 8, 16, 32, 64),
            "block_k": (16, 32, 64, 128, 256, 512, rules.MAX_BLOCK_K)}


def correction(config: GemmConfig):
    return rules.tile_correction(config, _CHOICES, split_k=1)


def supports(config: GemmConfig, problem: GemmProblem) -> str | None:
    reason = rules.triton_reason(config, problem)
    if reason is None and problem.m != 1:
        reason = f"gemv computes one row of A (M = 1); this problem has M={problem.m}: use the tiled family"
    return reason or rules.split_reason(config, problem)


def shared_memory_bytes_of(config: GemmConfig) -> int:
    return 0  # its steps are loaded into registers (the final sum's scratch is small)


def accumulator_registers_of(config: GemmConfig) -> int:
    """A K step per column, beside the `num_stages` steps of B it loads ahead."""
    threads = config.num_warps * 32
    loaded = config.num_stages * config.block_n * config.block_k * config.types.b.itemsize / 4
    return math.ceil(config.block_n * config.block_k / threads) + math.ceil(loaded / threads)


def kernel_units(config: GemmConfig, alignment, arch=None):
    """gemv's stages are K steps loaded together by the kernel itself (STEPS), not Triton's pipeline."""
    constexprs = {"BLOCK_N": config.block_n, "BLOCK_K": config.block_k, "STEPS": config.num_stages,
                  **plan.epilogue_constexprs(config)}
    return (replace(plan.pointer_unit(config, alignment, MODULE, "gemm_gemv", constexprs), num_stages=1),)


def device_score(config: GemmConfig, problem: GemmProblem, arch) -> Score:
    """One row of A against B: the larger of B's stream (bytes in flight, sectors used), the
    busiest SM's intake and the FMAs.

    No latency chain: no load waits on an earlier step's result, and on the H100 sweep one and
    two stages ran within 1 % of each other; the resident programs' bytes in flight (Little's
    law) are what bound the stream. Which gemv tile streams fastest the model does not tell
    (on the sweep the tiles of long runs were within 10 % of each other, in an order the model
    did not give): the rule sets register the measured best per element size."""
    p, t = problem, problem.types
    threads = config.num_warps * 32
    registers = accumulator_registers(config) + GEMV_REGISTER_RESERVE
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=min(registers, arch.registers_per_thread_max))
    programs = math.ceil(p.n / config.block_n) * p.batch
    per_sm = programs / arch.sm_count
    # A column's steps are adjacent along K: loaded together, they read one run of block_k x steps.
    run = {Layout.COL: config.block_k * config.num_stages, Layout.ROW: config.block_n}.get(p.layout.b, 1) * t.b.itemsize
    row = min(1.0, run / SECTOR_BYTES) * min(1.0, run / GEMV_RUN_BYTES) ** GEMV_RUN_EXPONENT
    step_bytes = config.num_stages * config.block_n * config.block_k * t.b.itemsize  # its steps load together
    in_flight = min(1.0, step_bytes * min(resident, max(per_sm, 1.0)) / GEMV_BYTES_IN_FLIGHT_PER_SM)
    in_flight *= min(1.0, per_sm * ranking.SM_BANDWIDTH_SHARE) * row
    if not (p.alignment.a and p.alignment.b):
        in_flight *= ranking.UNALIGNED_LOAD_FRACTION
    bandwidth = dram_bytes_per_s(arch) * GEMV_BANDWIDTH_FRACTION
    # Each program reads its columns of B; A's row, read by every program, stays in the SM's L1.
    port = arch.calibration.sm_port_bytes_per_s
    intake_s = (math.ceil(per_sm) * config.block_n + 1) * p.k * t.b.itemsize / port
    memory_s = soft_max(p.bytes() / (bandwidth * in_flight), intake_s)
    compute_s = p.flops() / (fma_flops(arch) * GEMV_FMA_FRACTION)
    modelled = soft_max(compute_s, memory_s) + arch.calibration.launch_s
    value = ranking.problem_ideal_seconds(p, arch) / modelled
    value *= ranking.layout_penalty(config, p)
    terms = {"tile_m": 1.0, "tile_n": tile_efficiency(p.n, config.block_n),
             "tile_k": tile_efficiency(p.k, config.block_k),
             "waves": min(1.0, per_sm), "feed": 1.0, "latency": 1.0, "resident": float(resident), "row": row,
             "in_flight": in_flight, "spills": 0.0, "modelled_us": modelled * 1e6}
    return Score(value, terms)


FAMILY = register(realign.variant(GemmFamily(
    op=FAMILIES.op, name=Family.GEMV.value, config_type=GemmConfig, validate=validate,
    supports=supports, score=ranking.rule_score, kernel_units=kernel_units, plan=plan.pointer_plan,
    correction=correction, device_score=device_score, host_launches=ranking.split_launches,
    shared_memory_bytes=shared_memory_bytes_of, accumulator_registers=accumulator_registers_of,
)))
