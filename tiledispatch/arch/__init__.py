"""What tiledispatch knows about each GPU architecture, and which one it runs on.

Kernel selection needs hardware limits (shared memory, SM count, L2, ...) before
any kernel is compiled, and it must behave the same on a machine without a GPU.
So the facts live in one JSON file per architecture under ``data/`` (shipped in
the wheel), ``detect()`` refines them with what a real device reports, and the
``interpreter`` target stands in for a GPU where Triton's interpreter runs the kernels
(CPU tensors: ``core.runtime``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.resources
import json
import os
import re
import types
from collections.abc import Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from ..core.dtypes import DType
from ..core.errors import ArchError, TiledispatchError
from . import calibration as _calibration
from .calibration import Calibration, Provenance

__all__ = ["ArchInfo", "Calibration", "Feature", "Provenance", "available", "current", "detect", "load", "load_file"]

#: Known architectures, oldest first; the interpreter last because it is not a GPU.
_KNOWN = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "interpreter")
INTERPRETER = "interpreter"
#: Environment variable that forces an architecture (any name ``load`` accepts).
ENV_ARCH = "TILEDISPATCH_ARCH"


class Feature(enum.Enum):
    """A hardware capability that decides which kernel variants can run."""

    ASYNC_COPY = "async_copy"  # cp.async, sm_80+
    TMA = "tma"  # Tensor Memory Accelerator, sm_90+
    WGMMA = "wgmma"  # warpgroup MMA, sm_90 only
    TCGEN05 = "tcgen05"  # 5th-gen tensor cores / tensor memory, sm_100
    CLUSTER = "cluster"  # thread-block clusters, sm_90+
    FP8 = "fp8"  # fp8 tensor cores, sm_89+


@dataclasses.dataclass(frozen=True)
class ArchInfo:
    """The facts about one architecture that kernel selection reads. Immutable and hashable."""

    name: str
    compute_capability: tuple[int, int] | None
    description: str
    sm_count: int
    shared_memory_per_block_optin: int
    shared_memory_per_sm: int
    registers_per_sm: int
    registers_per_thread_max: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    warp_size: int
    l2_bytes: int
    tensor_core_dtypes: frozenset[DType]
    features: frozenset[Feature]
    #: Dense TFLOP/s of the representative part per tensor-core dtype (fp32 means tf32).
    peak_tflops: Mapping[DType, float] = dataclasses.field(hash=False)
    memory_bandwidth_gbs: float
    #: Measured facts the time models read (launch cost, bytes in flight, port rates, clock), with provenance.
    calibration: Calibration

    def __post_init__(self) -> None:
        # Normalise so that callers (and dataclasses.replace) may pass lists and dicts
        # without making the shared, cached instance mutable.
        cc = self.compute_capability
        object.__setattr__(self, "compute_capability", None if cc is None else tuple(cc))
        object.__setattr__(self, "tensor_core_dtypes", frozenset(self.tensor_core_dtypes))
        object.__setattr__(self, "features", frozenset(self.features))
        object.__setattr__(self, "peak_tflops", types.MappingProxyType(dict(self.peak_tflops)))

    def __reduce__(self):
        # A mappingproxy cannot be pickled; rebuild from the JSON shape (for worker processes).
        return (_from_dict, (self.to_dict(), f"<pickled {self.name}>"))

    @property
    def is_interpreter(self) -> bool:
        return self.compute_capability is None

    @property
    def sm(self) -> int | None:
        """The compute capability as one number (90 for 9.0), None for the interpreter."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return major * 10 + minor

    @property
    def tag(self) -> str:
        """Short suffix for kernel names: ``sm90``, or ``interp`` for the interpreter."""
        return "interp" if self.sm is None else f"sm{self.sm}"

    def has(self, feature: Feature | str) -> bool:
        return _parse_feature(feature) in self.features

    def supports_dtype(self, dtype: DType | str) -> bool:
        """Whether ``tl.dot`` on this dtype runs on tensor cores here."""
        return DType.parse(dtype) in self.tensor_core_dtypes

    def triton_target(self):
        """The ``GPUTarget`` to compile for this architecture without a device present."""
        if self.sm is None:
            raise ArchError(
                "the interpreter has no compile target: its kernels run under Triton's interpreter; "
                f"pick a GPU architecture ({', '.join(_KNOWN[:-1])}) to compile ahead of time"
            )
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.sm, self.warp_size)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of the data files, so that it can be saved and loaded back."""
        return {
            "name": self.name,
            "compute_capability": None if self.compute_capability is None else list(self.compute_capability),
            "description": self.description,
            "sm_count": self.sm_count,
            "shared_memory_per_block_optin": self.shared_memory_per_block_optin,
            "shared_memory_per_sm": self.shared_memory_per_sm,
            "registers_per_sm": self.registers_per_sm,
            "registers_per_thread_max": self.registers_per_thread_max,
            "max_threads_per_sm": self.max_threads_per_sm,
            "max_blocks_per_sm": self.max_blocks_per_sm,
            "warp_size": self.warp_size,
            "l2_bytes": self.l2_bytes,
            "tensor_core_dtypes": [d.value for d in DType if d in self.tensor_core_dtypes],
            "features": [f.value for f in Feature if f in self.features],
            "peak_tflops": {d.value: self.peak_tflops[d] for d in DType if d in self.peak_tflops},
            "memory_bandwidth_gbs": self.memory_bandwidth_gbs,
            "calibration": self.calibration.to_dict(),
        }


_INT_FIELDS = (
    "sm_count",
    "shared_memory_per_block_optin",
    "shared_memory_per_sm",
    "registers_per_sm",
    "registers_per_thread_max",
    "max_threads_per_sm",
    "max_blocks_per_sm",
    "warp_size",
    "l2_bytes",
)
_FIELDS = tuple(f.name for f in dataclasses.fields(ArchInfo))


def _parse_feature(value: Feature | str) -> Feature:
    if isinstance(value, Feature):
        return value
    try:
        return Feature(str(value).strip().lower())
    except ValueError:
        names = ", ".join(f.value for f in Feature)
        raise ArchError(f"unknown feature {value!r}; use one of: {names}") from None


def _from_dict(data: Any, source: str) -> ArchInfo:
    """Validate one architecture record; every error names ``source`` and the field."""

    def bad(field: str, why: str) -> ArchError:
        return ArchError(f"{source}: field {field!r} {why}")

    if not isinstance(data, dict):
        raise ArchError(f"{source}: expected a JSON object, got {type(data).__name__}")
    missing = [f for f in _FIELDS if f not in data]
    if missing:
        raise ArchError(f"{source}: missing field(s) {', '.join(map(repr, missing))}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:  # a typo would otherwise be silently ignored
        raise ArchError(f"{source}: unknown field(s) {', '.join(map(repr, unknown))}")

    def number(field: str, value: Any, kind: type) -> Any:
        ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
        if not ok or value <= 0:
            raise bad(field, f"must be a positive {kind.__name__}, got {value!r}")
        return kind(value)

    for field in ("name", "description"):
        if not isinstance(data[field], str) or not data[field]:
            raise bad(field, f"must be a non-empty string, got {data[field]!r}")
    cc = data["compute_capability"]
    def is_uint(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    if cc is not None and not (isinstance(cc, list) and len(cc) == 2 and all(map(is_uint, cc))):
        raise bad("compute_capability", f"must be [major, minor] or null, got {cc!r}")
    if (cc is None) != (data["name"] == INTERPRETER):
        raise bad("compute_capability", f"must be null exactly for {INTERPRETER!r}, got {cc!r}")

    def enum_list(field: str, parse) -> frozenset:
        values = data[field]
        if not isinstance(values, list):
            raise bad(field, f"must be a list, got {values!r}")
        try:
            return frozenset(parse(v) for v in values)
        except TiledispatchError as e:
            raise bad(field, f"is invalid: {e}") from None

    dtypes = enum_list("tensor_core_dtypes", DType.parse)
    features = enum_list("features", _parse_feature)

    peak = data["peak_tflops"]
    if not isinstance(peak, dict):
        raise bad("peak_tflops", f"must be an object dtype -> TFLOP/s, got {peak!r}")
    try:
        keys = [DType.parse(k) for k in peak]
    except TiledispatchError as e:
        raise bad("peak_tflops", f"is invalid: {e}") from None
    peak = {k: number("peak_tflops", v, float) for k, v in zip(keys, peak.values())}
    if set(peak) != dtypes:  # ranking needs a peak for exactly the dtypes that can run
        want, got = sorted(d.value for d in dtypes), sorted(d.value for d in peak)
        raise bad("peak_tflops", f"must have one entry per tensor-core dtype {want}, got {got}")

    return ArchInfo(
        name=data["name"],
        compute_capability=None if cc is None else tuple(cc),
        description=data["description"],
        **{f: number(f, data[f], int) for f in _INT_FIELDS},
        tensor_core_dtypes=dtypes,
        features=features,
        peak_tflops=peak,
        memory_bandwidth_gbs=number("memory_bandwidth_gbs", data["memory_bandwidth_gbs"], float),
        calibration=_calibration.from_dict(data["calibration"], source),
    )


def load_file(path: str | os.PathLike | Traversable) -> ArchInfo:
    """Read and validate one architecture JSON file (any path; ``load`` uses the shipped ones)."""
    try:
        file = path if isinstance(path, Traversable) else Path(path)
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ArchError(f"{path}: cannot read architecture file: {e}") from None
    return _from_dict(data, str(path))


def _canonical(name: str) -> str:
    """``sm_90``, ``sm90``, ``SM_90``, ``90``, ``9.0`` -> ``sm_90``; ``interp`` -> ``interpreter``."""
    key = str(name).strip().lower()
    if key in (INTERPRETER, "interp"):
        return INTERPRETER
    m = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d))?", key)
    if m:
        number = int(m[1]) * 10 + int(m[2]) if m[2] is not None else int(m[1])
        if f"sm_{number}" in _KNOWN:
            return f"sm_{number}"
    raise ArchError(f"unknown architecture {name!r}; known: {', '.join(_KNOWN)}")


@functools.lru_cache(maxsize=None)
def _load_known(name: str) -> ArchInfo:
    info = load_file(importlib.resources.files(__name__) / "data" / f"{name}.json")
    if info.name != name:
        raise ArchError(f"data/{name}.json: field 'name' is {info.name!r}, expected {name!r}")
    return info


def load(name: str | ArchInfo) -> ArchInfo:
    """The shipped facts for an architecture, by any accepted spelling (cached)."""
    if isinstance(name, ArchInfo):
        return name
    return _load_known(_canonical(name))


def available() -> list[str]:
    """Canonical names of the known architectures, oldest GPU first, interpreter last."""
    return list(_KNOWN)


def detect(device=None) -> ArchInfo:
    """The architecture of a CUDA device, with the limits the device itself reports.

    The JSON describes one representative part; the real one may differ (H200 vs
    H100 L2, a cut-down SKU's SM count), so reported values win where available.
    A capability without its own file maps to the nearest known one of the same
    major with a lower minor (8.7 -> sm_86, 10.3 -> sm_100, 12.1 -> sm_120).
    """
    import torch

    if not torch.cuda.is_available():
        raise ArchError("no CUDA device is available; use load('interpreter'), or TILEDISPATCH_ARCH to name a GPU")
    major, minor = torch.cuda.get_device_capability(device)
    candidates = [
        info
        for info in map(load, _KNOWN[:-1])
        if info.compute_capability[0] == major and info.compute_capability[1] <= minor
    ]
    if not candidates:
        raise ArchError(
            f"compute capability {major}.{minor} is not supported; known: {', '.join(_KNOWN[:-1])}"
        )
    info = max(candidates, key=lambda a: a.compute_capability)
    props = torch.cuda.get_device_properties(device)

    def reported(attr: str, default: int) -> int:
        value = getattr(props, attr, None)
        return value if isinstance(value, int) and value > 0 else default

    device_name = getattr(props, "name", None)
    smem_optin = reported("shared_memory_per_block_optin", info.shared_memory_per_block_optin)
    return dataclasses.replace(
        info,
        description=f"{info.description}: {device_name}" if device_name else info.description,
        sm_count=reported("multi_processor_count", info.sm_count),
        shared_memory_per_block_optin=smem_optin,
        shared_memory_per_sm=reported("shared_memory_per_multiprocessor", info.shared_memory_per_sm),
        registers_per_sm=reported("regs_per_multiprocessor", info.registers_per_sm),
        max_threads_per_sm=reported("max_threads_per_multi_processor", info.max_threads_per_sm),
        l2_bytes=reported("L2_cache_size", info.l2_bytes),
    )


def current() -> ArchInfo:
    """The architecture to select kernels for now.

    ``TILEDISPATCH_ARCH`` wins (e.g. to build for a GPU from a CPU machine); then a
    forced interpreter (``TILEDISPATCH_BACKEND=interpreter`` or ``TRITON_INTERPRET=1``:
    ``core.runtime.forced_backend``) means the interpreter even if a GPU is present, since
    kernels will not run on it; otherwise the local GPU, or the interpreter if none.
    Read afresh each call because the environment may change; ``load`` is cached.
    """
    from ..core.runtime import Backend, forced_backend

    forced = os.environ.get(ENV_ARCH, "").strip()
    if forced:
        return load(forced)
    if forced_backend() is Backend.INTERPRETER:
        return load(INTERPRETER)
    import torch

    if torch.cuda.is_available():
        return detect()
    return load(INTERPRETER)
