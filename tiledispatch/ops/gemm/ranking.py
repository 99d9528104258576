"""The `rules` score of a GEMM config for a problem: a small time model, no timing.

device time = max(compute, memory, latency chain) + split-K reduction, where compute is stretched
by the padding of edge tiles (M, N, K), the idle SMs of the last wave, and the operand
traffic of small tiles; memory is the slower of DRAM (bytes in flight) and the busiest SM's
intake (L2 re-reads included); the latency chain is the busiest SM's K loops, each step
waiting a load latency over the stages in flight. A call costs the longer of its device time
and its host time (the launches), since a host that cannot launch faster than the kernels run
leaves the GPU idle between calls. Score = ideal time / call time, in (0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.analytic import blocks_per_sm, tile_efficiency, wave_efficiency
from ...heuristics.roofline import dram_bytes_per_s, fma_flops, ideal_seconds, soft_max, tensor_flops
from .config import AnyGemmConfig, Family, GemmConfig, VendorConfig
from .plan import stream_k_split
from .problem import Activation, GemmProblem, Layout
from .rules import REGISTER_RESERVE, accumulator_registers, shared_memory_bytes

# Fractions of the model's ideal that each path reaches at its best, measured on an H200
# (benchmarks/results/h200/gemm_smoke.csv, 2026-11-21): 8192^3 bf16 ran at 610 TFLOP/s
# with the best tiled kernel and 786 with cuBLAS, of a 989 TFLOP/s peak.
TILED_FRACTION = 0.62
# tma-persistent: 744 TFLOP/s at 4096^3 bf16 (benchmarks/results/h200/gemm.csv), after its own terms.
TMA_FRACTION = 0.80
# ws-persistent (Gluon: a loader warp, two MMA warpgroups). On the H100 sweep
# (results/h100/gemm_sweep_ws.csv) its 128x256x64 tile over 3 stages ran 1.02-1.055x the tma
# pick (128x256x64 over 4) in bf16, and in fp8 its 128x256 tiles 1.06-1.11x tma's, where each
# program walks many tiles; with the tile overhead of a non-flattened loop (its epilogue is
# not overlapped, see _persistent_terms) that is this fraction. On a single wave
# (llama3_8b_o_T1024) it ran 0.96-0.99x: the partitions' start and the split tile cost about a
# microsecond and a half a call.
WS_FRACTION = 0.90
WS_START_SECONDS = 1.5e-6
# One persistent program per SM has no neighbour to hide its load latency: the stages in
# flight must cover the operand bytes its MMAs consume meanwhile (fp8 with block_k 64 and
# 3 stages ran 0.73x of block_k 128 at 4096^3).
LOAD_LATENCY_S = 0.8e-6
# Each tile's prologue (pipeline fill) and epilogue cost about this many K iterations,
# unless the loop is flattened across tiles (batched 2048x2048x128: 1.5x faster flattened).
TILE_OVERHEAD_ITERATIONS = 2.0
FLATTENED_OVERHEAD_ITERATIONS = 0.7
VENDOR_FRACTION = 0.79
# cuBLAS where an operand's base or rows are not 16-byte multiples: 133-138 TFLOP/s on
# odd_4095x4097x4093 in bf16 and fp16 (benchmarks/results/h200/gemm.csv), 0.14 of the peak.
VENDOR_UNALIGNED_FRACTION = 0.14
# A realign copy reads and writes its operand once, at this fraction of the memory bandwidth, by
# element size: on the H200 (odd_4095x4097x4093) the dense copies moved 3.1-3.2 TB/s of 4.8 in
# bf16 and out of the buffer in any dtype, 1.87 TB/s into it in fp8 (byte stores).
REALIGN_BANDWIDTH_FRACTION = {1: 0.39}
REALIGN_BANDWIDTH_FRACTION_WIDE = 0.65
# torch._scaled_mm reached 1194-1348 TFLOP/s at 4096^3/8192^3 fp8, of a 1979 peak.
VENDOR_FP8_FRACTION = 0.70
# The fractions above are of the tensor-core peak; of the memory bandwidth, on the
# memory-bound (M <= 16) cases of benchmarks/results/h200/gemm.csv, the small-M tiled
# tiles reached 4.1-4.3 TB/s, the persistent ones 3.8-4.0 and cuBLAS 4.1 of 4.8.
TILED_BANDWIDTH_FRACTION = 0.88
TMA_BANDWIDTH_FRACTION = 0.82
VENDOR_BANDWIDTH_FRACTION = 0.86
# cuBLAS on a few rows (M <= 16) over a deep K takes a fixed ~1.3-3 us more than our one-launch kernels on the
# same bytes (results/h100/gemm_decode.csv: llama3_8b_o_T1 and _T16, 33.5 MB, 15.4-15.7 us against
# 12.5 for gemv and 14.3 for tiled 16x32x512, where on 235 MB all three ran within 3 %), as a
# split K with a reduction would. torch._scaled_mm (fp8) showed no such cost.
VENDOR_SPLIT_ROWS = 16
VENDOR_SPLIT_DEPTH = 1024  # K: the cases measured had 4096-28672; a 16x16x16 call shows no split
VENDOR_SPLIT_SECONDS = 1.5e-6
# Grouped tile order serves operand re-reads from L2 at about this multiple of HBM. A kernel term,
# not a machine fact: the multiple follows the tile order (conv's kernels and attention's K/V
# re-reads take 4.0). On gemm.csv 4.8-5.6 rank the table best (Triton-only mean 0.948 at 5,
# 0.943 at 4).
L2_REUSE = 5.0
GENERIC_LAYOUT_PENALTY = 0.97  # a specialised (contiguous) layout beats generic strides
SM_BANDWIDTH_SHARE = 1.5
# A K loop's load latency, fitted to this op's kernels (about the 1 us memory latency that
# arch.calibration.bytes_in_flight_per_sm is derived from): each iteration of a program waits
# for it over the `num_stages - 1` tiles in flight. On the latency-bound cases of gemm.csv a
# lone program took 0.25-0.35 us per K iteration with 4 stages and 0.45-0.57 us with 3
# (llama3_8b_o_T128 fp8: 64x64x64 s4 18.7 us for 64 iterations, 128x128x128 s3 18.2 us for 32).
CHAIN_LATENCY_S = 1.0e-6
# One SM's operand intake through its L2 port is a machine fact: arch.calibration.sm_port_bytes_per_s
# (pointer loads) and tma_port_bytes_per_s (TMA copies), with the gemm.csv rows that show them.
# Pointer loads of K rows shorter than a 128-byte line (block_k of 32 in 16-bit, 64 in fp8)
# take twice the load instructions and barriers per byte and a narrower shared-memory
# swizzle. Over gemm.csv, tiled candidates within 2x of the best ran 0.73-0.93x of what the
# model gave them with 64-byte rows (median per dtype and bound), 0.94-1.0x with 128-byte
# rows: (64/128) ** 0.25 = 0.84.
ROW_EXPONENT = 0.25
# A kernel that spills registers to local memory: seen 5-10x slower on the unaligned cases
# of benchmarks/results/h200/gemm.csv (odd_1000: 64x256 tiles over 4 warps).
SPILL_PENALTY = 0.15
# Element-by-element operand loads (rows not a multiple of 16 bytes): the best tiled kernels
# on the unaligned cases of gemm.csv ran 0.35-0.67 (bf16) and 0.45-0.9 (fp8) of what the
# model gave them without this term (odd_4095x4097x4093, odd_3000x5000x100, odd_1000 fp8).
UNALIGNED_LOAD_FRACTION = 0.5
# The register estimate is coarse: on the unaligned cases of gemm.csv, tiles estimated at
# 256 registers ran fastest (odd_4095x4097x4093 bf16, 128x128x64 over 8 warps; 0.95 of the
# best at odd_3000x5000x100) and those estimated at 272 ran 0.04-0.11 of the best: the
# real limit lies between, so allow the estimate this much above the hardware's 255.
SPILL_MARGIN = 8


# Host time of a dispatched call on a problem seen before, on an H200 (benchmarks/results/h200/
# gemm_host_profile.txt, 16x16 bf16): the call's signature and memo lookup, 1.7-2.4 us; a bound
# Triton launch, arch.calibration.host_launch_s (4.8 us there); torch.mm, 7.3-7.6 us. Each
# further stage (split-K's reduction, a realign copy, stream-K's zeroed flags, an epilogue step
# of the vendor path) is one more launch or PyTorch op. Only problems whose kernels run shorter
# than this are ranked by it: there a Triton call returns 3 us sooner than torch.mm's (7.2
# against 10.5 us a call). A CUDA graph's replays have no host time: they take `replay_pick`,
# the fastest kernel on the device.
HOST_SIGNATURE_SECONDS = 2.4e-6
HOST_VENDOR_SECONDS = 7.4e-6
HOST_EXPONENT = 8  # a kernel twice as long as its launches costs 0.05 % more than alone; one as long, 9 %
# Above this call / device time the host term may have chosen the pick, and a graph's replays
# are ranked again by device time alone (a Triton pick under ~10 us on the device).
HOST_RANKED = 1.01


def host_seconds(config: AnyGemmConfig, problem: GemmProblem, arch) -> float:
    """The host time of a call bound to `config`: the signature, then each launch or PyTorch op."""
    launch_s = arch.calibration.host_launch_s
    if isinstance(config, VendorConfig):
        steps = vendor_steps(problem)
        return HOST_SIGNATURE_SECONDS + HOST_VENDOR_SECONDS + steps * launch_s
    launches = 1 + int(config.split_k > 1) + int(config.family is Family.STREAM_K)
    if config.realign:
        launches += len(problem.alignment.unaligned_operands)
    return HOST_SIGNATURE_SECONDS + launches * launch_s


def _peak_flops(problem: GemmProblem, arch) -> float:
    t = problem.types
    if t.a is DType.FP32 and not t.allow_tf32:
        return fma_flops(arch)  # no tensor cores
    return tensor_flops(arch, t.a)


def _ideal_seconds(problem: GemmProblem, arch) -> float:
    return ideal_seconds(problem.flops(), problem.bytes(), _peak_flops(problem, arch), arch)


def vendor_steps(p: GemmProblem) -> int:
    """The passes over C after the vendor's matmul: one per epilogue step, one for a wider output."""
    steps = int(p.epilogue.bias) + int(p.epilogue.activation is not Activation.NONE) + int(p.epilogue.residual)
    if p.types.c is not p.types.a and not p.types.scaled:
        steps += 1  # fp32 output from half inputs: computed in fp32, then copied
    return steps


