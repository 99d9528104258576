"""The `rules` score of an attention config for a problem: a small time model, no timing.

time = max(compute, memory) / the fraction of peak the family reaches, where compute is
stretched by the padding of the head dims and of the last query and key blocks, the
masked work of the blocks on a causal or window band's edge, the idle slots of the last
wave, and the K/V traffic of small query blocks. Score = ideal time / modelled time.

`rule_score` asks the config's family (`config.FAMILIES`). The Triton families score with
`tile_score` below, each with its own fraction of the peak and, where its kernel differs from
the pointer kernels', its own terms (`adjust`); the vendor families with their own model.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable

from ...core.arith import cdiv
from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.analytic import blocks_per_sm, wave_efficiency
from ...heuristics.roofline import dram_bytes_per_s, ideal_seconds, per_problem, tensor_flops
from .config import FAMILIES, AnyAttentionConfig, AttentionConfig
from .counting import block_pairs
from .problem import AttentionProblem, Direction, UserMask
from .rules import REGISTER_RESERVE, accumulator_registers, padded, shared_memory_bytes

# The Triton backwards at d=64 against the same model at d=128: bwd-ws ran 1.14-1.48x slower
# than modelled, bwd's 64x128 tiles 1.52x (same A/B): their elementwise work per MMA FLOP
# doubles. cuDNN's backward loses less there (families/sdpa.py: VENDOR_HEAD_DIM_FACTOR).
BACKWARD_HEAD_DIM_FACTOR = {64: 0.65}
# The backward's dK/dV step streams Q and dO: with two stages in flight it ran 0.83-0.93x
# of three (32x128 and 64x128 w8 at d=128, same sweep).
BACKWARD_TWO_STAGES = 0.9
# The forward's K/V loads with two stages in flight: 128x64 w8 ran 0.87x (fwd-tma) and 0.85x
# (fwd) of three stages (interleaved sweep, d=128 S4096).
FORWARD_TWO_STAGES = 0.86
# K/V re-reads by neighbouring query blocks come from L2 at about this multiple of HBM: a kernel term,
# not a machine fact (the GEMM op's grouped tile order takes 5.0).
L2_REUSE = 4.0
# Register pressure: the modelled registers a thread (fp32 tiles + reserve) above which ptxas
# starts to spill, and the efficiency left at 256. sm_90 compiles: fwd 128x64 w4 at d=128
# (240 modelled) spills and ran at 0.69x the 8-warp tile on the H200; bwd dK/dV 32x128 w8
# at d=64 (144) does not spill, 64x128 w8 (176) a little, 32x128 w8 at d=128 (208) more.
PRESSURE_FREE = 160
PRESSURE_FLOOR = 0.7
# 8 warps on a tile 4 can hold: 128x64 at d=64 ran 280 TFLOP/s over 8 warps, 339 over 4 (H200).
EIGHT_WARPS = 0.83
# Elementwise softmax work per score, relative to the exp2: the O rescale costs d_v / block_n
# multiplies a score, so wide key steps amortise it.
RESCALE_COST = 0.1
# A mask tensor read beside the scores: the pointer forward with a bool mask ran 0.19x its modelled
# speed on a Llama prefill (4x16 heads, 512x512, d=128: 143 us against 27) and 0.50x on its one-token
# decode (20 against 10), where cuDNN with the mask as its bias ran 45 and 14 us
# (results/h200/attention_masked_before.txt). The milder figure is taken: either puts cuDNN first there.
USER_MASK_FACTOR = 0.5


@per_problem  # every candidate's score reads it: once a problem
def peak_flops(problem: AttentionProblem, arch) -> float:
    peak = tensor_flops(arch, problem.dtype)
    # fp32 runs exact (ieee), not as tf32: on the CUDA cores' share of the tf32 peak.
    return peak * arch.calibration.fma_share_of_tf32 if problem.dtype is DType.FP32 else peak


@per_problem
def problem_ideal_seconds(problem: AttentionProblem, arch) -> float:
    return ideal_seconds(problem_flops(problem), problem.bytes(), peak_flops(problem, arch), arch)


@per_problem  # counted in closed form, but per sequence and mask: once a problem, not once a score
def problem_flops(problem: AttentionProblem) -> float:
    return problem.flops()


@per_problem
def visible_pairs(problem: AttentionProblem) -> int:
    return problem.visible_pairs()


def computed_pairs(problem: AttentionProblem, block_m: int, block_n: int) -> int:
    """(query, key) pairs the kernel computes: whole blocks over each query block's key range
    (counting.block_pairs, O(log) a distinct sequence)."""
    p = problem
    if not p.seqlens:
        return p.batch * block_pairs(p.seqlen_q, p.seqlen_kv, *p.band(p.seqlen_q, p.seqlen_kv), block_m, block_n)
    lengths = collections.Counter(p.seqlens)
    return sum(n * block_pairs(sq, skv, *p.band(sq, skv), block_m, block_n) for (sq, skv), n in lengths.items())


def register_pressure(registers: int) -> float:
    """1 up to PRESSURE_FREE registers a thread, falling linearly to PRESSURE_FLOOR at 256."""
    over = max(0, registers - PRESSURE_FREE) / (256 - PRESSURE_FREE)
    return max(PRESSURE_FLOOR, 1.0 - (1.0 - PRESSURE_FLOOR) * over)


@dataclass(frozen=True)
class TileTerms:
    """The efficiency terms of a Triton tile on a problem, multiplied in this order, and what a
    family's own terms read: the pairs the blocks compute and the programs launched."""

    dims: float
    band: float
    waves: float
    feed: float
    shape: float
    latency: float
    pressure: float
    warps: float
    softmax: float
    resident: int
    computed: int
    programs: int


