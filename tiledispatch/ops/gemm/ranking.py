"""The `rules` score of a GEMM config for a problem: a small time model, no timing.

A call costs the longer of its device time and its host time (the launches), since a host that
cannot launch faster than the kernels run leaves the GPU idle between calls (`rule_score`).
Each family models its device time (``families/``, `device_score`); the tile families share
`tile_score`: device time = max(compute, memory, latency chain) + split-K reduction, where
compute is stretched by the padding of edge tiles (M, N, K), the idle SMs of the last wave,
and the operand traffic of small tiles; memory is the slower of DRAM (bytes in flight) and the
busiest SM's intake (L2 re-reads included); the latency chain is the busiest SM's K loops,
each step waiting a load latency over the stages in flight. A family tells `tile_score` its
kernel's own terms (`TileKernel`). Score = ideal time / call time, in (0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.analytic import blocks_per_sm, tile_efficiency, wave_efficiency
from ...heuristics.roofline import dram_bytes_per_s, fma_flops, ideal_seconds, soft_max, tensor_flops
from .config import AnyGemmConfig, GemmConfig
from .family import FAMILIES
from .problem import GemmProblem, GemmTypes, Layout
from .rules import REGISTER_RESERVE, accumulator_registers, shared_memory_bytes

# One persistent program per SM has no neighbour to hide its load latency: the stages in
# flight must cover the operand bytes its MMAs consume meanwhile (fp8 with block_k 64 and
# 3 stages ran 0.73x of block_k 128 at 4096^3).
LOAD_LATENCY_S = 0.8e-6
# Each tile's prologue (pipeline fill) and epilogue cost about this many K iterations,
# unless the loop is flattened across tiles (batched 2048x2048x128: 1.5x faster flattened).
TILE_OVERHEAD_ITERATIONS = 2.0
FLATTENED_OVERHEAD_ITERATIONS = 0.7
# Of the memory bandwidth, on the memory-bound (M <= 16) cases of benchmarks/results/h200/gemm.csv,
# the persistent (TMA) tiles reached 3.8-4.0 TB/s of 4.8 (the tiled ones: families/tiled.py).
TMA_BANDWIDTH_FRACTION = 0.82
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
# Triton launch, arch.calibration.host_launch_s (4.8 us there); torch.mm, 7.3-7.6 us
# (families/vendor.py). Each further stage (split-K's reduction, a realign copy, stream-K's
# zeroed flags, an epilogue step of the vendor path) is one more launch or PyTorch op. Only
# problems whose kernels run shorter than this are ranked by it: there a Triton call returns
# 3 us sooner than torch.mm's (7.2 against 10.5 us a call). A CUDA graph's replays have no host
# time: they take `replay_pick`, the fastest kernel on the device.
HOST_SIGNATURE_SECONDS = 2.4e-6
HOST_EXPONENT = 8  # a kernel twice as long as its launches costs 0.05 % more than alone; one as long, 9 %
# Above this call / device time the host term may have chosen the pick, and a graph's replays
# are ranked again by device time alone (a Triton pick under ~10 us on the device).
HOST_RANKED = 1.01


def host_seconds(config: AnyGemmConfig, problem: GemmProblem, arch) -> float:
    """The host time of a call bound to `config`: the signature, then each launch or PyTorch op."""
    family = FAMILIES.of(config)
    launches = family.host_launches(config, problem)
    return HOST_SIGNATURE_SECONDS + family.call_overhead_s + launches * arch.calibration.host_launch_s


def device_score(config: AnyGemmConfig, problem: GemmProblem, arch) -> Score:
    """ideal / modelled device time: what a CUDA graph replay of the call would take."""
    return FAMILIES.of(config).device_score(config, problem, arch)


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


# --- what every family's model shares ------------------------------------------------------

def peak_flops(problem: GemmProblem, arch) -> float:
    return types_peak_flops(problem.types, arch)


def types_peak_flops(t: GemmTypes, arch) -> float:
    """The peak FLOP/s of a product of these types: a config's, bound to its problem's types, too."""
    if t.a is DType.FP32 and not t.allow_tf32:
        return fma_flops(arch)  # no tensor cores
    return tensor_flops(arch, t.a)


# The last problem's roofline: a ranking scores one problem against every candidate in turn,
# and each score asks for it (the tuple is replaced whole, so threads read a consistent one).
_LAST_ROOFLINE: tuple = (None, None, 0.0, 0.0)


def roofline(problem: GemmProblem, arch) -> tuple[float, float]:
    """(peak FLOP/s, ideal seconds) of `problem` on `arch`."""
    global _LAST_ROOFLINE
    last = _LAST_ROOFLINE
    if last[0] is problem and last[1] is arch:
        return last[2], last[3]
    peak = peak_flops(problem, arch)
    ideal = ideal_seconds(problem.flops(), problem.bytes(), peak, arch)
    _LAST_ROOFLINE = (problem, arch, peak, ideal)
    return peak, ideal


def problem_ideal_seconds(problem: GemmProblem, arch) -> float:
    return roofline(problem, arch)[1]


def layout_penalty(config: GemmConfig, p: GemmProblem) -> float:
    """A kernel built for generic strides, run where a specialised (contiguous) one would fit."""
    generic = Layout.STRIDED in (config.layout.a, config.layout.b, config.layout.c) and config.layout != p.layout
    return GENERIC_LAYOUT_PENALTY if generic else 1.0


# --- the tile families' model --------------------------------------------------------------

@dataclass(frozen=True)
class DealtLoad:
    """A persistent grid whose programs are dealt equal shares of all tiles' K iterations (stream-K)."""

    programs: int
    iterations: float  # K iterations per program
    loops: float  # K loops per program: each one more pipeline fill
    handoff_s: float  # passing the partial tiles of tiles cut between programs (in place of split-K's reduction)


