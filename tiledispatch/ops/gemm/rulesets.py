"""GEMM rule sets: named generators of configs.

A config is a tile shape (`Tile`) bound to a signature (types, layout, epilogue). By
construction tiny ⊂ tests ⊂ default ⊂ full; the tests prove it and that `full` never
repeats a name. Rule sets are arch-independent: `Registry.from_rule_set` drops the
configs an arch cannot run.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Iterator

from ...core.dtypes import DType
from ...core.op import RuleSet
from .config import AnyGemmConfig, Family, GemmConfig, VendorConfig
from .family import FAMILIES
from .problem import Activation, Epilogue, GemmLayout, GemmTypes


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    split_k: int = 1
    family: Family = Family.TILED
    epilogue_split: int = 1
    flatten: bool = False
    realign: bool = False
    b_itemsizes: tuple[int, ...] = (1, 2, 4)  # the element sizes of B it is registered for


def _persistent(bm, bn, bk, warps, stages, epilogue_split=1, flatten=False, group_m=8, split_k=1,
                realign=False) -> Tile:
    return Tile(bm, bn, bk, warps, stages, group_m, split_k, Family.TMA_PERSISTENT, epilogue_split, flatten,
                realign)


def _stream_k(bm, bn, bk, warps, stages, group_m=8) -> Tile:
    return Tile(bm, bn, bk, warps, stages, group_m, family=Family.STREAM_K)


def _ws(bm, bn, bk, stages, b_itemsizes=(1, 2, 4), family=Family.WS_PERSISTENT) -> Tile:
    return Tile(bm, bn, bk, 8, stages, 8, family=family, b_itemsizes=b_itemsizes)


def _pingpong(bm, bn, bk, stages, b_itemsizes=(1, 2, 4)) -> Tile:
    return _ws(bm, bn, bk, stages, b_itemsizes, Family.WS_PINGPONG)


def _gemv(bn, bk, warps, stages, b_itemsizes=(1, 2, 4)) -> Tile:
    return Tile(1, bn, bk, warps, stages, 1, family=Family.GEMV, b_itemsizes=b_itemsizes)


# Small tiles that the CPU interpreter runs quickly; split-K included.
TINY_TILES = (
    Tile(32, 32, 32, 4, 2, 4),
    Tile(16, 32, 32, 2, 1, 1),
    Tile(32, 16, 32, 2, 2, 2, split_k=3),
    Tile(64, 64, 32, 4, 3, 8),
    _persistent(32, 32, 32, 4, 2, epilogue_split=2, group_m=2),
    _gemv(8, 64, 1, 1),
)
TESTS_TILES = TINY_TILES + (
    _gemv(16, 64, 2, 2),
    _persistent(64, 32, 32, 4, 3, flatten=True),
    _persistent(32, 32, 32, 4, 2, epilogue_split=2, group_m=2, realign=True),
    Tile(32, 32, 32, 4, 2, 4, realign=True),
    _persistent(32, 32, 32, 4, 2, epilogue_split=2, group_m=2, split_k=3),
    Tile(64, 32, 64, 4, 3, 8),
    Tile(16, 64, 64, 4, 3, 1, split_k=4),
    Tile(128, 64, 32, 4, 3, 8),
    Tile(32, 128, 32, 4, 2, 4, split_k=2),
    _stream_k(32, 32, 32, 4, 2, group_m=2),
)
# Curated for sm_80+ tensor cores (the shapes Triton's own matmul tutorials and tuners
# keep returning to); split-K tiles for small M x N with deep K.
DEFAULT_TILES = TESTS_TILES + (
    Tile(128, 256, 64, 8, 3, 8),
    Tile(256, 128, 64, 8, 3, 8),
    Tile(128, 128, 64, 8, 3, 8),
    Tile(128, 128, 64, 4, 4, 8),
    Tile(64, 256, 64, 4, 4, 8),
    Tile(128, 64, 64, 4, 4, 8),
    Tile(64, 128, 64, 4, 4, 8),
    Tile(64, 64, 64, 4, 4, 8),
    Tile(16, 128, 128, 4, 4, 1),
    Tile(16, 64, 256, 4, 3, 1),
    Tile(64, 64, 128, 4, 3, 8, split_k=4),
    Tile(64, 128, 64, 4, 4, 8, split_k=2),
    # Deep K over few output tiles (deep_k_*, tall_skinny_* of the suite): enough programs
    # to fill 132 SMs only when K is split 16-64 ways.
    Tile(128, 64, 64, 4, 4, 8, split_k=2),
    Tile(128, 128, 64, 8, 3, 1, split_k=16),
    Tile(64, 64, 128, 4, 4, 1, split_k=16),
    Tile(32, 64, 128, 4, 4, 1, split_k=64),
    # Hopper: TMA loads and stores, one program per SM. 16-bit tiles (block_k 64), fp8 (128).
    _persistent(128, 256, 64, 8, 3, epilogue_split=2),
    _persistent(128, 256, 64, 8, 4, epilogue_split=2),
    _persistent(128, 256, 64, 8, 3, epilogue_split=2, flatten=True),
    _persistent(256, 128, 64, 8, 3, epilogue_split=2),
    _persistent(128, 128, 64, 8, 4, epilogue_split=2),
    _persistent(128, 128, 64, 4, 4),
    _persistent(128, 128, 64, 8, 4, flatten=True),
    _persistent(64, 256, 64, 4, 4),
    _persistent(128, 64, 64, 4, 4),
    _persistent(64, 128, 64, 4, 4),
    _persistent(64, 64, 64, 4, 4),
    _persistent(128, 256, 128, 8, 3, epilogue_split=2),
    _persistent(128, 256, 128, 8, 4, epilogue_split=2),
    _persistent(128, 256, 128, 8, 3, epilogue_split=2, flatten=True),
    _persistent(128, 128, 128, 8, 3),
    _persistent(128, 128, 128, 4, 3),
    _persistent(64, 128, 128, 4, 4),
    # Small M x N, or deep K, on Hopper (benchmarks/gemm_sweep.py, results/h200/gemm_sweep.csv):
    # five stages where one program per SM must hide its own load latency, and split-K where
    # the output tiles alone leave SMs idle. Each tile here was the fastest of the sweep on at
    # least one suite case, at 0.81-1.29x cuBLAS.
    _persistent(64, 64, 128, 4, 5),
    _persistent(64, 128, 128, 4, 5),
    _persistent(128, 128, 64, 4, 5),
    _persistent(128, 128, 128, 4, 5),
    _persistent(64, 256, 128, 4, 4),
    _persistent(64, 128, 128, 4, 4, split_k=2),
    _persistent(64, 128, 128, 4, 5, split_k=2),
    _persistent(64, 128, 128, 4, 5, split_k=4),
    _persistent(128, 128, 128, 4, 5, split_k=4),
    _persistent(64, 256, 128, 4, 4, split_k=4),
    _persistent(64, 256, 64, 4, 3, split_k=8),
    _persistent(128, 128, 64, 4, 4, split_k=32),
    _persistent(128, 128, 128, 4, 4, split_k=32),
    _persistent(64, 64, 128, 4, 5, split_k=128),
    # Operands with rows that are not 16-byte multiples (odd_4095x4097x4093, odd_3000x5000x100),
    # copied into aligned buffers first: the large 16-bit and fp8 tiles above, a small one, a
    # flattened one for short K loops, and the two tiled tiles that led on those cases unaligned.
    Tile(128, 128, 64, 8, 3, 8, realign=True),
    Tile(128, 64, 32, 4, 3, 8, realign=True),
    _persistent(128, 256, 64, 8, 3, epilogue_split=2, flatten=True, realign=True),
    _persistent(128, 256, 64, 8, 4, epilogue_split=2, realign=True),
    _persistent(128, 128, 64, 8, 4, epilogue_split=2, realign=True),
    _persistent(64, 128, 64, 4, 4, realign=True),
    _persistent(128, 256, 128, 8, 3, epilogue_split=2, realign=True),
    _persistent(128, 128, 128, 4, 5, realign=True),
    # A few rows of A (the decode projections at T = 16 and 32, results/h100/gemm_sweep_decode.csv):
    # narrow tiles over long K steps, enough programs without splitting K. The widest K steps
    # fit shared memory in fp8 only (the arch filter drops them in 16-bit).
    Tile(16, 32, 256, 4, 4, 1),
    Tile(16, 32, 512, 4, 3, 1),
    Tile(16, 32, 1024, 4, 4, 1),
    Tile(16, 64, 512, 4, 3, 1),
    # Large aligned rcr products (results/h100/gemm_sweep_ws.csv): ws-persistent's best tiles of the
    # sweep, 0.94-1.03x cuBLAS in bf16 and 0.98-1.07x in fp8 where tma-persistent's pick ran
    # 0.92-1.0x and 0.92-0.94x. With bias or an activation only the 128x128 ones are valid
    # (families/ws_persistent.WS_EPILOGUE_REGISTERS). fp8's 128x256x64 over 6 stages, which tied 128x256x128 over 3
    # on the H100, ran 2-11 % behind it on the H200's large rows (the gemm.csv that results/h200/README.md
    # names for it): it is in `full` only (re-ranked offline on that table, the fp8 picks reach 0.982 of
    # the oracle without it, 0.971 with it).
    _ws(128, 256, 64, 3, (2,)), _ws(128, 128, 64, 6, (2,)), _ws(128, 128, 64, 4, (2,)),
    _ws(128, 256, 128, 3, (1,)), _ws(128, 128, 128, 5, (1,)),
    # One row of A (the decode projections at T = 1; results/h100/gemm_sweep_gemv.csv): in bf16
    # the tile within 1 % of the best of 104 on each of six Llama projections (1.05-1.27x cuBLAS).
    # In fp8 the tile of the best worst case among 129 with 1, 2 or 4 K steps loaded together
    # (results/h100/gemm_sweep_gemv_steps.csv): 4 steps of 2 x 512, 1.03-1.17x torch._scaled_mm,
    # where the one-step tiles 1x1x2048 w4 and 1x8x1024 w8 ran 1.01-1.15x and 0.98-1.14x. In bf16 no tile
    # of several steps beat the one-step tile on the same sweep.
    _gemv(2, 2048, 2, 1, b_itemsizes=(2, 4)),
    _gemv(2, 512, 2, 4, b_itemsizes=(1,)),
)
# Stream-K tiles (accumulators of at most 64 registers per thread,
# families/stream_k.STREAM_K_MAX_ACCUMULATOR_REGISTERS).
# In `full`, not `default`: on the H100 sweep (results/h100/gemm_sweep_stream_k.csv) none beat
# the default set's best persistent or split-K tile on any of 14 cases in bf16 and fp8.
STREAM_K_TILES = (
    _stream_k(128, 128, 64, 8, 4),
    _stream_k(64, 256, 64, 8, 4),
    _stream_k(64, 128, 64, 4, 5),
    _stream_k(128, 64, 64, 4, 4),
    _stream_k(64, 128, 128, 4, 4),
    _stream_k(128, 128, 128, 8, 3),
    _stream_k(64, 256, 128, 8, 3),
)
# The warp-specialised families (Gluon: a loader warp, two MMA warpgroups), 16-bit tiles with
# 32-128 element K steps and fp8 with 64-128, each ring as deep as shared memory takes beside
# the two C staging buffers. ws-persistent first: its warpgroups share each tile, half the rows each.
WS_TILES = (
    _ws(128, 256, 64, 3, (2,)), _ws(256, 128, 64, 3, (2,)), _ws(128, 128, 64, 4, (2,)),
    _ws(128, 128, 64, 6, (2,)), _ws(128, 256, 32, 6, (2,)), _ws(128, 128, 128, 3, (2,)),
    _ws(128, 256, 128, 3, (1,)), _ws(256, 128, 128, 3, (1,)), _ws(128, 128, 128, 4, (1,)),
    _ws(128, 128, 128, 5, (1,)), _ws(128, 256, 64, 6, (1,)), _ws(128, 128, 64, 6, (1,)),
    # ws-pingpong: each warpgroup a whole tile of its own (accumulators of 128 registers a thread).
    _pingpong(128, 128, 64, 5, (2,)), _pingpong(128, 128, 64, 4, (2,)), _pingpong(64, 256, 64, 4, (2,)),
    _pingpong(128, 128, 128, 5, (1,)), _pingpong(128, 128, 128, 4, (1,)), _pingpong(64, 256, 128, 4, (1,)),
)


@functools.cache
def full_tiles() -> tuple[Tile, ...]:
    """The whole tiled space: made on the first `full` enumeration, not at import (its 3,000
    checked tiles take some 60 ms to build, which a process that never sweeps need not pay)."""
    return tuple(
        Tile(bm, bn, bk, w, s, 8, k)
        for bm, bn, bk, w, s, k in itertools.product(
            (16, 32, 64, 128, 256), (16, 32, 64, 128, 256), (32, 64, 128), (4, 8), (2, 3, 4, 5), (1, 2, 4, 8, 16)
        )
    )


_CPU_TYPES = (
    GemmTypes(DType.FP16, DType.FP16, DType.FP16),
    GemmTypes(DType.FP32, DType.FP32, DType.FP32),
    GemmTypes(DType.FP32, DType.FP32, DType.FP32, allow_tf32=True),
    GemmTypes(DType.FP16, DType.FP16, DType.FP32),
    GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16),
    GemmTypes(DType.FP8E4M3, DType.FP8E5M2, DType.BF16),
    GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.FP16),
)
# bf16 has no tl.dot under the interpreter; the arch filter drops it there.
TYPES = _CPU_TYPES + (
    GemmTypes(DType.BF16, DType.BF16, DType.BF16),
    GemmTypes(DType.BF16, DType.BF16, DType.FP32),
)
LAYOUTS = tuple(GemmLayout.parse(x) for x in ("rrr", "rcr", "crr", "ccr", "sss"))
_STRIDED = GemmLayout.parse("sss")
EPILOGUES = tuple(
    Epilogue(bias, activation, residual)
    for bias, activation, residual in itertools.product((False, True), Activation, (False, True))
)
_PLAIN = (Epilogue(),)


def _bind(tiles, types, layouts, epilogues) -> Iterator[AnyGemmConfig]:
    """Each tile for each signature its family takes (`GemmFamily.fits`: TMA descriptors need a
    contiguous last dim, fp8 and tf32 MMAs K-major operands, realign row- or column-major ones,
    the warp-specialised families 16-bit or fp8 rcr products without a residual) and the element
    sizes of B it is registered for (a gemv tile's best step differs in fp8), and the vendor path
    once per signature (GPU arches keep it)."""
    for t, epilogue in itertools.product(types, epilogues):
        yield VendorConfig(t, GemmLayout.parse("sss"), epilogue)
        for layout, tile in itertools.product(layouts, tiles):
            if t.b.itemsize not in tile.b_itemsizes:
                continue
            config = GemmConfig(tile.family, t, layout, epilogue, tile.block_m, tile.block_n, tile.block_k,
                                tile.group_m, tile.num_warps, tile.num_stages, tile.split_k,
                                tile.epilogue_split, tile.flatten, tile.realign)
            if FAMILIES.of(config).fits(config):
                yield config


def problem_class(problem) -> tuple:
    """A problem's class: its types and epilogue, which a config must match exactly, and its
    layout, which a config matches role by role or takes as strided (`supports`)."""
    return problem.types, problem.epilogue, problem.layout


def _signatures(within: tuple | None) -> tuple[tuple, tuple, tuple]:
    """The types, layouts and epilogues to bind: all of them, or those of the one class `within`
    names (the layouts its problems can take: their own and the strided one). Types and epilogue
    are `_bind`'s outer loops and layout its inner one, so a class comes out in the order of the
    whole set."""
    if within is None:
        return TYPES, LAYOUTS, EPILOGUES
    types, epilogue, layout = within
    return (tuple(t for t in TYPES if t == types), tuple(x for x in LAYOUTS if x == layout or x == _STRIDED),
            tuple(e for e in EPILOGUES if e == epilogue))


def tiny(within: tuple | None = None) -> Iterator[AnyGemmConfig]:
    return _bind(TINY_TILES, *_signatures(within))


def tests(within: tuple | None = None) -> Iterator[AnyGemmConfig]:
    return _bind(TESTS_TILES, *_signatures(within))


def default(within: tuple | None = None) -> Iterator[AnyGemmConfig]:
    return _bind(DEFAULT_TILES, *_signatures(within))


def full(within: tuple | None = None) -> Iterator[AnyGemmConfig]:
    """Every default config, plus the whole tiled space, the stream-k and the warp-specialised
    tiles for each signature without epilogue.

    The epilogue barely changes which tile is fastest, so sweeps over the whole space
    need not repeat it for all 16 epilogues.
    """
    types, layouts, epilogues = _signatures(within)
    plain = tuple(e for e in _PLAIN if e in epilogues)
    seen = set()
    for config in itertools.chain(default(within), _bind(full_tiles() + STREAM_K_TILES + WS_TILES, types, layouts, plain)):
        if config not in seen:
            seen.add(config)
            yield config


RULE_SETS = {RuleSet.TINY: tiny, RuleSet.TESTS: tests, RuleSet.DEFAULT: default, RuleSet.FULL: full}
