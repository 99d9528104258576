"""Facts about caller's tensors that every op's operand checks need: self-overlap and aliasing."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .errors import InvalidProblemError


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


def check_no_alias(out: torch.Tensor, reads: Mapping[str, torch.Tensor | None]) -> None:
    """`out` must not share memory with any tensor in `reads` (by role name); None entries are skipped."""
    for name, t in reads.items():
        if t is not None and shares_storage(t, out):
            raise InvalidProblemError(f"out shares memory with {name}; pass a separate output tensor")
