"""Measured machine facts that the `rules` rankings read, each with where it comes from.

The datasheet limits of an architecture (SM count, shared memory, peak FLOP/s) say what a
kernel may use; the time models also need figures that only a timing shows: what one more
kernel launch costs, how many bytes an SM must have in flight to keep DRAM busy, how fast one
SM's port to L2 takes operand bytes. They belong to the machine, not to an op, so every op
reads one figure for one machine (``arch.calibration.launch_s``), and each figure carries its
`Provenance`: the card it was measured on, the date, and the command (or the derivation) that
gives it. A figure carried to an architecture where nobody measured it says so in its
provenance, so the gaps stay visible.

A figure that depends on the kernel as well as the machine (how often a tile order finds its
operands in L2, a fitted port rate that absorbs a family's own fractions) is a kernel term and
stays with the op that fitted it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from ..core.errors import ArchError

__all__ = ["Calibration", "Provenance"]

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a figure comes from: the card, the date (ISO, UTC) and the command or derivation."""

    card: str
    date: str
    command: str


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The measured facts of one architecture, in the units their names say. Immutable and hashable."""

    #: Device time one more kernel launch adds to a call (a split-K reduction, a copy, a step).
    launch_s: float
    #: Host time of one bound Triton launch: a call of launch-bound kernels cannot return sooner.
    host_launch_s: float
    #: Host time a call of one of our custom ops costs inside a torch.compile'd graph over the aten
    #: call inductor makes for PyTorch's own op: a kept pick must save more device time than this.
    compiled_call_host_s: float
    #: Host time an eager call bound to one of our Triton kernels costs over the vendor's call through
    #: PyTorch (our replay and launch, or our autograd node, against PyTorch's C++ ones): where the
    #: host is exposed, a pick must save more device time than this (`core.hostcost`).
    eager_call_host_s: float
    #: Host time an eager call that autograd records costs through our op's autograd twin (its
    #: forward and backward in Python) over PyTorch's own op, whose autograd is C++: where the
    #: host is exposed, the picks of the forward and both gradients together must save more device
    #: time than this, else PyTorch's op runs the call (`core.hostcost.native_for_recorded`).
    recorded_call_host_s: float
    #: Bytes one SM's programs must have requested at once to draw its share of DRAM bandwidth.
    bytes_in_flight_per_sm: int
    #: Operand bytes a second one SM takes through its L2 port with pointer loads (re-reads included).
    sm_port_bytes_per_s: float
    #: The same with TMA copies, which draw more through one SM.
    tma_port_bytes_per_s: float
    #: SM clock under sustained load, for issue-bound models (instructions a cycle).
    clock_hz: float
    #: Warp-instructions an SM issues a cycle (its warp schedulers).
    issue_per_sm_cycle: int
    #: CUDA-core fp32 FMA FLOP/s as a share of the dense tf32 tensor-core peak (`peak_tflops[fp32]`).
    fma_share_of_tf32: float
    #: One (fact, provenance) pair per fact above, in field order.
    sources: tuple[tuple[str, Provenance], ...]

    def provenance(self, fact: str) -> Provenance:
        """Where `fact` (a field name above) comes from."""
        for name, source in self.sources:
            if name == fact:
                return source
        raise ArchError(f"unknown calibration fact {fact!r}; known: {', '.join(FACTS)}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: each fact an object of its value and its provenance."""
        return {name: {"value": getattr(self, name), **dataclasses.asdict(source)} for name, source in self.sources}


#: The facts and the type of their values, in field order.
FACTS: dict[str, type] = {
    f.name: (int if f.type in ("int", int) else float) for f in dataclasses.fields(Calibration) if f.name != "sources"
}
_PROVENANCE = tuple(f.name for f in dataclasses.fields(Provenance))


def from_dict(data: Any, source: str) -> Calibration:
    """Validate the ``calibration`` object of an architecture record; errors name ``source`` and the fact."""

    def bad(field: str, why: str) -> ArchError:
        return ArchError(f"{source}: field 'calibration.{field}' {why}")

    if not isinstance(data, dict):
        raise ArchError(f"{source}: field 'calibration' must be an object fact -> {{value, card, date, command}}, "
                        f"got {data!r}")
    missing = [f for f in FACTS if f not in data]
    if missing:
        raise ArchError(f"{source}: field 'calibration' is missing fact(s) {', '.join(map(repr, missing))}")
    unknown = sorted(set(data) - set(FACTS))
    if unknown:
        raise ArchError(f"{source}: field 'calibration' has unknown fact(s) {', '.join(map(repr, unknown))}")
    values, sources = {}, []
    for name, kind in FACTS.items():
        entry = data[name]
        want = ("value", *_PROVENANCE)
        if not isinstance(entry, dict) or set(entry) != set(want):
            raise bad(name, f"must be an object with exactly {', '.join(want)}, got {entry!r}")
        value = entry["value"]
        ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
        if not ok or not (value > 0 and math.isfinite(value)):
            raise bad(name, f"value must be a positive finite {kind.__name__}, got {value!r}")
        for key in _PROVENANCE:
            if not isinstance(entry[key], str) or not entry[key].strip():
                raise bad(name, f"{key} must be a non-empty string, got {entry[key]!r}")
        if not _DATE.fullmatch(entry["date"]):
            raise bad(name, f"date must be YYYY-MM-DD, got {entry['date']!r}")
        values[name] = kind(value)
        sources.append((name, Provenance(**{key: entry[key] for key in _PROVENANCE})))
    return Calibration(**values, sources=tuple(sources))
