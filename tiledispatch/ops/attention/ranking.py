"""The `rules` score of an attention config for a problem: a small time model, no timing.

time = max(compute, memory) / the fraction of peak the family reaches, where compute is
stretched by the padding of the head dims and of the last query and key blocks, the
masked work of the blocks on a causal or window band's edge, the idle slots of the last
wave, and the K/V traffic of small query blocks. Score = ideal time / modelled time.
"""

from __future__ import annotations

import collections

import triton

from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.analytic import blocks_per_sm, wave_efficiency
from ...heuristics.roofline import dram_bytes_per_s, ideal_seconds, tensor_flops
from .config import AnyAttentionConfig, Family, VendorConfig
from .counting import block_pairs
from .problem import AttentionProblem, Direction
from .rules import REGISTER_RESERVE, accumulator_registers, padded, shared_memory_bytes

# Fractions of the dense tensor-core peak each Triton family reaches at its best. The vendor
# ones: VENDOR_FRACTION.
FRACTION = {
    # The H200 sweep at d=128 S4096, kernels timed in turns (benchmarks/results/h200/
    # attention_sweep.csv): fwd's best tile ran 447 TFLOP/s (128x64 w8 s3), fwd-tma's 528
    # (64x64 w4 s3); the rules pick that one.
    (Family.FWD, Direction.FORWARD): 0.46,
    (Family.FWD_TMA, Direction.FORWARD): 0.50,
    # fwd-ws against cuDNN, timed in turns on the H100 (benchmarks/studies/attention_forward_ab.py;
    # results/h100/attention_forward_ab.txt), 128x128 w8 over four runs: 1.01-1.10x cuDNN at
    # S4096, 1.00-1.09x causal, 1.03-1.12x GQA causal S8192, 0.84-0.89x at S1024. With the terms
    # below, 0.80 models it 1.00x, 1.02x, 1.12x and 0.86x there.
    (Family.FWD_WS, Direction.FORWARD): 0.80,
    # bwd: 352 TFLOP/s (backward FLOPs, 2.5x the forward's) at d=128 S4096, 64x128 w8 s3; the
    # atomic dQ variant's best ran 301 there (benchmarks/results/h200/attention_sweep.csv).
    (Family.BWD, Direction.BACKWARD): 0.36,
    (Family.BWD_ATOMIC, Direction.BACKWARD): 0.31,
    # bwd-ws, timed in turns with bwd on the H100 (benchmarks/studies/attention_backward_ab.py; results/
    # h100/attention_backward_ab.txt), with both its stages in Gluon: 32x128 w8 s3 ran 1.24-1.47x
    # bwd's 64x128 w8 s3 at d=128, where 0.49 models 1.38-1.39x. cuDNN stays ahead (its
    # forward+backward ran 1.06-1.16x fwd-ws's with bwd-ws at d=128, 1.28x at d=64; its backward
    # alone more), and the model keeps it so. At d=256 (the warpgroups split by role) bwd-ws ran
    # 2.07x bwd's 64x64 w8 s2 and its forward+backward 1.05x cuDNN's (d256_S2048); the model
    # gives it 946 us against cuDNN's 1045 (measured: 1004, and about 1060 for cuDNN's backward).
    (Family.BWD_WS, Direction.BACKWARD): 0.49,
}
# The Triton backwards at d=64 against the same model at d=128: bwd-ws ran 1.14-1.48x slower
# than modelled, bwd's 64x128 tiles 1.52x (same A/B): their elementwise work per MMA FLOP
# doubles. cuDNN's backward loses less there (VENDOR_HEAD_DIM_FACTOR).
BACKWARD_HEAD_DIM_FACTOR = {64: 0.65}
# bwd-ws's query step: with 32 rows, S^T = K Q^T and dP^T = V dO^T are wgmma 32 wide, which read
# their K and V operand from shared memory faster than the tensor cores use it. At d=64 (where
# 64 rows fit) 32x128 w8 s3 ran 0.89-0.94x 64x128 w8 s2 (same A/B, three runs), and two stages
# ran 0.95-1.0x three (1.0x at 32x128 on long_S16384, 0.98x at 64x128 and d=64).
BWD_WS_STEP_EXPONENT = 0.15
BWD_WS_TWO_STAGES = 0.98
# The backward's dK/dV step streams Q and dO: with two stages in flight it ran 0.83-0.93x
# of three (32x128 and 64x128 w8 at d=128, same sweep).
BACKWARD_TWO_STAGES = 0.9
# The forward's K/V loads with two stages in flight: 128x64 w8 ran 0.87x (fwd-tma) and 0.85x
# (fwd) of three stages (interleaved sweep, d=128 S4096).
FORWARD_TWO_STAGES = 0.86
# The SDPA backends, measured on the H200 (torch 2.11, cuDNN 9.19; benchmarks/results/h200/
# attention.csv, bf16, of 989 TFLOP/s): the fraction at D=128 without a mask on large
# problems, a factor per head dim, and one for a causal mask. Backward figures are derived
# from forward+backward less the forward: cuDNN 533 fwd+bwd and 660 fwd at S4096 give a
# backward of 495 (a standalone cuDNN backward ran 524 at B4 H32 S2048); flash 306 and 338
# give 295. Flash's backward is refused (vendor.supports); its figure is kept for explain.
VENDOR_FRACTION = {
    (Family.SDPA_CUDNN, Direction.FORWARD): 0.66,  # 660 TFLOP/s (mha_S4096_D128; 603 at S1024)
    (Family.SDPA_CUDNN, Direction.BACKWARD): 0.50,  # 495
    (Family.SDPA_FLASH, Direction.FORWARD): 0.34,  # 338
    (Family.SDPA_FLASH, Direction.BACKWARD): 0.30,  # 295
}
# Throughput at a head dim relative to D=128, from the same run: D=64 (mha_S2048_D64) and
# D=256 (d256_S2048). Head dims between are read at the tabulated dim above them, times
# their share of it (80 -> 128's factor * 80/128): the libraries' tiles pad them.
VENDOR_HEAD_DIM_FACTOR = {
    (Family.SDPA_CUDNN, Direction.FORWARD): {64: 0.70, 128: 1.0, 256: 1.0},  # 460, 660, 663
    (Family.SDPA_CUDNN, Direction.BACKWARD): {64: 0.82, 128: 1.0, 256: 0.67},  # 408, 495, 331
    (Family.SDPA_FLASH, Direction.FORWARD): {64: 0.87, 128: 1.0, 256: 0.92},  # 295, 338, 312
    (Family.SDPA_FLASH, Direction.BACKWARD): {64: 0.83, 128: 1.0, 256: 0.76},  # 246, 295, 223
}
# A causal (or any band) mask: the triangle's edge blocks and its uneven work per query
# block. cuDNN 593/660 forward and 444/495 backward at S4096; flash 294/338 and 271/295.
VENDOR_MASK_FACTOR = 0.90
VENDOR_CALL_SECONDS = 8e-6  # SDPA's dispatch and checks on the host
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
# fwd-ws gives its MMA warps the registers the loader does not use, and its 8 warps are two
# 64-row warpgroups, so the pressure and eight-warp terms above do not apply, nor the stage
# count (2 and 3 stages ran within 4-9 % of each other, either way). Its own terms (same A/B):
# at d=64 it ran 0.88-0.95x fwd-tma's 64x64 w4 s3, which the model without a factor rated
# above 1.3x; and one program per SM runs its first and last key blocks without overlap, which
# cost S1024 (1024 keys a program) 16 % against S4096: about 280 keys' time. At d=256 (128x64,
# 2 stages) it ran 1.26-1.49x fwd-tma, and 1.09x cuDNN in the A/B and 1.035x in two suite runs
# (results/h100/attention_summary.json: 687 TFLOP/s, more than its 628 at d=128). The rescale
# term charges its 64-key steps 0.71 there, but a d=256 step's MMAs are twice as long, and the
# other warpgroup's run while one rescales: 1.35 undoes most of that charge, so the model
# rates it 1.02x cuDNN (0.76x at a factor of 1, which picks cuDNN's forward).
WS_HEAD_DIM_FACTOR = {64: 0.65, 128: 1.0, 256: 1.35}
WS_PROGRAM_OVERHEAD_KEYS = 280


