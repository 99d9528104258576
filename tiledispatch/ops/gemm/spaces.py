"""Tile spaces: configs a sweep times beyond the rule sets (`tiledispatch sweep --op gemm --space NAME`).

A rule set lists the tiles the dispatcher ranks; a space generates, for one problem, the tiles
worth trying when a rule set is thin or a family is being tuned, so that a sweep over it says
which belong in a rule set or where the ranking's figures go wrong. Each space takes the
problem's types, layout and epilogue (a config of another would not take the problem) and the
arch's SM count; the sweep times the space's configs that `supports` accepts, and the rule set's
vendor kernel beside them.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

from .config import Family, GemmConfig
from .problem import GemmProblem
from .rules import accumulator_registers, shared_memory_bytes
from .rulesets import WS_TILES

SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)

# (block_m, block_n, block_k, stages) of the stream-K space: accumulators of 64 registers a thread.
STREAM_K_TILES = {
    False: ((128, 128, 64, 3), (128, 128, 64, 4), (64, 256, 64, 3), (64, 256, 64, 4), (64, 128, 64, 4),
            (64, 128, 64, 5), (128, 64, 64, 4), (64, 128, 128, 4), (128, 128, 128, 3)),
    True: ((128, 128, 128, 3), (128, 128, 128, 4), (64, 256, 128, 3), (64, 256, 128, 4), (64, 128, 128, 4),
           (64, 128, 128, 5), (128, 64, 128, 4)),  # fp8
}


def _config(problem: GemmProblem, family: Family, block_m: int, block_n: int, block_k: int, group_m: int,
            num_warps: int, num_stages: int, split_k: int = 1, epilogue_split: int = 1) -> GemmConfig:
    return GemmConfig(family, problem.types, problem.layout, problem.epilogue, block_m, block_n, block_k, group_m,
                      num_warps, num_stages, split_k, epilogue_split)


def split_k(problem: GemmProblem, arch) -> Iterator[GemmConfig]:
    """tma-persistent tiles with split-K whose work units fill 0.5-4 waves of SMs (split 1 always):
    small M x N over deep K."""
    block_ks = (128,) if problem.types.a.is_fp8 else (64, 128)
    for bm, bn, bk, stages, split in itertools.product((64, 128), (64, 128, 256), block_ks, (3, 4, 5), SPLITS):
        units = math.ceil(problem.m / bm) * math.ceil(problem.n / bn) * problem.batch * split
        k_iters = math.ceil(problem.k / bk / split)
        if split > 1 and not (arch.sm_count // 2 <= units <= 4 * arch.sm_count and k_iters >= 2):
            continue
        warps = 8 if bm * bn >= 128 * 256 else 4
        yield _config(problem, Family.TMA_PERSISTENT, bm, bn, bk, 8, warps, stages, split)


def stream_k(problem: GemmProblem, arch) -> Iterator[GemmConfig]:
    """Stream-K tiles, each beside its tma-persistent twin (the same tile, whole tiles a program): the
    pair shows what dealing the last wave's K iterations buys."""
    for bm, bn, bk, stages in STREAM_K_TILES[problem.types.a.is_fp8]:
        for family in (Family.STREAM_K, Family.TMA_PERSISTENT):
            yield _config(problem, family, bm, bn, bk, 8, bm * bn // (32 * 64), stages)


def decode(problem: GemmProblem, arch) -> Iterator[GemmConfig]:
    """Pointer tiles for a few rows of A (decode projections, M <= 32): B is read once, so the kernel
    is a stream of B at memory speed. Narrow N tiles give every SM several programs without
    splitting K, long K steps give each load enough bytes; tiles over 200 KiB of shared memory, and
    grids under half a wave or over 16 waves, are left out."""
    block_m = 16 if problem.m <= 16 else 32
    block_ks = (256, 512, 1024) if problem.types.a.is_fp8 else (128, 256, 512)
    for bn, bk, stages, split in itertools.product((16, 32, 64), block_ks, (2, 3, 4), (1, 2, 4)):
        units = math.ceil(problem.n / bn) * problem.batch * split
        config = _config(problem, Family.TILED, block_m, bn, bk, 1, 4, stages, split)
        if arch.sm_count // 2 <= units <= 16 * arch.sm_count and shared_memory_bytes(config) <= 200 * 1024:
            yield config


def gemv(problem: GemmProblem, arch) -> Iterator[GemmConfig]:
    """The gemv family (M = 1): column tiles of 1-32, K steps of 256-2048 elements loaded 1, 2 or 4 at
    a time, 2-8 warps, accumulators of 8-128 registers a thread and at most 160 with the steps."""
    if problem.m != 1:
        return
    for bn, bk, warps, stages in itertools.product((1, 2, 4, 8, 16, 32), (256, 512, 1024, 2048), (2, 4, 8), (1, 2, 4)):
        config = _config(problem, Family.GEMV, 1, bn, bk, 1, warps, stages)
        if 8 <= bn * bk // (warps * 32) <= 128 and accumulator_registers(config) <= 160 and bk * stages <= problem.k:
            yield config


def warp_specialised(problem: GemmProblem, arch) -> Iterator[GemmConfig]:
    """The warp-specialised tiles (rulesets.WS_TILES: ws-persistent and ws-pingpong) for B's element
    size, and tma-persistent's tiles of ws-persistent's first three shapes (8 warps, C stored in
    halves where 256 wide)."""
    tiles = [t for t in WS_TILES if problem.types.b.itemsize in t.b_itemsizes]
    for t in tiles:
        yield _config(problem, t.family, t.block_m, t.block_n, t.block_k, 8, 8, t.num_stages)
    for t in [t for t in tiles if t.family is Family.WS_PERSISTENT][:3]:
        yield _config(problem, Family.TMA_PERSISTENT, t.block_m, t.block_n, t.block_k, 8, 8, t.num_stages,
                      epilogue_split=2 if t.block_n == 256 else 1)


SPACES = {"split-k": split_k, "stream-k": stream_k, "decode": decode, "gemv": gemv, "ws": warp_specialised}
