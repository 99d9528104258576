"""The public benchmark suites (`benchmarks/suites/*.json`) as a problem source, so that
`tiledispatch sweep --problems SUITE.json --cases A,B` times a suite's cases with every kernel
of a family, as the per-op benchmarks pose them.

A suite file is {"description", "dtypes", "cases": [...]}; its op is told by its cases' fields.
- GEMM (M, N, K, batch): A row-major, B the transposed view of a row-major N x K matrix (an
  nn.Linear's weight); forward.
- Conv (N, C, K, G, input, filter, stride, pad, dilation; C and K totals over the groups):
  channels-last, no epilogue; forward, bwd_data and bwd_weight.
- Attention (B, Hq, Hkv, Sq, Skv, D, causal, mode) in BHSD: `prefill` forward and backward,
  `decode` (one query token a sequence) forward only. `paged` cases ask for a paged KV cache,
  which the attention op does not take: they are refused, named, as are the other combinations
  the op refuses.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from ...core.jsonio import JsonFileError, read_json
from . import attention, conv, gemm
from .base import Collector, Refusal
from .catalog import canonical_direction

LOG = logging.getLogger(__name__)

# The fields that tell a suite's op, the fields its cases need, and the directions they run in.
_OP_FIELDS = {"gemm": {"M", "N", "K"}, "conv": {"C", "K", "G", "filter"}, "attention": {"Hq", "Hkv", "Sq"}}
_REQUIRED = {"gemm": {"M", "N", "K"}, "conv": {"N", "C", "K", "G", "input", "filter", "stride", "pad", "dilation"},
             "attention": {"B", "Hq", "Hkv", "Sq", "Skv", "D"}}
DIRECTIONS = {"gemm": gemm.DIRECTIONS, "conv": conv.DIRECTIONS, "attention": attention.DIRECTIONS}


def is_suite(data: Any) -> bool:
    """Whether parsed JSON is a suite file (its cases, not a list of problems)."""
    return isinstance(data, dict) and isinstance(data.get("cases"), list) and "problems" not in data


def is_suite_file(path: str | os.PathLike) -> bool:
    """Whether the JSON file at `path` is a suite (False where it cannot be read: its reader says why)."""
    try:
        return is_suite(read_json(path))
    except (JsonFileError, OSError):
        return False


def suite_op(data: dict, where: str) -> str:
    """The op of a suite's cases (every case of a suite is of one op)."""
    ops = {op for case in data["cases"] if isinstance(case, dict)
           for op, fields in _OP_FIELDS.items() if fields <= set(case)}
    if len(ops) != 1:
        raise InvalidProblemError(f"suite {where}: its cases must all be of one op, told by their fields "
                                  f"({'; '.join(f'{op}: {sorted(f)}' for op, f in _OP_FIELDS.items())}); "
                                  f"found {sorted(ops) or 'none'}")
    return ops.pop()


def _gemm(case: dict, dtype: str, direction: str):
    return gemm.gemm(case["M"], case["N"], case["K"], dtype, "rcr", batch=case.get("batch", 1))


def _spatial(value, dims: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, list) else (value,) * dims


def _conv(case: dict, dtype: str, direction: str):
    dims = len(case["input"])
    layer = conv.Layer("suite", case["name"], case["C"], case["K"], case["G"], tuple(case["filter"]),
                       _spatial(case["stride"], dims), _spatial(case["pad"], dims),
                       _spatial(case["dilation"], dims), tuple(case["input"]), False)
    return conv.conv(layer, case["N"], dtype, direction)


def _attention(case: dict, dtype: str, direction: str):
    mode = case.get("mode", "prefill")
    if mode == "paged":
        raise UnsupportedError("a paged KV cache (mode 'paged') is not an attention problem tiledispatch takes")
    if mode == "decode" and direction == "bwd":
        raise UnsupportedError("decode cases run forward only")
    shape = attention.Shape(case["B"], case["Sq"], case["Skv"], case["Hq"], case["Hkv"], case["D"], case["D"],
                            causal=case.get("causal", False), layout="bhsd")
    return attention.attention(shape, dtype, direction)


_POSE = {"gemm": _gemm, "conv": _conv, "attention": _attention}


def suite_problems(path: str | os.PathLike, op: str, dtype: str, direction: str | None = None,
                   cases: tuple[str, ...] | None = None) -> tuple[tuple, tuple[Refusal, ...]]:
    """(problems, refusals) of the suite file at `path` for `op` in `dtype`: each case (or those
    named in `cases`, in the suite's order) in `direction`, or in every direction of the op."""
    try:
        data = read_json(path)
    except (JsonFileError, OSError) as e:
        raise InvalidProblemError(f"suite {path}: {e}") from None
    if not is_suite(data):
        raise InvalidProblemError(f'suite {path}: expected {{"description", "dtypes", "cases": [...]}}')
    found = suite_op(data, str(path))
    if found != op:
        raise InvalidArgumentError(f"suite {path} holds {found} cases, not {op}: pass --op {found}")
    names = [case.get("name") for case in data["cases"]]
    unknown = [name for name in cases or () if name not in names]
    if unknown:
        raise InvalidArgumentError(f"cases {unknown} are not in suite {path}; it has: {', '.join(map(str, names))}")
    if dtype not in data.get("dtypes", ()):
        raise UnsupportedError(f"suite {path} runs dtypes {data.get('dtypes')}, not {dtype!r}")
    directions = DIRECTIONS[op]
    direction = canonical_direction(op, directions, direction)
    if direction is not None and direction not in directions:
        raise InvalidArgumentError(f"direction {direction!r}: {op} suite cases run in {', '.join(directions)}")
    chosen = [case for case in data["cases"] if not cases or case.get("name") in cases]
    for case in chosen:
        missing = _REQUIRED[op] - set(case)
        if missing:
            raise InvalidProblemError(f"suite {path}: case {case.get('name')!r} lacks {sorted(missing)}, which a "
                                      f"{op} case needs")
    collector = Collector()
    for case in chosen:
        for d in (direction,) if direction is not None else directions:
            collector.pose(f"{case.get('name')} {d}", lambda case=case, d=d: _POSE[op](case, dtype, d))
    if collector.refused:
        LOG.info("suite %s (%s): the op refused %d combinations, e.g. %s: %s", path, dtype, len(collector.refused),
                 collector.refused[0].what, collector.refused[0].reason)
    return tuple(dict.fromkeys(collector.problems)), tuple(collector.refused)