def _peak_flops(problem: AttentionProblem, arch) -> float:
    peak = tensor_flops(arch, problem.dtype)
    # fp32 runs exact (ieee), not as tf32: on the CUDA cores' share of the tf32 peak.
    return peak * arch.calibration.fma_share_of_tf32 if problem.dtype is DType.FP32 else peak


def _ideal_seconds(problem: AttentionProblem, arch) -> float:
    return ideal_seconds(problem.flops(), problem.bytes(), _peak_flops(problem, arch), arch)


def computed_pairs(problem: AttentionProblem, block_m: int, block_n: int) -> int:
    """(query, key) pairs the kernel computes: whole blocks over each query block's key range
    (counting.block_pairs, O(log) a distinct sequence)."""
    p = problem
    if not p.seqlens:
        return p.batch * block_pairs(p.seqlen_q, p.seqlen_kv, *p.band(p.seqlen_q, p.seqlen_kv), block_m, block_n)
    lengths = collections.Counter(p.seqlens)
    return sum(n * block_pairs(sq, skv, *p.band(sq, skv), block_m, block_n) for (sq, skv), n in lengths.items())


def vendor_head_dim_factor(family: Family, direction: Direction, head_dim: int) -> float:
    """Throughput at `head_dim` relative to D=128 (VENDOR_HEAD_DIM_FACTOR, padded dims scaled down)."""
    table = VENDOR_HEAD_DIM_FACTOR[(family, direction)]
    above = min((d for d in table if d >= head_dim), default=max(table))
    return table[above] * min(1.0, head_dim / above)