def _flattened(config: GemmConfig) -> bool:
    return config.flatten


def _whole_tiles(config: GemmConfig, problem: GemmProblem, arch) -> DealtLoad | None:
    return None


@dataclass(frozen=True)
class TileKernel:
    """A tile family's own terms in `tile_score`.

    `persistent`: one program per SM walks the tiles, operands through TMA (else a program per
    tile, pointer loads). `start_seconds`: a call's fixed cost beyond its launch.
    `loops_across_tiles`: a persistent program's K loop runs on from tile to tile, hiding each
    tile's fill and epilogue; `fills_once`: its latency chain fills the pipeline once, not per
    tile. `dealt`: how the grid shares out K iterations, where it does (stream-K).
    """

    compute_fraction: float  # of the peak FLOP/s the kernel reaches at its best
    bandwidth_fraction: float  # of the DRAM bandwidth it reaches at its best
    persistent: bool = False
    start_seconds: float = 0.0
    loops_across_tiles: Callable[[GemmConfig], bool] = _flattened
    fills_once: Callable[[GemmConfig], bool] = _flattened
    dealt: Callable[[GemmConfig, GemmProblem, Any], DealtLoad | None] = _whole_tiles

    @property
    def deals(self) -> bool:
        """Whether its grid deals K iterations out (`dealt`) rather than whole tiles."""
        return self.dealt is not _whole_tiles


# --- what a config's terms read of it alone (the batch, `score_batch`, makes them once per config) ----

def pipeline_depth(config: GemmConfig, t: GemmTypes, arch, peak: float) -> float:
    """A persistent program's stages in flight against its load latency (1: they cover it)."""
    operand_bytes_per_k = config.block_m * t.a.itemsize + config.block_n * t.b.itemsize
    consumed_per_s = peak / arch.sm_count * operand_bytes_per_k / (2 * config.block_m * config.block_n)
    in_flight = max(config.num_stages - 1, 1) * config.block_k * operand_bytes_per_k
    return min(1.0, in_flight / (consumed_per_s * LOAD_LATENCY_S)) ** 0.5


