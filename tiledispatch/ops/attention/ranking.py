"""The `rules` score of an attention config for a problem: a small time model, no timing.

time = max(compute, memory) / the fraction of peak the family reaches, where compute is
stretched by the padding of the head dims and of the last query and key blocks, the
masked work of the blocks on a causal or window band's edge, the idle slots of the last
wave, and the K/V traffic of small query blocks. Score = ideal time / modelled time.
"""

from __future__ import annotations

import triton

from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.analytic import blocks_per_sm, wave_efficiency
from .config import AnyAttentionConfig, Family, VendorConfig
from .problem import AttentionProblem, Direction
from .rules import REGISTER_RESERVE, accumulator_registers, padded, shared_memory_bytes

LAUNCH_SECONDS = 4e-6  # one extra kernel launch (ANCHORS.md: Triton on an H200)
# Fractions of the dense tensor-core peak each path reaches at its best. The vendor ones
# are ANCHORS.md's H200 measurements at D=128 (cuDNN 574 and FA2 343 TFLOP/s forward,
# 529 and 308 forward+backward, of 989); the Triton ones are priors until the H200 run
# of benchmarks/attention.py replaces them.
FRACTION = {
    (Family.FWD, Direction.FORWARD): 0.50,
    (Family.BWD, Direction.BACKWARD): 0.36,
    (Family.BWD_ATOMIC, Direction.BACKWARD): 0.40,
    (Family.SDPA_CUDNN, Direction.FORWARD): 0.58,
    (Family.SDPA_FLASH, Direction.FORWARD): 0.35,
    (Family.SDPA_FLASH, Direction.BACKWARD): 0.30,
    (Family.SDPA_CUDNN, Direction.BACKWARD): 0.50,
}
VENDOR_CALL_SECONDS = 8e-6  # SDPA's dispatch and checks on the host
L2_REUSE = 4.0  # K/V re-reads by neighbouring query blocks come from L2 at about this multiple of HBM


def _peak_flops(problem: AttentionProblem, arch) -> float:
    dtype = problem.dtype if arch.supports_dtype(problem.dtype) else DType.FP16
    peak = arch.peak_tflops.get(dtype, max(arch.peak_tflops.values())) * 1e12
    return peak / 8 if problem.dtype is DType.FP32 else peak  # fp32 runs exact (ieee), not as tf32


def _ideal_seconds(problem: AttentionProblem, arch) -> float:
    return max(problem.flops() / _peak_flops(problem, arch), problem.bytes() / (arch.memory_bandwidth_gbs * 1e9))


def computed_pairs(problem: AttentionProblem, block_m: int, block_n: int) -> int:
    """(query, key) pairs the kernel computes: whole blocks over each query block's key range."""
    lengths = problem.seqlens or ((problem.seqlen_q, problem.seqlen_kv),) * problem.batch
    total = 0
    for sq, skv in (lengths if problem.seqlens else lengths[:1]):
        offset, left, right = problem.band(sq, skv)
        for m0 in range(0, sq, block_m):
            last = min(m0 + block_m, sq) - 1
            lo = 0 if left < 0 else max(m0 + offset - left, 0) // block_n * block_n
            hi = skv if right < 0 else min(max(last + offset + right + 1, 0), skv)
            if hi > lo:
                total += block_m * triton.cdiv(hi - lo, block_n) * block_n
    return total if problem.seqlens else total * problem.batch


def vendor_score(config: VendorConfig, problem: AttentionProblem, arch) -> Score:
    ideal = _ideal_seconds(problem, arch)
    fraction = FRACTION[(config.family, problem.direction)]
    waste = 1.0 if problem.head_dim_qk % 64 == 0 else 0.85  # odd head dims pad inside the library too
    modelled = ideal / (fraction * waste) + VENDOR_CALL_SECONDS
    return Score(ideal / modelled, {"fraction": fraction, "modelled_us": modelled * 1e6})


def rule_score(config: AnyAttentionConfig, problem: AttentionProblem, arch) -> Score:
    if isinstance(config, VendorConfig):
        return vendor_score(config, problem, arch)
    p = problem
    forward = config.direction is Direction.FORWARD
    # The forward's programs own query blocks; the backward's main (dK/dV) ones own key blocks.
    own, other = (config.block_m, config.block_n) if forward else (config.block_n, config.block_m)
    dims = (p.head_dim_qk + p.head_dim_v) / (padded(p.head_dim_qk) + padded(p.head_dim_v))
    visible = p.visible_pairs()
    computed = computed_pairs(p, config.block_m, config.block_n)
    band = visible / computed if computed else 1.0
    threads = config.num_warps * 32
    registers = min(accumulator_registers(config) + REGISTER_RESERVE, arch.registers_per_thread_max)
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=registers)
    rows = p.seqlen_q if forward else p.seqlen_kv
    heads = p.heads_q if forward else p.heads_kv
    programs = triton.cdiv(rows, own) * heads * p.batch
    waves = wave_efficiency(programs, arch.sm_count * resident)
    # K/V (forward) or Q/dO (backward) bytes per FLOP: a taller own block reuses them more.
    peak = _peak_flops(p, arch)
    intensity = own / p.dtype.itemsize  # FLOPs per byte of the streamed operand
    feed = min(1.0, intensity * arch.memory_bandwidth_gbs * 1e9 * L2_REUSE / peak)
    # Tensor cores want a tall M per warpgroup and a wide N per step; tiny tiles idle them.
    shape = min(1.0, own / 128) ** 0.5 * min(1.0, other / 64) ** 0.25
    latency = 1.0 if resident >= 2 or config.num_stages >= 2 else 0.85
    efficiency = dims * band * waves * feed * shape * latency
    fraction = FRACTION[(config.family, config.direction)]
    stages = 1 if forward else 3
    modelled = p.flops() / (peak * efficiency) / fraction + stages * LAUNCH_SECONDS
    if not forward:
        tq, _ = p.tokens()
        modelled += 2 * tq * p.heads_q * p.head_dim_v * p.dtype.itemsize / (arch.memory_bandwidth_gbs * 1e9)
    ideal = _ideal_seconds(p, arch)
    terms = {"head_dims": dims, "band": band, "waves": waves, "feed": feed, "shape": shape, "latency": latency,
             "resident": float(resident), "modelled_us": modelled * 1e6}
    return Score(ideal / modelled, terms)