def vendor_score(config: VendorConfig, problem: GemmProblem, arch) -> Score:
    """cuBLAS picks its own tile, so no waste terms; but each epilogue step is one more pass."""
    p = problem
    ideal = _ideal_seconds(p, arch)
    steps = vendor_steps(p)
    launch_s = arch.calibration.launch_s
    step_s = 2 * p.batch * p.m * p.n * p.types.c.itemsize / dram_bytes_per_s(arch) + launch_s
    fraction = VENDOR_FP8_FRACTION if p.types.scaled else VENDOR_FRACTION
    if p.alignment.unaligned_operands:
        fraction = VENDOR_UNALIGNED_FRACTION
    compute_s = p.flops() / _peak_flops(p, arch) / fraction
    memory_s = p.bytes() / dram_bytes_per_s(arch) / VENDOR_BANDWIDTH_FRACTION
    # cuBLAS's kernel costs one launch, as a Triton kernel does (the benchmark times device work).
    modelled = soft_max(compute_s, memory_s) + launch_s + steps * step_s
    if p.m <= VENDOR_SPLIT_ROWS and p.k >= VENDOR_SPLIT_DEPTH and not p.types.scaled:
        modelled += VENDOR_SPLIT_SECONDS
    return Score(ideal / modelled, {"epilogue_steps": float(steps), "modelled_us": modelled * 1e6})


