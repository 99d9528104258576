"""What the ops' fast paths share to replay a bound plan on a call's own tensors: a tensor's part of
the call signature, a planned tensor descriptor moved onto a new base, and the plan's scratch made anew."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from triton.tools.tensor_descriptor import TensorDescriptor


def tensor_meta(t) -> tuple:
    """What the checks looked at: shape, strides, dtype, device index, 16-byte alignment."""
    return (t.shape, t.stride(), t.dtype, t.get_device(), not t.data_ptr() & 15)


def rebase(descriptor: TensorDescriptor, tensor: torch.Tensor) -> TensorDescriptor:
    """The planned descriptor over `tensor`: its shape, strides and block passed their checks at
    planning, for this signature."""
    moved = copy.copy(descriptor)
    moved.base = tensor
    return moved


@dataclass(frozen=True)
class Workspace:
    """Argument `index` takes a fresh tensor made by the plan (split-K's partial sums, realigned or
    padded operands), or a descriptor over it. `key` numbers the plan's own tensors: the stages that
    shared one at planning (a copy and the kernel that reads it) share one per call."""

    index: int
    key: int
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    descriptor: TensorDescriptor | None = None
    zeroed: bool = False  # made as zeros (the plan's `zeroed`: stream-K's flags, atomic splits)

    def make(self, device) -> torch.Tensor:
        tensor = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)
        return tensor.zero_() if self.zeroed else tensor

    def value(self, tensor: torch.Tensor):
        return tensor if self.descriptor is None else rebase(self.descriptor, tensor)

    def fill(self, args: list, made: dict, device) -> None:
        """Puts this call's tensor into argument `index`: made on first use in the call, then shared through
        `made` (key -> tensor) with the later stages that read the same one."""
        tensor = made.get(self.key)
        if tensor is None:
            tensor = made[self.key] = self.make(device)
        args[self.index] = self.value(tensor)
