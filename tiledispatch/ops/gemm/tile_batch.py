"""The tile families' model (`ranking.tile_score`) over many configs at once, as numpy columns.

A problem's first sight scores every tile config of its class: one Python call each cost 20 us
on the CPU machine (1.7 ms a class of 80), the same few dozen operations on new numbers each time.
Here each operation runs once over a column of all the configs. `TileColumns` holds what a config
alone decides (its tile, its kernel's terms, its occupancy either way its operands load), made once
per candidate set; `tile_terms` is `tile_score` written over those columns, step for step in its
order of operations and with its rounding (`power_of`), so each number is the scalar model's, to
the bit. Configs whose grid deals K out (stream-K, `TileKernel.deals`) keep the scalar model: a
class has one or two.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np

from ...heuristics.roofline import dram_bytes_per_s
from . import ranking
from .config import GemmConfig
from .problem import GemmProblem


def _cdiv(a, b):
    """Integer ceiling division, for ints and int64 columns alike: math.ceil(a / b) of the model."""
    return -(-a // b)


def _soft_max(first: np.ndarray, second: np.ndarray, power: int = 3) -> np.ndarray:
    """`roofline.soft_max` of two columns, rounded as it rounds (`power_of`)."""
    return power_of(power_of(first, power) + power_of(second, power), 1 / power)


def power_of(base: np.ndarray, exponent: float) -> np.ndarray:
    """`base ** exponent` of a column, each rounded as Python's float pow rounds it: `float_power`
    calls libm's pow for each element, where `power` (and `**`) takes a vector pow (AVX-512 SVML)
    that rounds some last bits apart, and two tiles whose scores differ in the last bit (64x128
    and 128x64) would swap places."""
    return np.float_power(base, exponent)


@dataclass(frozen=True)
class Occupancies:
    """Each config's residency and what its registers cost it (`ranking.made_occupancy`), with its
    operands loaded as vectors or element by element: one column each."""

    resident: np.ndarray  # programs per SM (int64)
    spills: np.ndarray  # 1.0 where the registers spill, else 0.0
    spill_factor: np.ndarray  # `ranking.spill_factor`
    load_factor: np.ndarray  # UNALIGNED_LOAD_FRACTION where loaded element by element, else 1.0

    @classmethod
    def of(cls, configs: Sequence[GemmConfig], vectorised: bool, arch) -> "Occupancies":
        made = [ranking.made_occupancy(c, c.types.a, vectorised, arch) for c in configs]
        return cls(np.array([o.resident for o in made], dtype=np.int64),
                   np.array([float(o.spills) for o in made]),
                   np.array([ranking.spill_factor(o, arch) for o in made]),
                   np.full(len(made), 1.0 if vectorised else ranking.UNALIGNED_LOAD_FRACTION))

    def take(self, index: np.ndarray) -> "Occupancies":
        """The rows at `index`."""
        return Occupancies(*(getattr(self, f.name).take(index) for f in fields(self)))

    def where(self, vectorised: np.ndarray, other: "Occupancies") -> "Occupancies":
        """Ours where `vectorised`, else `other`'s: a problem whose realign configs load vectors."""
        return Occupancies(*(np.where(vectorised, getattr(self, f.name), getattr(other, f.name)) for f in fields(self)))


@dataclass(frozen=True)
class TileColumns:
    """What `tile_score` reads of each config and its family's `TileKernel`, one column a field.

    The configs take problems of their own types only (`supports`), so what their types decide
    (peak, feed, depth) is read from the config."""

    bm: np.ndarray  # int64 columns: the tile, stages over 1 (at least one), split-K, element sizes
    bn: np.ndarray
    bk: np.ndarray
    stages_m1: np.ndarray
    split: np.ndarray
    ia: np.ndarray
    ib: np.ndarray
    k_span: np.ndarray  # int64 products the model takes whole: K a program covers, its split's K steps
    a_step: np.ndarray  # bytes of a row of A a K step
    b_step: np.ndarray  # bytes of B's tile a K step
    persistent: np.ndarray  # bool
    fills_once: np.ndarray  # bool
    compute_fraction: np.ndarray  # float columns: the kernel's terms and the config's own
    bandwidth_fraction: np.ndarray
    start_s: np.ndarray
    overhead: np.ndarray  # K iterations a tile's fill and epilogue cost
    row: np.ndarray
    feed: np.ndarray
    depth: np.ndarray  # persistent configs' (1.0 elsewhere, unread)
    lone_latency: np.ndarray
    per_iter: np.ndarray  # seconds a K iteration waits on its loads
    port: np.ndarray  # the SM's intake, bytes a second: TMA's or pointer loads'
    vectors: Occupancies  # operands loaded as 16-byte vectors
    elements: Occupancies  # element by element

    def take(self, index: np.ndarray) -> "TileColumns":
        """The configs at `index`: a problem's scores are made for the configs that take it alone."""
        return TileColumns(*(getattr(self, f.name).take(index) for f in fields(self)))

    @classmethod
    def of(cls, configs: Sequence[GemmConfig], kernels: Sequence[ranking.TileKernel], arch) -> "TileColumns":
        calibration = arch.calibration
        peaks = [ranking.types_peak_flops(c.types, arch) for c in configs]

        def ints(values) -> np.ndarray:
            return np.array(list(values), dtype=np.int64)

        def floats(values) -> np.ndarray:
            return np.array(list(values), dtype=np.float64)

        return cls(
            bm=ints(c.block_m for c in configs), bn=ints(c.block_n for c in configs),
            bk=ints(c.block_k for c in configs), stages_m1=ints(max(c.num_stages - 1, 1) for c in configs),
            split=ints(c.split_k for c in configs), ia=ints(c.types.a.itemsize for c in configs),
            ib=ints(c.types.b.itemsize for c in configs), k_span=ints(c.block_k * c.split_k for c in configs),
            a_step=ints(c.block_k * c.types.a.itemsize for c in configs),
            b_step=ints(c.block_k * c.block_n * c.types.b.itemsize for c in configs),
            persistent=np.array([k.persistent for k in kernels], dtype=bool),
            fills_once=np.array([k.fills_once(c) for c, k in zip(configs, kernels)], dtype=bool),
            compute_fraction=floats(k.compute_fraction for k in kernels),
            bandwidth_fraction=floats(k.bandwidth_fraction for k in kernels),
            start_s=floats(k.start_seconds for k in kernels),
            overhead=floats(ranking.FLATTENED_OVERHEAD_ITERATIONS if k.loops_across_tiles(c)
                            else ranking.TILE_OVERHEAD_ITERATIONS for c, k in zip(configs, kernels)),
            row=floats(ranking.row_fraction(c, c.types, k.persistent) for c, k in zip(configs, kernels)),
            feed=floats(ranking.operand_feed(c, c.types, arch, peak) for c, peak in zip(configs, peaks)),
            depth=floats(ranking.pipeline_depth(c, c.types, arch, peak) if k.persistent else 1.0
                         for c, k, peak in zip(configs, kernels, peaks)),
            lone_latency=floats(ranking.lone_latency(c) for c in configs),
            per_iter=floats(ranking.CHAIN_LATENCY_S / max(c.num_stages - 1, 1) for c in configs),
            port=floats(calibration.tma_port_bytes_per_s if k.persistent else calibration.sm_port_bytes_per_s
                        for k in kernels),
            vectors=Occupancies.of(configs, True, arch), elements=Occupancies.of(configs, False, arch),
        )