# Stream-K's hand-offs: the flags' zeroing (one memset before the kernel), and each owner's
# read of the other segments' fp32 partial tiles through its SM's port.
STREAM_K_FLAGS_SECONDS = 2e-6


@dataclass(frozen=True)
class StreamKLoad:
    """What each program of a stream-K grid does (every program the same K iterations)."""

    programs: int
    iterations: float  # K iterations per program
    loops: float  # K loops per program: whole tiles, plus the dealt tiles' segments (one more pipeline fill each)
    partials: int  # partial tiles an owner adds


def stream_k_load(p: GemmProblem, config: GemmConfig, sm_count: int) -> StreamKLoad:
    tiles = math.ceil(p.m / config.block_m) * math.ceil(p.n / config.block_n) * p.batch
    k_tiles = math.ceil(p.k / config.block_k)
    programs, sk_tiles = stream_k_split(tiles, k_tiles, sm_count)
    # Each program's range is one segment, plus one for each of the sk_tiles - 1 tile
    # boundaries that fall inside a range.
    loops = tiles // programs + ((1 + (sk_tiles - 1) / programs) if sk_tiles else 0)
    partials = math.ceil(programs / sk_tiles) if sk_tiles else 0
    return StreamKLoad(programs, tiles * k_tiles / programs, loops, partials)