def operand_feed(config: GemmConfig, t: GemmTypes, arch, peak: float) -> float:
    """Operand bytes each tile pulls per FLOP, against what L2-assisted bandwidth can feed."""
    intensity = 2 * config.block_m * config.block_n / ((config.block_m + config.block_n) * t.a.itemsize)
    return min(1.0, intensity * dram_bytes_per_s(arch) * L2_REUSE / peak)


def row_fraction(config: GemmConfig, t: GemmTypes, persistent: bool) -> float:
    """Pointer loads of K rows shorter than a 128-byte line (TMA copies whole boxes: 1)."""
    return 1.0 if persistent else min(1.0, config.block_k * t.a.itemsize / 128) ** ROW_EXPONENT


def lone_latency(config: GemmConfig) -> float:
    """What one resident program, not persistent, keeps of its rate: it hides its own loads alone."""
    return 0.9 if config.num_stages >= 3 else 0.8


def spill_factor(occupancy: "_Occupancy", arch) -> float:
    """The more it spills, the slower: graded by how far the register estimate overshoots."""
    return SPILL_PENALTY * (arch.registers_per_thread_max / occupancy.registers) ** 2 if occupancy.spills else 1.0


def _persistent_terms(config: GemmConfig, p: GemmProblem, arch, peak: float, stream: DealtLoad | None,
                      flattened: bool) -> dict[str, float]:
    """Pipeline depth against load latency, and the per-tile overhead a flattened loop hides."""
    depth = pipeline_depth(config, p.types, arch, peak)
    k_tiles = math.ceil(p.k / config.block_k)
    overhead = FLATTENED_OVERHEAD_ITERATIONS if flattened else TILE_OVERHEAD_ITERATIONS
    if stream is not None:
        return {"depth": depth, "overlap": stream.iterations / (stream.iterations + overhead * stream.loops)}
    return {"depth": depth, "overlap": k_tiles / (k_tiles + overhead)}


def _intake_seconds(config: GemmConfig, p: GemmProblem, tiles: int, arch, stream: DealtLoad | None,
                    tma: bool) -> float:
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
    port = calibration.tma_port_bytes_per_s if tma else calibration.sm_port_bytes_per_s
    if stream is not None:  # an even share of all tiles' K iterations
        return tiles / stream.programs * per_tile / port
    return math.ceil(tiles / arch.sm_count) * per_tile / port


def _chain_seconds(config: GemmConfig, p: GemmProblem, tiles: int, sm_count: int, concurrent: int,
                   stream: DealtLoad | None, kernel: TileKernel) -> float:
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
    if kernel.persistent:
        fill = CHAIN_LATENCY_S * (1 if kernel.fills_once(config) else programs)
        return programs * k_iters * per_iter + fill
    return math.ceil(programs / concurrent) * (k_iters * per_iter + CHAIN_LATENCY_S)


@dataclass(frozen=True)
class _Occupancy:
    registers: int  # per thread, the accumulator's and the rest
    spills: bool
    resident: int  # programs per SM
    vectorised: Any  # A and B loaded in 16-byte vectors (their alignment, truthy where so)


# id(config) -> (config, arch, (A's and B's alignment, A's dtype), its occupancy): what a config's
# occupancy depends on of a problem is that little, so a new problem finds it made.
_OCCUPANCIES: dict[int, tuple] = {}
OCCUPANCIES_KEPT = 1 << 16


def _occupancy(config: GemmConfig, p: GemmProblem, arch) -> _Occupancy:
    given = (p.alignment.a, p.alignment.b, p.types.a)
    entry = _OCCUPANCIES.get(id(config))
    if entry is not None and entry[0] is config and entry[1] is arch and entry[2] == given:
        return entry[3]
    occupancy = made_occupancy(config, p.types.a, p.alignment.a and p.alignment.b, arch)
    if len(_OCCUPANCIES) >= OCCUPANCIES_KEPT:
        _OCCUPANCIES.clear()
    _OCCUPANCIES[id(config)] = (config, arch, given, occupancy)
    return occupancy