def register_pressure(registers: int) -> float:
    """1 up to PRESSURE_FREE registers a thread, falling linearly to PRESSURE_FLOOR at 256."""
    over = max(0, registers - PRESSURE_FREE) / (256 - PRESSURE_FREE)
    return max(PRESSURE_FLOOR, 1.0 - (1.0 - PRESSURE_FLOOR) * over)


def vendor_score(config: VendorConfig, problem: AttentionProblem, arch) -> Score:
    """time = ideal / (fraction * head-dim factor * mask factor) + the host's call; no tile terms:
    the library picks its own kernel."""
    ideal = _ideal_seconds(problem, arch)
    fraction = VENDOR_FRACTION[(config.family, problem.direction)]
    head_dim = vendor_head_dim_factor(config.family, problem.direction, problem.head_dim_qk)
    mask = VENDOR_MASK_FACTOR if problem.variant.band else 1.0
    modelled = ideal / (fraction * head_dim * mask) + VENDOR_CALL_SECONDS
    return Score(ideal / modelled, {"fraction": fraction, "head_dim": head_dim, "mask": mask,
                                    "modelled_us": modelled * 1e6})


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
    # Per streamed block of `other` rows (2 * other * d bytes of each operand pair) a program
    # does 4 * own * other * d FLOPs: 2 * own / itemsize FLOPs per byte.
    peak = _peak_flops(p, arch)
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
    pressure = register_pressure(accumulator_registers(config) + REGISTER_RESERVE)
    warps = EIGHT_WARPS if forward and config.num_warps >= 8 else 1.0
    if forward:
        softmax = 1.0 / (1.0 + RESCALE_COST * p.head_dim_v / config.block_n)
    else:
        softmax = BACKWARD_HEAD_DIM_FACTOR.get(p.head_dim_qk, 1.0)
    if config.family is Family.FWD_WS:
        latency, pressure, warps = 1.0, 1.0, 1.0
        softmax *= WS_HEAD_DIM_FACTOR.get(p.head_dim_qk, 1.0)
        # One program per SM runs its first and last blocks without overlap: short key ranges pay.
        keys = computed * p.heads_q / (programs * config.block_m)  # keys a program steps over
        latency *= keys / (keys + WS_PROGRAM_OVERHEAD_KEYS)
    if config.family is Family.BWD_WS:  # its loader warp keeps two stages nearly as busy as three
        shape = min(1.0, config.block_m / 64) ** BWD_WS_STEP_EXPONENT
        latency = BWD_WS_TWO_STAGES if config.num_stages < 3 else 1.0
    efficiency = dims * band * waves * feed * shape * latency * pressure * warps * softmax
    fraction = FRACTION[(config.family, config.direction)]
    stages = 1 if forward else 3
    modelled = p.flops() / (peak * efficiency) / fraction + stages * arch.calibration.launch_s
    if not forward:
        tq, _ = p.tokens()
        modelled += 2 * tq * p.heads_q * p.head_dim_v * p.dtype.itemsize / dram_bytes_per_s(arch)
    ideal = _ideal_seconds(p, arch)
    terms = {"head_dims": dims, "band": band, "waves": waves, "feed": feed, "shape": shape, "latency": latency,
             "pressure": pressure, "warps": warps, "softmax": softmax, "resident": float(resident),
             "modelled_us": modelled * 1e6}
    return Score(ideal / modelled, terms)


