"""Tensors for the fuzz cases: random values in random memory layouts.

A layout is drawn once per tensor: the order of its dims in memory, one dim read with a
step of 2, a base one element past the allocation's start (off every 16-byte boundary),
dims of size 1 broadcast by `expand` (stride 0), and a negated or conjugated view whose
memory does not hold its values. Inputs may take any of these; outputs take the ones a
kernel can write (no stride 0, no negated view).
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass

import numpy as np
import torch

from tiledispatch.core.tensors import overlaps_itself


class Wrap(enum.Enum):
    NONE = "plain"
    NEG = "neg_view"  # torch._neg_view: the values are minus the memory's
    CONJ_IMAG = "conj_imag"  # complex.conj().imag: a negated view with doubled strides


@dataclass(frozen=True)
class Layout:
    perm: tuple[int, ...]  # dims from outermost to innermost in memory
    step_dim: int | None = None  # read every other element along this dim
    offset: int = 0  # elements between the allocation's start and the tensor's base
    expand: frozenset = frozenset()  # dims stored once and broadcast (stride 0)
    wrap: Wrap = Wrap.NONE

    def describe(self) -> str:
        parts = [f"perm{''.join(map(str, self.perm))}"]
        if self.step_dim is not None:
            parts.append(f"step{self.step_dim}")
        if self.offset:
            parts.append(f"off{self.offset}")
        if self.expand:
            parts.append(f"expand{''.join(map(str, sorted(self.expand)))}")
        if self.wrap is not Wrap.NONE:
            parts.append(self.wrap.value)
        return "-".join(parts)


def contiguous(rank: int) -> Layout:
    return Layout(tuple(range(rank)))


def random_layout(rng: random.Random, rank: int, *, inner_fixed: bool = False, written: bool = False,
                  preferred: tuple[int, ...] | None = None) -> Layout:
    """A layout for a tensor of `rank` dims. `inner_fixed` keeps the last dim innermost and dense
    (attention's head dim); `written` leaves out what an output cannot be; `preferred` is the order
    the op reads fastest (channels-last), taken half the time."""
    dims = list(range(rank))
    if preferred is not None and rng.random() < 0.5:
        perm = preferred
    elif rng.random() < 0.5:
        perm = tuple(dims)
    else:
        outer = dims[:-1] if inner_fixed else dims
        rng.shuffle(outer)
        perm = tuple(outer + ([rank - 1] if inner_fixed else []))
    steppable = [d for d in dims if not (inner_fixed and d == rank - 1)]
    step_dim = rng.choice(steppable) if steppable and rng.random() < 0.25 else None
    offset = 1 if rng.random() < 0.2 else 0
    expand = frozenset()
    wrap = Wrap.NONE
    if not written:
        if rng.random() < 0.15:
            expand = frozenset({rng.choice(steppable or dims)}) - {step_dim}
        roll = rng.random()
        wrap = Wrap.NEG if roll < 0.12 else Wrap.CONJ_IMAG if roll < 0.18 else Wrap.NONE
    return Layout(perm, step_dim, offset, expand, wrap)


def make(gen: torch.Generator, shape, dtype: torch.dtype, device, layout: Layout | None = None, *,
         fill: float | None = None, scale: float = 1.0) -> torch.Tensor:
    """A tensor of logical `shape` laid out as `layout`, random normal values (or `fill`)."""
    shape = tuple(int(n) for n in shape)
    layout = layout or contiguous(len(shape))
    if layout.wrap is Wrap.CONJ_IMAG and dtype == torch.float32:
        parts = torch.randn((2, *shape), generator=gen) * scale
        return torch.complex(parts[0], parts[1]).to(device).conj().imag
    alloc = [1 if i in layout.expand else (2 * n if i == layout.step_dim else n) for i, n in enumerate(shape)]
    stored = [alloc[p] for p in layout.perm]
    count = math.prod(stored)
    if fill is None:
        flat = torch.randn(count + layout.offset, generator=gen) * scale
    else:
        flat = torch.full((count + layout.offset,), fill)
    base = flat.to(device=device, dtype=dtype)[layout.offset:].view(stored)
    t = base.permute([layout.perm.index(i) for i in range(len(shape))])
    if layout.step_dim is not None:
        t = t[(slice(None),) * layout.step_dim + (slice(None, None, 2),)]
    t = t.expand(shape)
    if layout.wrap is not Wrap.NONE:
        t = torch._neg_view(t)
    return t


def ramp(shape, dtype, device) -> torch.Tensor:
    """Deterministic small values; for tensors whose content does not matter (refused calls)."""
    n = math.prod(shape)
    return (torch.arange(n, dtype=torch.float32) % 7 / 7).reshape(shape).to(device=device, dtype=dtype)


def f64(t):
    """The values of `t` in float64 on the CPU (negated and conjugated views resolved)."""
    return None if t is None else t.detach().resolve_neg().resolve_conj().to("cpu", torch.float64)


def snapshot(t: torch.Tensor) -> torch.Tensor:
    return t.detach().resolve_neg().resolve_conj().to("cpu").clone()


def unchanged(before: torch.Tensor, t: torch.Tensor) -> bool:
    return torch.equal(before.isnan(), snapshot(t).isnan()) and bool(
        (before.nan_to_num() == snapshot(t).nan_to_num()).all())


# -- two tensors over one buffer --------------------------------------------------------------
def _separate_storage(t: torch.Tensor) -> torch.Tensor:
    """A tensor over `t`'s memory with a storage object of its own (as two `torch.from_numpy`
    views of one array have): NumPy on the CPU, DLPack elsewhere."""
    if t.device.type == "cpu" and t.dtype in (torch.float16, torch.float32, torch.float64):
        return torch.from_numpy(t.numpy())
    return torch.utils.dlpack.from_dlpack(t)


def buffer_views(shape_a, shape_b, dtype, device, gen, *, shift: int, separate: bool):
    """Two contiguous tensors cut from one flat buffer: `a` at its start and `b` starting `shift`
    elements later (overlapping a when shift < numel(a)). With `separate`, each has a storage
    object of its own over the shared memory, so only an address comparison sees the overlap."""
    na, nb = math.prod(shape_a), math.prod(shape_b)
    flat = torch.randn(max(na, shift + nb), generator=gen).to(device=device, dtype=dtype)
    a, b = flat[:na].view(shape_a), flat[shift:shift + nb].view(shape_b)
    if separate:
        a, b = _separate_storage(a), _separate_storage(b)
    return a, b


def with_huge_stride(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t`'s values with a stride of 2**40 on `dim`, a dim of size 1 (whose stride never moves a
    pointer, so the tensor is legal and small): a stride that does not fit 32 bits."""
    assert t.shape[dim] == 1
    dense = t.detach().resolve_neg().resolve_conj().contiguous()
    strides = list(dense.stride())
    strides[dim] = 2**40
    return dense.as_strided(dense.shape, strides, dense.storage_offset())