def made_occupancy(config: GemmConfig, a: DType, vectorised: Any, arch) -> _Occupancy:
    """A program's registers and residency, with A of dtype `a`, its operands loaded in vectors or not."""
    threads = config.num_warps * 32
    registers = accumulator_registers(config) + REGISTER_RESERVE
    if not vectorised:
        # Unaligned operands are loaded element by element, each through its own 64-bit
        # pointer held in registers: large tiles over few threads spill. Single bytes (fp8)
        # also take a register each until they are packed: on the unaligned fp8 cases of
        # gemm.csv, time grew 3x from 32 to 64 elements per thread per K step (128x128x64
        # over 8 warps: 4.4 ms, 64x64x32 over 4: 1.35 ms at 4095x4097x4093), not in bf16.
        per_element = 3 if a.is_fp8 else 2
        registers += per_element * (config.block_m + config.block_n) * config.block_k // threads
    spills = registers > arch.registers_per_thread_max + SPILL_MARGIN
    resident = blocks_per_sm(arch, threads=threads, shared_bytes=shared_memory_bytes(config),
                             registers_per_thread=min(registers, arch.registers_per_thread_max))
    return _Occupancy(registers, spills, resident, vectorised)


def _efficiency(config: GemmConfig, p: GemmProblem, arch, kernel: TileKernel, peak: float, tiles: int,
                occupancy: _Occupancy, stream: DealtLoad | None, concurrent: int) -> tuple[float, float, dict]:
    """(the fraction of the peak the tiles reach, row, the terms that made it)."""
    t = p.types
    persistent = kernel.persistent
    k_span = config.block_k * config.split_k
    waste = {
        "tile_m": tile_efficiency(p.m, config.block_m),
        "tile_n": tile_efficiency(p.n, config.block_n),
        "tile_k": tile_efficiency(p.k, k_span) if p.k >= k_span else p.k / (math.ceil(p.k / config.block_k) * config.block_k),
    }
    # Waves over SMs, for both families: the block scheduler spreads programs one per SM
    # before it doubles up, so tiles below 132 leave SMs idle, not slots. Programs sharing
    # an SM share its tensor cores; how many run at once (`concurrent`) decides whether
    # one can hide another's latency. (Counting resident slots instead rated 64x64 tiles
    # with 5 resident at 0.16 waves on square_512, where they ran fastest.)
    waves = wave_efficiency(tiles, arch.sm_count)
    if stream is not None:  # every program the same K iterations; the extra loops cost in `overlap`
        waves = stream.programs / arch.sm_count
    feed = operand_feed(config, t, arch, peak)
    # One resident program cannot hide its own loads and epilogue behind another's math:
    # credit for two or more (on the H200 suite, 128x128 tiles with 2 resident beat
    # 128x256 with 1 by up to 1.6x in fp8 and 1.5x at 1024^3).
    latency = 1.0 if concurrent >= 2 or persistent else lone_latency(config)
    row = row_fraction(config, t, persistent)
    efficiency = waste["tile_m"] * waste["tile_n"] * waste["tile_k"] * waves * feed * latency * row
    if not occupancy.vectorised:
        efficiency *= UNALIGNED_LOAD_FRACTION
    persistent_terms = {}
    if persistent:
        persistent_terms = _persistent_terms(config, p, arch, peak, stream, kernel.loops_across_tiles(config))
        efficiency *= persistent_terms["depth"] * persistent_terms["overlap"]
    efficiency *= spill_factor(occupancy, arch)
    return efficiency, row, {**waste, **persistent_terms, "waves": waves, "feed": feed, "latency": latency}


