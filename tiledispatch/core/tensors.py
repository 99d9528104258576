"""Facts about caller's tensors that every op's operand checks need: views, self-overlap, aliasing.

Aliasing is decided on memory, not on storage objects: two tensors alias when some byte
one of them addresses is addressed by the other. Tensors from distinct storages can
share a buffer (two `torch.from_numpy` views of one array), and disjoint slices of one
storage do not alias, so the storage is the wrong question. Where the two byte ranges
meet, the elements themselves are compared (views that interleave, like the even and the
odd columns of one matrix, share a range but no element).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .errors import InvalidProblemError

# Past this many elements in the smaller tensor of an interleaved pair, the element
# comparison (int64 offsets, sorted) would cost more memory than it is worth: the pair
# is then refused as if it overlapped, with a message that says so.
EXACT_CHECK_ELEMENTS = 1 << 22


def overlaps_itself(t: torch.Tensor) -> bool:
    """True if two indices of `t` address one element (dims of size 1 never do)."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            return True
        span = stride * size
    return False


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` are views of one allocation."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) bytes addressed by `t`; empty for a tensor without elements."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    size = t.element_size()
    low = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1 and s < 0) * size
    high = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1 and s > 0) * size
    return start + low, start + high + size


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """The byte address of each element of `t` (int64, on the CPU), sorted."""
    index = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        index = index.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * (s * t.element_size())
    return (index.reshape(-1) + t.data_ptr()).sort().values


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether `a` and `b` address a common byte: True, False, or None when the byte ranges
    meet but the tensors are too large to compare element by element."""
    if a.device != b.device or a.device.type == "meta":
        return False
    (a0, a1), (b0, b1) = byte_range(a), byte_range(b)
    if a0 >= b1 or b0 >= a1 or a0 == a1 or b0 == b1:
        return False
    if min(a.numel(), b.numel()) > EXACT_CHECK_ELEMENTS:
        return None
    small, large = (a, b) if a.numel() <= b.numel() else (b, a)
    starts, others = _element_offsets(small), _element_offsets(large)
    # An element of `small` at s meets one of `large` at o iff o < s + size_small and
    # s < o + size_large: the largest o below s + size_small decides.
    at = torch.searchsorted(others, starts + small.element_size()) - 1
    valid = at >= 0
    nearest = others[at.clamp(min=0)]
    return bool((valid & (nearest > starts - large.element_size())).any())


def same_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `b` is `a` element for element: same start, shape, strides and element size
    (dims of size 1 have no stride that matters)."""
    if a.data_ptr() != b.data_ptr() or a.shape != b.shape or a.element_size() != b.element_size():
        return False
    return all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def check_no_alias(out: torch.Tensor, reads: Mapping[str, torch.Tensor | None],
                   in_place_ok: Mapping[str, torch.Tensor | None] | None = None) -> None:
    """`out` must not address memory that a tensor of `reads` (by role name) addresses. Tensors of
    `in_place_ok` may be `out` itself, element for element (each element read, then written, by one
    program: a residual added in place), but no other overlap. None entries are skipped."""
    for names, exact_ok in ((reads, False), (in_place_ok or {}, True)):
        for name, t in names.items():
            if t is None or (exact_ok and same_elements(out, t)):
                continue
            found = overlaps(out, t)
            if found is None:
                raise InvalidProblemError(
                    f"out and {name} interleave over {t.numel()}+ elements, too many to prove they share no "
                    "element; pass a separate output tensor")
            if found:
                hint = " or exactly out itself (in place)" if exact_ok else ""
                raise InvalidProblemError(
                    f"out overlaps {name} in memory; pass a separate output tensor, or give {name} memory of "
                    f"its own{hint}")


def check_plain(t: torch.Tensor | None, name: str, *, written: bool = False) -> torch.Tensor | None:
    """A tensor whose memory holds its values. A negated or conjugated view (`x.conj().imag`,
    `torch._neg_view`) holds them with a flag that kernels reading raw memory would lose: an input is
    resolved (copied), an output refused."""
    if t is None or not (t.is_neg() or t.is_conj()):
        return t
    if written:
        raise InvalidProblemError(
            f"{name} is a {'negated' if t.is_neg() else 'conjugated'} view, whose memory does not hold its values; "
            f"pass a plain tensor (e.g. {name}.resolve_neg().resolve_conj() as a new buffer)")
    return t.resolve_neg().resolve_conj()
