"""How much memory a command's random problem needs, checked before anything is allocated.

The run commands draw their operands at the sizes given on the command line; sizes a
typo away from sensible (`gemm 100000 100000 16`) would otherwise end in an allocation
failure deep inside torch, or, with Linux's overcommit, in the kernel's OOM killer, which
no handler can catch. So each command first adds up its tensors' bytes and refuses, as
bad input, a problem that needs more than half the memory available (`FRACTION`): the
other half leaves room for the kernels' and the reference's own work buffers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import InvalidProblemError, UnsupportedError

FRACTION = 0.5  # of the available memory the tensors a command allocates may take
F64 = 8  # bytes of a float64 element: the reference's copies, on the host
F32 = 4  # the float32 draws that make_inputs converts from, on the host
ADDRESSABLE = 2**62  # bytes: torch's tensor sizes are signed 64-bit, strided layouts double some


@dataclass(frozen=True)
class Footprint:
    """Bytes a command allocates: on the device that runs the kernel, and on the host."""

    device: int
    host: int

    @classmethod
    def of(cls, device_elems: list[tuple[int, int]], reference_elems: int, validate: bool) -> "Footprint":
        """`device_elems`: (elements, bytes per element) of each device tensor. The host holds
        the float32 draw of the largest one and, to validate, float64 copies of them all."""
        device = sum(n * size for n, size in device_elems)
        host = F32 * max((n for n, _ in device_elems), default=0)
        if validate:
            host += F64 * (sum(n for n, _ in device_elems) + reference_elems)
        return cls(device, host)


def gemm_footprint(problem, validate: bool) -> Footprint:
    """A, B, C (a strided layout takes about twice its elements), bias and residual."""
    p, t = problem, problem.types

    def factor(layout) -> int:
        return 2 if getattr(layout, "name", "") == "STRIDED" else 1

    out = p.batch * p.m * p.n
    tensors = [(p.batch * p.m * p.k * factor(p.layout.a), t.a.itemsize),
               (p.batch * p.k * p.n * factor(p.layout.b), t.b.itemsize),
               (out * factor(p.layout.c), t.c.itemsize)]
    if p.epilogue.residual:
        tensors.append((out, t.c.itemsize))
    if p.epilogue.bias:
        tensors.append((p.n, t.c.itemsize))
    return Footprint.of(tensors, out, validate)


def attention_footprint(problem, validate: bool, backward: bool) -> Footprint:
    """Q, K, V, O and the log-sum-exp; with the backward, dO, dQ, dK and dV; the reference's
    score matrix (batch x heads x Sq x Skv) in float64."""
    p, item = problem, problem.dtype.itemsize
    q, o = p.batch * p.heads_q * p.seqlen_q * p.head_dim_qk, p.batch * p.heads_q * p.seqlen_q * p.head_dim_v
    k, v = p.batch * p.heads_kv * p.seqlen_kv * p.head_dim_qk, p.batch * p.heads_kv * p.seqlen_kv * p.head_dim_v
    tensors = [(q, item), (k, item), (v, item), (o, item), (p.batch * p.heads_q * p.seqlen_q, F32)]
    if backward:
        tensors += [(o, item), (q, item), (k, item), (v, item)]
    scores = p.batch * p.heads_q * p.seqlen_q * p.seqlen_kv
    return Footprint.of(tensors, scores * (3 if backward else 1), validate)


def conv_footprint(problem, validate: bool) -> Footprint:
    """x, w, y (each of the direction's inputs and its output), bias and residual."""
    p, item = problem, problem.types.dtype.itemsize
    x = p.n * p.c * math.prod(p.input_size)
    w = p.k * p.c_per_group * math.prod(p.filter_size)
    y = p.n * p.k * math.prod(p.output_size)
    tensors = [(x, item), (w, item), (y, item)]
    if p.epilogue.residual:
        tensors.append((y, item))
    if p.epilogue.bias:
        tensors.append((p.k, item))
    return Footprint.of(tensors, max(x, w, y), validate)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _cgroup_room() -> int | None:
    """What this process's cgroup (v2, else v1) still lets it allocate; None where unlimited."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            text = Path(limit).read_text().strip()
            if text == "max":
                return None
            room = int(text) - int(Path(usage).read_text().strip())
            return room if int(text) < 2**60 else None  # v1 writes a huge number for "no limit"
        except (OSError, ValueError):
            continue
    return None


def host_available() -> int | None:
    """Bytes this process can still allocate on the host: MemAvailable within the cgroup's limit."""
    known = [b for b in (_meminfo_available(), _cgroup_room()) if b is not None]
    return max(min(known), 0) if known else None


def device_available() -> int | None:
    import torch

    try:
        return torch.cuda.mem_get_info()[0]
    except (RuntimeError, AssertionError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_addressable(footprint: Footprint) -> None:
    """Refuses tensors no machine could hold: torch computes their sizes in signed 64 bits."""
    if footprint.device >= ADDRESSABLE:
        raise InvalidProblemError(
            f"this problem's tensors would take {footprint.device} bytes, past the 2**62 that torch can "
            "describe; use smaller sizes")


def check_fits(footprint: Footprint, on_gpu: bool) -> None:
    """Refuses a problem whose tensors would take more than FRACTION of the memory available."""
    host = host_available()
    needs = [(footprint.host, host, "host")]
    if on_gpu:
        needs.append((footprint.device, device_available(), "GPU"))
    else:  # the interpreter's "device" is the host
        needs = [(footprint.host + footprint.device, host, "host")]
    for need, available, where in needs:
        if available is not None and need > FRACTION * available:
            raise UnsupportedError(
                f"this problem's tensors need {_gib(need)} of {where} memory, more than half of the "
                f"{_gib(available)} available: use smaller sizes (or leave out --validate, whose float64 "
                "reference copies count too)")
