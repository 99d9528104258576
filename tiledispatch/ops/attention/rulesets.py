"""Attention rule sets: named generators of configs.

A config is a tile (`Tile`) bound to a family, a dtype and a pair of head dims; each Triton
family has one `Entry` (its tiles in each rule set and what it binds them to), the vendor
families one place in `VENDORS`. By construction tiny ⊂ tests ⊂ default ⊂ full; the tests
prove it and that no name repeats.
Rule sets are arch-independent: `Registry.from_rule_set` drops what an arch cannot run
(bf16 and the vendor families on the interpreter, tiles beyond the shared memory).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Callable

from ...core.dtypes import DType
from ...core.op import RuleSet
from .config import AnyAttentionConfig, AttentionConfig, Family, VendorConfig
from .families.bwd_ws import BWD_WS_HEAD_DIMS
from .families.fwd_ws import HEAD_DIMS as WS_HEAD_DIMS
from .problem import HEAD_DIMS, Direction


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Small tiles that the CPU interpreter runs quickly.
TINY_FWD = (Tile(16, 16, 2, 1), Tile(32, 16, 4, 2))
TINY_TMA = (Tile(16, 16, 4, 2),)
TINY_BWD = (Tile(16, 16, 2, 1),)
TESTS_FWD = TINY_FWD + (Tile(16, 32, 4, 2), Tile(64, 32, 4, 2))
TESTS_TMA = TINY_TMA + (Tile(32, 16, 4, 2),)
TESTS_BWD = TINY_BWD + (Tile(32, 16, 4, 1), Tile(16, 32, 4, 2))
# Curated for sm_80+ tensor cores: the shapes FlashAttention-2 and Triton's fused-attention
# tutorial use for the forward (128 x 64..128 over 4-8 warps; 128 x 128 over 8 warps holds
# O and the scores in 128 registers a thread at d=128, where 128 x 64 over 4 warps spills:
# sm_90 compiles). Tiles beyond the shared memory (128 x 128 x 3 stages at d=128) are
# dropped per arch by the registry. Measured choices replace these after the H200 sweep
# (benchmarks/results/h200/attention_sweep.csv; a sweep now: `tiledispatch sweep --op attention`).
DEFAULT_FWD = TESTS_FWD + (
    Tile(128, 64, 4, 3), Tile(128, 64, 8, 3), Tile(128, 128, 8, 3), Tile(128, 32, 4, 3),
    Tile(64, 64, 4, 3), Tile(128, 64, 8, 2), Tile(64, 128, 4, 2), Tile(128, 128, 8, 2), Tile(128, 128, 4, 2),
)
DEFAULT_TMA = TESTS_TMA + (
    Tile(128, 128, 8, 2), Tile(128, 128, 8, 3), Tile(128, 64, 8, 3), Tile(128, 64, 8, 2), Tile(128, 64, 4, 3),
    Tile(128, 128, 4, 2), Tile(64, 64, 4, 3),
)
# The warp-specialised forward (fwd-ws): two MMA warpgroups of 64 rows. Timed in turns on the
# H100 at d=128 (benchmarks/studies/attention_forward_ab.py): 128x128 ran 1.26-1.47x fwd-tma's best
# tile and 0.84-1.16x cuDNN, with 2 and 3 stages within 4-9 % of each other either way;
# 128x64 0.79-0.97x of 128x128. At d=256 only 128x64 over 2 stages fits (192 KiB): 1.26-1.49x
# fwd-tma's 128x64 w8 s2.
DEFAULT_WS = (Tile(128, 128, 8, 2), Tile(128, 128, 8, 3), Tile(128, 64, 8, 3), Tile(128, 64, 8, 2))
# bwd-ws: two warpgroups own 128 keys and step 32 query rows, or 64 at d=64 (the rules refuse it at
# 128); at d=256 they share 64 keys (the rules keep each tile to the head dims it fits).
DEFAULT_BWD_WS = (Tile(32, 128, 8, 3), Tile(32, 128, 8, 2), Tile(64, 128, 8, 2), Tile(32, 64, 8, 2))
# Backward: (block_m, block_n) = (rows stepped, rows owned). FlashAttention-2 and the Triton
# tutorial own 128 keys (dK/dV) or 128 queries (dQ) and step 32..64 rows of the other side.
DEFAULT_BWD = TESTS_BWD + (
    Tile(64, 64, 4, 2), Tile(32, 64, 4, 2), Tile(64, 128, 8, 2), Tile(32, 128, 4, 2), Tile(64, 128, 8, 3),
    Tile(32, 128, 4, 3), Tile(32, 128, 8, 2), Tile(32, 128, 8, 3), Tile(128, 128, 8, 2), Tile(16, 128, 4, 3),
    # d = 256 (Gemma's head dim; with its soft-cap no vendor backend takes the problem): the
    # tiles above do not fit, the tests' 16 x 32 over 4 warps does. Of the full set's
    # 136 d256 tiles on d256_S2048 (H100, benchmarks/results/h100/attention_sweep_d256.csv):
    # 64 x 64 over 8 warps ran 178 TFLOP/s, 64 x 32 over 4 warps 171, 16 x 32 over 4 warps 83.
    Tile(64, 64, 8, 2), Tile(64, 32, 4, 2),
)
FULL_TILES = tuple(Tile(bm, bn, w, s) for bm, bn, w, s in itertools.product(
    (16, 32, 64, 128, 256), (16, 32, 64, 128), (2, 4, 8), (1, 2, 3, 4)))

DTYPES = (DType.FP16, DType.FP32, DType.BF16)  # bf16 last: the interpreter drops it
# The half dtypes take every family; fp8 is bound to the tensor-descriptor forward alone.
HALF_DTYPES = (DType.FP16, DType.BF16)
FP8 = (DType.FP8E4M3,)
HEAD_DIM_PAIRS = tuple((d, d) for d in HEAD_DIMS) + ((192, 128),)
# The vendor families' entry: each backend once per dtype and direction.
VENDORS = (Family.SDPA_CUDNN, Family.SDPA_FLASH)


def _any_head_dims(d_qk: int, d_v: int) -> bool:
    return True


def _power_of_two_head_dims(d_qk: int, d_v: int) -> bool:
    return d_qk & (d_qk - 1) == 0 == d_v & (d_v - 1)


@dataclass(frozen=True)
class Entry:
    """A Triton family's place in the rule sets: its tiles in each (`full`: FULL_TILES for every
    family), and the dtypes and (d_qk, d_v) pairs of HEAD_DIM_PAIRS it is bound to."""

    family: Family
    tiles: Mapping[RuleSet, tuple[Tile, ...]]
    dtypes: tuple[DType, ...]
    head_dims: Callable[[int, int], bool] = _any_head_dims


# One entry a Triton family, in the order the rule sets list them (within each dtype). The
# tensor-descriptor families take half dtypes and power-of-two head dims only; fp8 inputs (forward
# only, no vendor backend takes them) the tensor-descriptor forward; the warp-specialised ones the
# equal head dims their kernels take.
ENTRIES = (
    Entry(Family.FWD, {RuleSet.TINY: TINY_FWD, RuleSet.TESTS: TESTS_FWD, RuleSet.DEFAULT: DEFAULT_FWD}, DTYPES),
    Entry(Family.FWD_TMA, {RuleSet.TINY: TINY_TMA, RuleSet.TESTS: TESTS_TMA, RuleSet.DEFAULT: DEFAULT_TMA},
          FP8 + HALF_DTYPES, _power_of_two_head_dims),
    Entry(Family.FWD_WS, {RuleSet.DEFAULT: DEFAULT_WS}, HALF_DTYPES,
          lambda d_qk, d_v: d_qk == d_v and d_qk in WS_HEAD_DIMS),
    Entry(Family.BWD, {RuleSet.TINY: TINY_BWD, RuleSet.TESTS: TESTS_BWD, RuleSet.DEFAULT: DEFAULT_BWD}, DTYPES),
    Entry(Family.BWD_ATOMIC, {RuleSet.TINY: TINY_BWD, RuleSet.TESTS: TESTS_BWD, RuleSet.DEFAULT: DEFAULT_BWD},
          DTYPES),
    Entry(Family.BWD_WS, {RuleSet.DEFAULT: DEFAULT_BWD_WS}, HALF_DTYPES,
          lambda d_qk, d_v: d_qk == d_v and d_qk in BWD_WS_HEAD_DIMS),
)


def problem_class(problem) -> DType:
    """A problem's class: its dtype, which every config must match (`supports`)."""
    return problem.dtype