def _span(t: torch.Tensor) -> int:
    """Elements between the first and the last one `t` addresses (strides are never negative)."""
    return sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1)


def twin(value):
    """A tensor like `value` in a storage of its own: same shape, strides, dtype and 16-byte phase of
    its address, plain (not a negated view), random values. Other values are returned as they are.

    A call on twins has the signature of the call on the originals, so on a GPU it binds the plan
    that the original call then finds in the fast path's memo, with its aliasing or views unseen
    by the signature."""
    if not isinstance(value, torch.Tensor) or value.device.type == "meta" or value.dtype.is_complex:
        return value
    span = _span(value) + 1 if value.numel() else 0
    offset = value.storage_offset() % 16
    if value.is_floating_point():
        flat = torch.randn(offset + span).to(device=value.device, dtype=value.dtype)
        return flat.as_strided(value.shape, value.stride(), offset)
    flat = torch.zeros(offset + span, dtype=value.dtype, device=value.device)
    copy = flat.as_strided(value.shape, value.stride(), offset)
    if not overlaps_itself(copy):
        copy.copy_(value)  # integer tensors (sequence offsets, sizes) keep their values
    return copy


def needs_warmup(values) -> bool:
    """Whether a call holds a negated or conjugated view, or two tensors over shared memory: what a
    replayed plan would have to notice."""
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.device.type != "meta"]
    if any(t.is_neg() or t.is_conj() for t in tensors):
        return True
    return any(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() or _meet(a, b)
               for i, a in enumerate(tensors) for b in tensors[i + 1:])


def _meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    ends = [(t.data_ptr(), t.data_ptr() + t.element_size() * (1 + _span(t))) for t in (a, b)]
    return ends[0][0] < ends[1][1] and ends[1][0] < ends[0][1]


def np_int(value):
    """A NumPy integer standing for a Python int (tuples element by element)."""
    if isinstance(value, (tuple, list)):
        return tuple(np.int64(v) for v in value)
    return np.int64(value)