def _memory_seconds(config: GemmConfig, p: GemmProblem, arch, kernel: TileKernel, tiles: int,
                    occupancy: _Occupancy, stream: DealtLoad | None, row: float) -> tuple[float, float]:
    """(the slower of DRAM and the busiest SM's intake, the fraction of DRAM's rate in flight)."""
    t = p.types
    # Bandwidth needs bytes in flight (Little's law): the useful operand bytes that the
    # resident programs of one multiprocessor have requested at once.
    useful_rows = min(p.m, config.block_m)
    per_program = (useful_rows * config.block_k * t.a.itemsize + config.block_k * config.block_n * t.b.itemsize)
    per_program *= max(config.num_stages - 1, 1)
    programs_per_sm = 1.0 if kernel.persistent else min(occupancy.resident, max(tiles / arch.sm_count, 1.0))
    in_flight = min(1.0, per_program * programs_per_sm / arch.calibration.bytes_in_flight_per_sm)
    # Fewer programs than multiprocessors leave some idle; one busy SM draws more than its
    # even share of the bandwidth, but not all of it.
    busy = tiles if stream is None else stream.programs
    in_flight *= min(1.0, busy / arch.sm_count * SM_BANDWIDTH_SHARE) * row
    # DRAM and the SM's port are two bounds on one stream of bytes: combined more sharply than
    # compute and memory (on the H200 table Triton-only selection 0.977 -> 0.979 against a cube).
    intake_s = _intake_seconds(config, p, tiles, arch, stream, kernel.persistent)
    return soft_max(p.bytes() / (dram_bytes_per_s(arch) * in_flight), intake_s, 6), in_flight


def split_launches(config: GemmConfig, problem: GemmProblem) -> int:
    """A tile kernel's launches a call: the main one, and split-K's reduction where K is split."""
    return 1 + int(config.split_k > 1)


def tile_score(config: GemmConfig, problem: GemmProblem, arch, kernel: TileKernel) -> Score:
    """ideal / modelled device time of a tile family's kernel (the module's docstring says how)."""
    p = problem
    bandwidth = dram_bytes_per_s(arch)
    peak, ideal = roofline(p, arch)
    calibration = arch.calibration
    occupancy = _occupancy(config, p, arch)
    tiles = math.ceil(p.m / config.block_m) * math.ceil(p.n / config.block_n) * p.batch * config.split_k
    stream = kernel.dealt(config, p, arch)
    concurrent = 1 if kernel.persistent else min(occupancy.resident, math.ceil(tiles / arch.sm_count))
    efficiency, row, terms = _efficiency(config, p, arch, kernel, peak, tiles, occupancy, stream, concurrent)
    compute_s = p.flops() / (peak * efficiency)
    memory_s, in_flight = _memory_seconds(config, p, arch, kernel, tiles, occupancy, stream, row)
    reduce_s = 0.0
    if config.split_k > 1:
        reduce_s = 2 * config.split_k * p.batch * p.m * p.n * 4 / bandwidth + calibration.launch_s
    if stream is not None:
        reduce_s = stream.handoff_s
    compute_s /= kernel.compute_fraction
    memory_s /= kernel.bandwidth_fraction
    chain_s = _chain_seconds(config, p, tiles, arch.sm_count, concurrent, stream, kernel)
    modelled = (soft_max(soft_max(compute_s, memory_s), chain_s) + calibration.launch_s + reduce_s
                + kernel.start_seconds)
    value = ideal / modelled
    value *= layout_penalty(config, p)
    terms = {**terms, "resident": float(occupancy.resident), "concurrent": float(concurrent), "row": row,
             "in_flight": in_flight, "compute_us": compute_s * 1e6, "memory_us": memory_s * 1e6,
             "chain_us": chain_s * 1e6, "reduce_us": reduce_s * 1e6, "spills": float(occupancy.spills),
             "modelled_us": modelled * 1e6}
    return Score(value, terms)
