"""Analytic pieces of the `rules` ranking, shared by every op: waste, waves, occupancy.

Each returns an efficiency in (0, 1]; an op's ranking multiplies the ones that apply.
"""

from __future__ import annotations

import math


def tile_efficiency(size: int, tile: int) -> float:
    """Useful fraction of the work when `size` is covered by tiles of `tile` (the last one padded)."""
    return size / (math.ceil(size / tile) * tile)


def wave_efficiency(tiles: int, slots: int) -> float:
    """Busy fraction of the machine over all waves, with `slots` programs resident at once."""
    waves = math.ceil(tiles / slots)
    return tiles / (waves * slots)


def blocks_per_sm(arch, *, threads: int, shared_bytes: int, registers_per_thread: int) -> int:
    """Resident programs per multiprocessor: the tightest of threads, shared memory and registers."""
    limits = [
        arch.max_threads_per_sm // threads,
        arch.max_blocks_per_sm,
        arch.shared_memory_per_sm // max(shared_bytes, 1),
        arch.registers_per_sm // (max(registers_per_thread, 1) * threads),
    ]
    return max(1, min(limits))