def _persistent_terms(config: GemmConfig, p: GemmProblem, arch, peak: float,
                      stream: StreamKLoad | None) -> dict[str, float]:
    """Pipeline depth against load latency, and the per-tile overhead a flattened loop hides."""
    t = p.types
    operand_bytes_per_k = config.block_m * t.a.itemsize + config.block_n * t.b.itemsize
    consumed_per_s = peak / arch.sm_count * operand_bytes_per_k / (2 * config.block_m * config.block_n)
    in_flight = max(config.num_stages - 1, 1) * config.block_k * operand_bytes_per_k
    depth = min(1.0, in_flight / (consumed_per_s * LOAD_LATENCY_S)) ** 0.5
    k_tiles = math.ceil(p.k / config.block_k)
    # ws-persistent's loader runs ahead across tiles (its chain fills once), but both warpgroups
    # store each tile before the next one's MMAs: batched_attn_scores (K = 128) ran 0.87-0.89x
    # cuBLAS with its 128x128 tile where tma-persistent's flattened 128x256 ran 0.94-1.0x.
    # ws-pingpong's warpgroups store while the other computes.
    flattened = config.flatten or config.family is Family.WS_PINGPONG
    overhead = FLATTENED_OVERHEAD_ITERATIONS if flattened else TILE_OVERHEAD_ITERATIONS
    if stream is not None:
        return {"depth": depth, "overlap": stream.iterations / (stream.iterations + overhead * stream.loops)}
    return {"depth": depth, "overlap": k_tiles / (k_tiles + overhead)}


def _intake_seconds(config: GemmConfig, p: GemmProblem, tiles: int, arch,
                    stream: StreamKLoad | None) -> float:
    """The busiest SM's operand intake: every byte its tiles load, re-reads from L2 included.

    DRAM serves each operand byte once, but every M tile reads the whole of its B panel
    (and every N tile its A panel) through its own SM's L2 port: 16-row tiles on M = 32
    read B twice (llama3_70b_up_T32 fp8: 0.57 of the best).
    """
    t = p.types
    k_span = math.ceil(p.k / config.split_k)
    rows, cols = min(p.m, config.block_m), min(p.n, config.block_n)
    per_tile = (rows * t.a.itemsize + cols * t.b.itemsize) * k_span
    calibration = arch.calibration
    port = calibration.tma_port_bytes_per_s if config.family.uses_tma else calibration.sm_port_bytes_per_s
    if stream is not None:  # an even share of all tiles' K iterations
        return tiles / stream.programs * per_tile / port
    return math.ceil(tiles / arch.sm_count) * per_tile / port


