"""The `rules` score of a GEMM config for a problem: a small time model, no timing.

time = max(compute, memory) + split-K reduction, where compute is stretched by the
padding of edge tiles (M, N, K), the idle slots of the last wave, and the operand
traffic of small tiles. Score = ideal time / modelled time, in (0, 1].
"""

from __future__ import annotations

import math

from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.analytic import blocks_per_sm, tile_efficiency, wave_efficiency
from .config import GemmConfig
from .problem import GemmProblem, Layout
from .rules import REGISTER_RESERVE, accumulator_registers, shared_memory_bytes

LAUNCH_SECONDS = 4e-6  # one extra kernel launch, as measured for Triton on an H200 (ANCHORS.md)
L2_REUSE = 4.0  # grouped tile order serves operand re-reads from L2 at about this multiple of HBM
GENERIC_LAYOUT_PENALTY = 0.97  # a specialised (contiguous) layout beats generic strides


def _peak_flops(problem: GemmProblem, arch) -> float:
    t = problem.types
    if t.a is DType.FP32 and not t.allow_tf32:
        return arch.peak_tflops[DType.FP32] * 1e12 / 8  # no tensor cores: FMA rate
    dtype = t.a if arch.supports_dtype(t.a) else DType.FP16
    return arch.peak_tflops.get(dtype, max(arch.peak_tflops.values())) * 1e12


def rule_score(config: GemmConfig, problem: GemmProblem, arch) -> Score:
    p, t = problem, problem.types
    bandwidth = arch.memory_bandwidth_gbs * 1e9
    peak = _peak_flops(p, arch)

    k_span = config.block_k * config.split_k
    waste = {
        "tile_m": tile_efficiency(p.m, config.block_m),
        "tile_n": tile_efficiency(p.n, config.block_n),
        "tile_k": tile_efficiency(p.k, k_span) if p.k >= k_span else p.k / (math.ceil(p.k / config.block_k) * config.block_k),
    }
    threads = config.num_warps * 32
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=accumulator_registers(config) + REGISTER_RESERVE)
    tiles = math.ceil(p.m / config.block_m) * math.ceil(p.n / config.block_n) * p.batch * config.split_k
    waves = wave_efficiency(tiles, arch.sm_count * resident)
    # Operand bytes each tile pulls per FLOP, against what L2-assisted bandwidth can feed.
    intensity = 2 * config.block_m * config.block_n / ((config.block_m + config.block_n) * t.a.itemsize)
    feed = min(1.0, intensity * bandwidth * L2_REUSE / peak)
    # One resident program cannot hide its own load latency: a little credit for two or more.
    latency = 1.0 if resident >= 2 or config.num_stages >= 3 else 0.85

    efficiency = waste["tile_m"] * waste["tile_n"] * waste["tile_k"] * waves * feed * latency
    compute_s = p.flops() / (peak * efficiency)
    memory_s = p.bytes() / bandwidth
    reduce_s = 0.0
    if config.split_k > 1:
        reduce_s = 2 * config.split_k * p.batch * p.m * p.n * 4 / bandwidth + LAUNCH_SECONDS
    modelled = max(compute_s, memory_s) + reduce_s
    ideal = max(p.flops() / peak, memory_s)
    value = ideal / modelled
    if Layout.STRIDED in (config.layout.a, config.layout.b, config.layout.c) and config.layout != p.layout:
        value *= GENERIC_LAYOUT_PENALTY
    terms = {**waste, "waves": waves, "feed": feed, "latency": latency, "resident": float(resident),
             "modelled_us": modelled * 1e6}
    return Score(value, terms)
