"""The fast path of `gemm()` on a GPU: a call signature seen before skips all checks.

The first call with a given signature (shapes, strides, dtypes, device, 16-byte
alignment of each pointer, epilogue) runs every check, selects the kernel, loads its
launchers and lays out the launch arguments once. Every later call with the same
signature only swaps the new tensors into their slots and launches: everything the
checks looked at is part of the signature, except aliasing, which is re-checked.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ...core.kernel import PythonLauncher
from ...core.launch import Plan
from .operands import GemmOperands, check_no_alias

ROLES = ("a", "b", "bias", "residual", "out", "scale_a", "scale_b")


def _meta(t) -> tuple | None:
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def call_key(a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b, kernel) -> tuple | None:
    """The signature of a call, or None where only the checked path can handle it."""
    tensors = (a, b, bias, residual, out, scale_a, scale_b)
    if not all(t is None or type(t) is torch.Tensor for t in tensors) or a is None or b is None:
        return None
    if a.device.type != "cuda":
        return None  # the interpreter reads whole tensors, not just their pointers
    if kernel is not None and not isinstance(kernel, str):
        return None
    return (_meta(a), _meta(b), _meta(bias), activation, _meta(residual), _meta(out), out_dtype,
            allow_tf32, _meta(scale_a), _meta(scale_b), kernel)


@dataclass(frozen=True)
class _Slot:
    """Where a per-call tensor goes: launch `launch`, argument `index`.

    A Triton launch reads only the pointer, so the caller's tensor goes in as it is; a
    Python stage (the vendor path) reads shapes, so it gets the batched view it was planned with.
    A TMA descriptor keeps its planned shape, strides and block, and takes the new base.
    """

    launch: int
    index: int
    role: str
    batched_view: bool = False
    descriptor: TensorDescriptor | None = None

    def value(self, tensor: torch.Tensor):
        if self.descriptor is not None:
            descriptor = copy.copy(self.descriptor)  # its checks passed at planning, for this signature
            descriptor.base = tensor
            return descriptor
        if self.batched_view and tensor.dim() == 2:
            return tensor.unsqueeze(0)
        return tensor


class BoundGemm:
    """A checked, selected and planned call, replayable on new tensors of the same signature."""

    def __init__(self, operands: GemmOperands, plan: Plan, launchers: dict, result_2d: bool) -> None:
        p = operands.problem
        by_id = {id(getattr(operands, role)): role for role in ROLES if getattr(operands, role) is not None}
        by_id[id(plan.output)] = "out"
        self._slots: list[_Slot] = []
        self._workspaces: list[tuple[_Slot, tuple, torch.dtype]] = []
        self._args = []
        for i, launch in enumerate(plan.launches):
            python = isinstance(launchers[launch.stage], PythonLauncher)
            for j, value in enumerate(launch.args):
                if isinstance(value, TensorDescriptor):
                    self._slots.append(_Slot(i, j, by_id[id(value.base)], descriptor=value))
                elif isinstance(value, torch.Tensor):
                    role = by_id.get(id(value))
                    if role is None:  # made by the plan itself: a workspace, fresh per call
                        self._workspaces.append((_Slot(i, j, "workspace"), tuple(value.shape), value.dtype))
                    else:
                        self._slots.append(_Slot(i, j, role, python and value.dim() == 3))
            # Tensors are filled in per call; holding the planning ones would pin their memory.
            self._args.append([None if isinstance(v, (torch.Tensor, TensorDescriptor)) else v for v in launch.args])
        self._stages = [(launchers[launch.stage], launch.grid) for launch in plan.launches]
        self._shape = (p.batch, p.m, p.n)
        self._dtype = p.types.c.torch
        self._device = operands.device
        self._result_2d = result_2d
        self._defaults = {"scale_a": operands.scale_a, "scale_b": operands.scale_b}
        self._stream = _stream_getter(operands.device)

    def __call__(self, a, b, bias, residual, out, scale_a, scale_b):
        if out is not None:
            check_no_alias(out, a, b, bias)
            result = out
        else:
            result = torch.empty(self._shape, dtype=self._dtype, device=self._device)
        values = {"a": a, "b": b, "bias": bias, "residual": residual, "out": result,
                  "scale_a": scale_a if scale_a is not None else self._defaults["scale_a"],
                  "scale_b": scale_b if scale_b is not None else self._defaults["scale_b"]}
        args = [list(template) for template in self._args]
        for slot in self._slots:
            args[slot.launch][slot.index] = slot.value(values[slot.role])
        shared = {}
        for slot, shape, dtype in self._workspaces:
            key = (shape, dtype)
            if key not in shared:
                shared[key] = torch.empty(shape, dtype=dtype, device=self._device)
            args[slot.launch][slot.index] = shared[key]
        stream = self._stream()
        for (launcher, grid), stage_args in zip(self._stages, args):
            launcher(grid, stage_args, stream)
        if out is not None:
            return out
        return result[0] if self._result_2d else result


def _stream_getter(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(index)
    return lambda: torch.cuda.current_stream(index).cuda_stream


def bind(dispatcher, operands: GemmOperands, kernel: Any, result_2d: bool) -> BoundGemm:
    """Selects (or resolves), loads and plans once, for `BoundGemm` to replay."""
    spec, launchers = dispatcher.prepare(operands, kernel=kernel)
    return BoundGemm(operands, spec.definition.plan(spec.config, operands), launchers, result_2d)