def _chain_seconds(config: GemmConfig, p: GemmProblem, tiles: int, sm_count: int, concurrent: int,
                   stream: StreamKLoad | None) -> float:
    """The latency chain of the busiest SM: a K loop cannot run ahead of its loads.

    A program keeps `num_stages - 1` K tiles in flight, so each iteration waits at least
    one load latency over that many; the first load of a tile waits a whole latency
    (pipeline fill), except in a loop flattened across tiles. Concurrent programs on one
    SM run their chains side by side; a persistent program walks its tiles one by one.
    """
    k_iters = math.ceil(math.ceil(p.k / config.block_k) / config.split_k)
    per_iter = CHAIN_LATENCY_S / max(config.num_stages - 1, 1)
    programs = math.ceil(tiles / sm_count)
    if stream is not None:
        return stream.iterations * per_iter + CHAIN_LATENCY_S * stream.loops
    if config.family is Family.TMA_PERSISTENT or config.family.warp_specialised:
        flattened = config.flatten or config.family.warp_specialised
        fill = CHAIN_LATENCY_S * (1 if flattened else programs)
        return programs * k_iters * per_iter + fill
    return math.ceil(programs / concurrent) * (k_iters * per_iter + CHAIN_LATENCY_S)


def _realign_seconds(p: GemmProblem, arch) -> float:
    """The copies of a realign plan: each unaligned operand read and written once more."""
    t = p.types
    elements = {"a": p.m * p.k, "b": p.k * p.n, "c": p.m * p.n}
    seconds = 0.0
    for role in p.alignment.unaligned_operands:
        itemsize = getattr(t, role).itemsize
        rate = dram_bytes_per_s(arch) * REALIGN_BANDWIDTH_FRACTION.get(itemsize, REALIGN_BANDWIDTH_FRACTION_WIDE)
        seconds += 2 * p.batch * elements[role] * itemsize / rate + arch.calibration.launch_s
    return seconds


def rule_score(config: AnyGemmConfig, problem: GemmProblem, arch) -> Score:
    """The device time's score, lowered where the host's launches take longer than the kernels."""
    device = device_score(config, problem, arch)
    device_s = device.terms["modelled_us"] * 1e-6
    host_s = host_seconds(config, problem, arch)
    # The longer of the two, smoothed so that it still rises with the device time: among
    # launch-bound candidates of one host cost, the faster kernel keeps its lead (a graph
    # replay, which has no host time, runs it).
    call_s = (device_s**HOST_EXPONENT + host_s**HOST_EXPONENT) ** (1 / HOST_EXPONENT)
    return Score(device.value * device_s / call_s,
                 {**device.terms, "device_score": device.value, "host_us": host_s * 1e6, "call_us": call_s * 1e6})


def replay_pick(dispatcher, problem: GemmProblem, selected=None):
    """The kernel a CUDA graph's replays of this call run: a replay has no host time, so for a
    launch-bound problem the fastest kernel on the device; elsewhere `selected`, the
    dispatcher's pick for eager calls (selected here if not given).

    Only the `rules` strategy ranks by host time: `autotune` keeps the fastest on the device.
    """
    from ...core.dispatcher import Strategy

    selected = selected if selected is not None else dispatcher.select(problem)
    if dispatcher.strategy is not Strategy.RULES:
        return selected
    terms = rule_score(selected.config, problem, dispatcher.arch).terms
    if terms["call_us"] < HOST_RANKED * terms["modelled_us"]:  # its kernel outlasts the launches
        return selected
    ranked = dispatcher.explain(problem).ranked  # scored by rule_score, whose terms keep the device score
    return max(ranked, key=lambda c: c.score.terms["device_score"]).spec


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


def _layout_penalty(config: GemmConfig, p: GemmProblem) -> float:
    """A kernel built for generic strides, run where a specialised (contiguous) one would fit."""
    generic = Layout.STRIDED in (config.layout.a, config.layout.b, config.layout.c) and config.layout != p.layout
    return GENERIC_LAYOUT_PENALTY if generic else 1.0