def tile_terms(c: TileColumns, occupancy: Occupancies, penalty: np.ndarray, p: GemmProblem,
               arch) -> dict[str, np.ndarray]:
    """`tile_score` of every config of `c` on `p`: its terms' columns, with its value ("device_score")
    and "modelled" (seconds) beside them. `occupancy` is each config's for `p`'s operands, `penalty`
    its `layout_penalty`."""
    m, n, k, sms = p.m, p.n, p.k, arch.sm_count
    calibration, bandwidth = arch.calibration, dram_bytes_per_s(arch)
    peak, ideal = ranking.roofline(p, arch)
    persistent = c.persistent
    m_tiles, n_tiles, k_tiles = _cdiv(m, c.bm), _cdiv(n, c.bn), _cdiv(k, c.bk)
    tiles = m_tiles * n_tiles * p.batch * c.split
    programs = _cdiv(tiles, sms)  # the busiest SM's
    concurrent = np.where(persistent, 1, np.minimum(occupancy.resident, programs))
    # _efficiency
    k_span = c.k_span
    tile_m, tile_n = m / (m_tiles * c.bm), n / (n_tiles * c.bn)
    tile_k = np.where(k >= k_span, k / (_cdiv(k, k_span) * k_span), k / (k_tiles * c.bk))
    waves = tiles / (programs * sms)
    latency = np.where((concurrent >= 2) | persistent, 1.0, c.lone_latency)
    efficiency = tile_m * tile_n * tile_k * waves * c.feed * latency * c.row * occupancy.load_factor
    overlap = k_tiles / (k_tiles + c.overhead)
    efficiency = efficiency * np.where(persistent, c.depth * overlap, 1.0) * occupancy.spill_factor
    compute_s = p.flops() / (peak * efficiency) / c.compute_fraction
    # _memory_seconds and _intake_seconds
    rows = np.minimum(m, c.bm)
    per_program = (rows * c.a_step + c.b_step) * c.stages_m1  # integers: their grouping changes nothing
    per_sm = tiles / sms
    programs_per_sm = np.where(persistent, 1.0, np.minimum(occupancy.resident, np.maximum(per_sm, 1.0)))
    in_flight = np.minimum(1.0, per_program * programs_per_sm / calibration.bytes_in_flight_per_sm)
    in_flight = in_flight * (np.minimum(1.0, per_sm * ranking.SM_BANDWIDTH_SHARE) * c.row)
    intake_s = programs * ((rows * c.ia + np.minimum(n, c.bn) * c.ib) * _cdiv(k, c.split)) / c.port
    memory_s = _soft_max(p.bytes() / (bandwidth * in_flight), intake_s, 6) / c.bandwidth_fraction
    reduce_s = np.where(c.split > 1, c.split * (2 * p.batch * m * n * 4) / bandwidth + calibration.launch_s, 0.0)
    # _chain_seconds
    k_iters = _cdiv(k_tiles, c.split)
    chain_s = np.where(persistent,
                       programs * k_iters * c.per_iter + ranking.CHAIN_LATENCY_S * np.where(c.fills_once, 1, programs),
                       _cdiv(programs, concurrent) * (k_iters * c.per_iter + ranking.CHAIN_LATENCY_S))
    modelled = _soft_max(_soft_max(compute_s, memory_s), chain_s) + calibration.launch_s + reduce_s + c.start_s
    return {"device_score": ideal / modelled * penalty, "modelled": modelled, "tile_m": tile_m, "tile_n": tile_n,
            "tile_k": tile_k, "depth": c.depth, "overlap": overlap, "waves": waves, "feed": c.feed, "latency": latency,
            "resident": occupancy.resident.astype(np.float64), "concurrent": concurrent.astype(np.float64),
            "row": c.row, "in_flight": in_flight, "compute_us": compute_s * 1e6, "memory_us": memory_s * 1e6,
            "chain_us": chain_s * 1e6, "reduce_us": reduce_s * 1e6, "spills": occupancy.spills,
            "modelled_us": modelled * 1e6}