def _bind(rule_set: RuleSet, within: DType | None = None) -> Iterator[AnyAttentionConfig]:
    """For each dtype (fp8 first; only `within` where given: dtype is the outer loop, so a class
    comes out in the order of the whole set), the vendor candidates once per direction, then each
    entry's tiles for each head-dim pair it takes."""
    for dtype in FP8 + DTYPES:
        if within is not None and dtype is not within:
            continue
        if dtype in DTYPES:
            for direction in Direction:
                for family in VENDORS:
                    yield VendorConfig(family, dtype, direction)
        for entry in ENTRIES:
            if dtype not in entry.dtypes:
                continue
            tiles = FULL_TILES if rule_set is RuleSet.FULL else entry.tiles.get(rule_set, ())
            head_dims = [pair for pair in HEAD_DIM_PAIRS if entry.head_dims(*pair)]
            for (d_qk, d_v), tile in itertools.product(head_dims, tiles):
                yield AttentionConfig(entry.family, dtype, d_qk, d_v, tile.block_m, tile.block_n, tile.num_warps,
                                      tile.num_stages)


def tiny(within: DType | None = None) -> Iterator[AnyAttentionConfig]:
    return _bind(RuleSet.TINY, within)


def tests(within: DType | None = None) -> Iterator[AnyAttentionConfig]:
    return _bind(RuleSet.TESTS, within)


def default(within: DType | None = None) -> Iterator[AnyAttentionConfig]:
    return _bind(RuleSet.DEFAULT, within)


def full(within: DType | None = None) -> Iterator[AnyAttentionConfig]:
    """Every default config, plus the whole tile space for every signature."""
    seen = set()
    for config in itertools.chain(default(within), _bind(RuleSet.FULL, within)):
        if config not in seen:
            seen.add(config)
            yield config


RULE_SETS = {RuleSet.TINY: tiny, RuleSet.TESTS: tests, RuleSet.DEFAULT: default, RuleSet.FULL: full}