def gemv_score(config: GemmConfig, problem: GemmProblem, arch) -> Score:
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
    in_flight *= min(1.0, per_sm * SM_BANDWIDTH_SHARE) * row
    if not (p.alignment.a and p.alignment.b):
        in_flight *= UNALIGNED_LOAD_FRACTION
    bandwidth = dram_bytes_per_s(arch) * GEMV_BANDWIDTH_FRACTION
    # Each program reads its columns of B; A's row, read by every program, stays in the SM's L1.
    port = arch.calibration.sm_port_bytes_per_s
    intake_s = (math.ceil(per_sm) * config.block_n + 1) * p.k * t.b.itemsize / port
    memory_s = soft_max(p.bytes() / (bandwidth * in_flight), intake_s)
    compute_s = p.flops() / (fma_flops(arch) * GEMV_FMA_FRACTION)
    modelled = soft_max(compute_s, memory_s) + arch.calibration.launch_s
    value = _ideal_seconds(p, arch) / modelled
    value *= _layout_penalty(config, p)
    terms = {"tile_m": 1.0, "tile_n": tile_efficiency(p.n, config.block_n),
             "tile_k": tile_efficiency(p.k, config.block_k),
             "waves": min(1.0, per_sm), "feed": 1.0, "latency": 1.0, "resident": float(resident), "row": row,
             "in_flight": in_flight, "spills": 0.0, "modelled_us": modelled * 1e6}
    return Score(value, terms)


