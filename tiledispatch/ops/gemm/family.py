"""The GEMM op's kernel families: what each one tells the op, and the table that finds it.

A GEMM config names its family (`config.family`, a `Family` member; the vendor's is "vendor"),
and the op's shared code (rules, ranking, plan, rule sets) asks `FAMILIES.of(config)` for it.
Each family module in ``families/`` registers one `GemmFamily`: the core protocol
(`core.family.KernelFamily`) plus what GEMM's shared model reads of a family besides a score:

- `device_score`: the modelled device time's score (what a CUDA graph replay runs); the op's
  `rule_score` (the protocol's `score`) weighs it against `host_launches`: how many launches
  (or PyTorch ops) a call bound to the config makes, each costing the arch's host launch time,
  beyond `call_overhead_s` (a library's own call, where there is one);
- `shared_memory_bytes`, `accumulator_registers`: what a program of the config holds (None for
  the vendor, which holds no tile of ours);
- `fits`: whether the rule sets bind a tile of the family to a config's signature at all
  (types, layout, epilogue: what holds on every arch);
- `name_options`: the family's own part of a config's name;
- `uses_tma`, `warp_specialised`: facts of its kernels that `Family` reports;
- `tile_kernel`: the terms (`ranking.TileKernel`) of a family whose `device_score` is the tile
  model's (`ranking.tile_score`): a ranking scores its configs together, as columns
  (`score_batch`), rather than one call each. None for a model of its own (gemv, the vendor's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.family import FamilyTable, KernelFamily

FAMILIES = FamilyTable("gemm", key=lambda config: config.family.value)


def _everywhere(config: Any) -> bool:
    return True


def _no_options(config: Any) -> str:
    return ""


@dataclass(frozen=True)
class GemmFamily(KernelFamily):
    """A GEMM kernel family (see the module's docstring for the fields beyond the protocol)."""

    device_score: Callable[..., Any] = field(kw_only=True)  # (config, problem, arch) -> Score
    host_launches: Callable[[Any, Any], int] = field(kw_only=True)  # (config, problem) -> launches
    call_overhead_s: float = field(kw_only=True, default=0.0)
    shared_memory_bytes: Callable[[Any], int] | None = field(kw_only=True, default=None)
    accumulator_registers: Callable[[Any], int] | None = field(kw_only=True, default=None)
    fits: Callable[[Any], bool] = field(kw_only=True, default=_everywhere)
    name_options: Callable[[Any], str] = field(kw_only=True, default=_no_options)
    uses_tma: bool = field(kw_only=True, default=False)
    warp_specialised: bool = field(kw_only=True, default=False)
    tile_kernel: Any = field(kw_only=True, default=None)


def register(family: GemmFamily) -> GemmFamily:
    return FAMILIES.register(family)


def named(name: str) -> GemmFamily:
    """The registered family called `name` (a `Family` value)."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise KeyError(f"no gemm kernel family {name!r} is registered (registered: {', '.join(FAMILIES.names())})")