def tile_terms(config: AttentionConfig, problem: AttentionProblem, arch) -> TileTerms:
    """The pointer kernels' terms: how a tile of `config` fills the arch on `problem`."""
    p = problem
    forward = config.direction is Direction.FORWARD
    # The forward's programs own query blocks; the backward's main (dK/dV) ones own key blocks.
    own, other = (config.block_m, config.block_n) if forward else (config.block_n, config.block_m)
    dims = (p.head_dim_qk + p.head_dim_v) / (padded(p.head_dim_qk) + padded(p.head_dim_v))
    visible = visible_pairs(p)
    computed = computed_pairs(p, config.block_m, config.block_n)
    band = visible / computed if computed else 1.0
    threads = config.num_warps * 32
    needed = accumulator_registers(config) + REGISTER_RESERVE
    registers = min(needed, arch.registers_per_thread_max)
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=registers)
    rows = p.seqlen_q if forward else p.seqlen_kv
    heads = p.heads_q if forward else p.heads_kv
    programs = cdiv(rows, own) * heads * p.batch
    waves = wave_efficiency(programs, arch.sm_count * resident)
    # K/V (forward) or Q/dO (backward) bytes per FLOP: a taller own block reuses them more.
    # Per streamed block of `other` rows (2 * other * d bytes of each operand pair) a program
    # does 4 * own * other * d FLOPs: 2 * own / itemsize FLOPs per byte.
    peak = peak_flops(p, arch)
    intensity = 2 * own / p.dtype.itemsize
    feed = min(1.0, intensity * arch.memory_bandwidth_gbs * 1e9 * L2_REUSE / peak)
    # Tensor cores want a tall M per warpgroup and a wide N per step; tiny tiles idle them.
    # Forward: a warpgroup's wgmma is 64 rows tall, so 64 query rows per 4 warps fill it (the
    # interleaved H200 sweep at d=128 S4096: fwd-tma 64x64 w4 s3 528 TFLOP/s, the best tile,
    # against 460 for 128x64 w8 s3). The backward keeps K/V (or Q/dO) on chip, so its step
    # only needs to fill a wgmma's N (>= 32); a 32-row dK/dV step ran 0.89x a 64-row one at
    # d=128 (same sweep), which `own / 128` reproduces.
    rows = own / max(1, config.num_warps // 4) / 64 if forward else own / 128
    shape = min(1.0, rows) ** 0.5 * min(1.0, other / 64) ** 0.25
    latency = 1.0 if resident >= 2 or config.num_stages >= 2 else 0.85
    if config.num_stages < 3:
        latency *= BACKWARD_TWO_STAGES if not forward else FORWARD_TWO_STAGES
    pressure = register_pressure(needed)
    warps = EIGHT_WARPS if forward and config.num_warps >= 8 else 1.0
    if forward:
        softmax = 1.0 / (1.0 + RESCALE_COST * p.head_dim_v / config.block_n)
        softmax *= USER_MASK_FACTOR if p.variant.user_mask is not UserMask.NONE else 1.0
    else:
        softmax = BACKWARD_HEAD_DIM_FACTOR.get(p.head_dim_qk, 1.0)
    return TileTerms(dims, band, waves, feed, shape, latency, pressure, warps, softmax, resident, computed, programs)


Adjust = Callable[[AttentionConfig, AttentionProblem, TileTerms], TileTerms]


def tile_score(config: AttentionConfig, problem: AttentionProblem, arch, fraction: float,
               adjust: Adjust | None = None) -> Score:
    """A Triton family's score: its terms (`tile_terms`, then the family's `adjust`) times the
    `fraction` of the dense tensor-core peak its best tile reaches, plus its stages' launches."""
    p = problem
    t = tile_terms(config, p, arch)
    if adjust is not None:
        t = adjust(config, p, t)
    forward = config.direction is Direction.FORWARD
    efficiency = t.dims * t.band * t.waves * t.feed * t.shape * t.latency * t.pressure * t.warps * t.softmax
    stages = 1 if forward else 3
    modelled = problem_flops(p) / (peak_flops(p, arch) * efficiency) / fraction + stages * arch.calibration.launch_s
    if not forward:
        tq, _ = p.tokens()
        modelled += 2 * tq * p.heads_q * p.head_dim_v * p.dtype.itemsize / dram_bytes_per_s(arch)
    ideal = problem_ideal_seconds(p, arch)
    terms = {"head_dims": t.dims, "band": t.band, "waves": t.waves, "feed": t.feed, "shape": t.shape,
             "latency": t.latency, "pressure": t.pressure, "warps": t.warps, "softmax": t.softmax,
             "resident": float(t.resident), "modelled_us": modelled * 1e6}
    return Score(ideal / modelled, terms)


def rule_score(config: AnyAttentionConfig, problem: AttentionProblem, arch) -> Score:
    return FAMILIES.of(config).score(config, problem, arch)