def device_score(config: AnyGemmConfig, problem: GemmProblem, arch) -> Score:
    """ideal / modelled device time: what a CUDA graph replay of the call would take."""
    if isinstance(config, VendorConfig):
        return vendor_score(config, problem, arch)
    if config.family is Family.GEMV:
        return gemv_score(config, problem, arch)
    if config.realign:  # its twin on the aligned copies, plus the copies
        inner = device_score(replace(config, realign=False), replace(problem, alignment=problem.alignment.realigned()),
                           arch)
        copies_s = _realign_seconds(problem, arch)
        modelled = inner.terms["modelled_us"] * 1e-6 + copies_s
        return Score(_ideal_seconds(problem, arch) / modelled,
                     {**inner.terms, "realign_us": copies_s * 1e6, "modelled_us": modelled * 1e6})
    p, t = problem, problem.types
    bandwidth = dram_bytes_per_s(arch)
    peak = _peak_flops(p, arch)
    calibration = arch.calibration

    k_span = config.block_k * config.split_k
    waste = {
        "tile_m": tile_efficiency(p.m, config.block_m),
        "tile_n": tile_efficiency(p.n, config.block_n),
        "tile_k": tile_efficiency(p.k, k_span) if p.k >= k_span else p.k / (math.ceil(p.k / config.block_k) * config.block_k),
    }
    threads = config.num_warps * 32
    registers = accumulator_registers(config) + REGISTER_RESERVE
    vectorised = p.alignment.a and p.alignment.b
    if not vectorised:
        # Unaligned operands are loaded element by element, each through its own 64-bit
        # pointer held in registers: large tiles over few threads spill. Single bytes (fp8)
        # also take a register each until they are packed: on the unaligned fp8 cases of
        # gemm.csv, time grew 3x from 32 to 64 elements per thread per K step (128x128x64
        # over 8 warps: 4.4 ms, 64x64x32 over 4: 1.35 ms at 4095x4097x4093), not in bf16.
        per_element = 3 if t.a.is_fp8 else 2
        registers += per_element * (config.block_m + config.block_n) * config.block_k // threads
    spills = registers > arch.registers_per_thread_max + SPILL_MARGIN
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=min(registers, arch.registers_per_thread_max))
    tiles = math.ceil(p.m / config.block_m) * math.ceil(p.n / config.block_n) * p.batch * config.split_k
    persistent = config.family.uses_tma
    # Waves over SMs, for both families: the block scheduler spreads programs one per SM
    # before it doubles up, so tiles below 132 leave SMs idle, not slots. Programs sharing
    # an SM share its tensor cores; how many run at once (`concurrent`) decides whether
    # one can hide another's latency. (Counting resident slots instead rated 64x64 tiles
    # with 5 resident at 0.16 waves on square_512, where they ran fastest.)
    waves = wave_efficiency(tiles, arch.sm_count)
    stream = stream_k_load(p, config, arch.sm_count) if config.family is Family.STREAM_K else None
    if stream is not None:  # every program the same K iterations; the extra loops cost in `overlap`
        waves = stream.programs / arch.sm_count
    concurrent = 1 if persistent else min(resident, math.ceil(tiles / arch.sm_count))
    # Operand bytes each tile pulls per FLOP, against what L2-assisted bandwidth can feed.
    intensity = 2 * config.block_m * config.block_n / ((config.block_m + config.block_n) * t.a.itemsize)
    feed = min(1.0, intensity * bandwidth * L2_REUSE / peak)
    # One resident program cannot hide its own loads and epilogue behind another's math:
    # credit for two or more (on the H200 suite, 128x128 tiles with 2 resident beat
    # 128x256 with 1 by up to 1.6x in fp8 and 1.5x at 1024^3).
    latency = 1.0 if concurrent >= 2 or persistent else 0.9 if config.num_stages >= 3 else 0.8

    row = 1.0 if persistent else min(1.0, config.block_k * t.a.itemsize / 128) ** ROW_EXPONENT
    efficiency = waste["tile_m"] * waste["tile_n"] * waste["tile_k"] * waves * feed * latency * row
    if not vectorised:
        efficiency *= UNALIGNED_LOAD_FRACTION
    persistent_terms = {}
    if persistent:
        persistent_terms = _persistent_terms(config, p, arch, peak, stream)
        efficiency *= persistent_terms["depth"] * persistent_terms["overlap"]
    # The more it spills, the slower: graded by how far the estimate overshoots.
    efficiency *= SPILL_PENALTY * (arch.registers_per_thread_max / registers) ** 2 if spills else 1.0
    compute_s = p.flops() / (peak * efficiency)
    # Bandwidth needs bytes in flight (Little's law): the useful operand bytes that the
    # resident programs of one multiprocessor have requested at once.
    useful_rows = min(p.m, config.block_m)
    per_program = (useful_rows * config.block_k * t.a.itemsize + config.block_k * config.block_n * t.b.itemsize)
    per_program *= max(config.num_stages - 1, 1)
    programs_per_sm = 1.0 if persistent else min(resident, max(tiles / arch.sm_count, 1.0))
    in_flight = min(1.0, per_program * programs_per_sm / calibration.bytes_in_flight_per_sm)
    # Fewer programs than multiprocessors leave some idle; one busy SM draws more than its
    # even share of the bandwidth, but not all of it.
    busy = tiles if stream is None else stream.programs
    in_flight *= min(1.0, busy / arch.sm_count * SM_BANDWIDTH_SHARE) * row
    # DRAM and the SM's port are two bounds on one stream of bytes: combined more sharply than
    # compute and memory (on the H200 table Triton-only selection 0.977 -> 0.979 against a cube).
    intake_s = _intake_seconds(config, p, tiles, arch, stream)
    memory_s = soft_max(p.bytes() / (bandwidth * in_flight), intake_s, 6)
    reduce_s = 0.0
    if config.split_k > 1:
        reduce_s = 2 * config.split_k * p.batch * p.m * p.n * 4 / bandwidth + calibration.launch_s
    if stream is not None:
        reduce_s = (STREAM_K_FLAGS_SECONDS
                    + stream.partials * config.block_m * config.block_n * 4 / calibration.tma_port_bytes_per_s)
    ws = config.family.warp_specialised
    if ws:
        compute_s /= WS_FRACTION
    else:
        compute_s /= TMA_FRACTION if persistent else TILED_FRACTION
    memory_s /= TMA_BANDWIDTH_FRACTION if persistent else TILED_BANDWIDTH_FRACTION
    chain_s = _chain_seconds(config, p, tiles, arch.sm_count, concurrent, stream)
    modelled = (soft_max(soft_max(compute_s, memory_s), chain_s) + calibration.launch_s + reduce_s
                + (WS_START_SECONDS if ws else 0.0))
    ideal = _ideal_seconds(p, arch)
    value = ideal / modelled
    value *= _layout_penalty(config, p)
    terms = {**waste, **persistent_terms, "waves": waves, "feed": feed, "latency": latency,
             "resident": float(resident), "concurrent": float(concurrent), "row": row, "in_flight": in_flight,
             "compute_us": compute_s * 1e6, "memory_us": memory_s * 1e6, "chain_us": chain_s * 1e6,
             "reduce_us": reduce_s * 1e6, "spills": float(spills), "modelled_us": modelled * 1e6}
    return Score(value, terms)
