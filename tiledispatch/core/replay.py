"""The replay engine: a checked, selected and planned call bound once, then launched on new tensors.

Every op's fast path works the same way. The first call of a signature (everything the checks,
the selection and the plan read: shapes, strides, dtypes, device, 16-byte alignment, options) runs
the checked path and plans; `BoundPlan` then turns the plan's launch arguments into templates with
typed holes (`Slot`), and a later call of the signature fills the holes with its own tensors,
fresh scratch buffers and per-call scalars, and launches. What fills a hole:

- a role: the caller's tensor for that role (`a`, `x`, `q`, ...) as it is, as a view for a
  Python stage (the vendor library reads shapes), or under the planned TMA descriptor;
- a buffer: a tensor the plan made for its launches to fill (split-K partials, a padded copy made
  by a copy kernel, an output), made anew per call in the planned layout, zeroed where planned;
- a scalar the call supplies (attention's dropout seed and offset), found by argument name;
- the operands object, made per call by the op (a vendor stage that takes the whole call).

A tensor the plan made that is not declared scratch (a copy made on the host, which a replay
would not refresh) makes the plan `Unbindable`: its signature takes the checked path each time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from .kernel import CudaLauncher, PythonLauncher


# The tensor types a signature stands for: a model's weights and biases are Parameters. A subclass
# with its own __torch_function__ may mean anything, and takes the checked path.
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def tensor_meta(t) -> tuple:
    """What the checks looked at: shape, strides, dtype, device index, 16-byte alignment."""
    return (t.shape, t.stride(), t.dtype, t.get_device(), not t.data_ptr() & 15)


def _fields(descriptor) -> tuple[type, dict]:
    """A planned TMA descriptor's class and attributes, all but its base."""
    return type(descriptor), {name: value for name, value in vars(descriptor).items() if name != "base"}


def _descriptor(base: torch.Tensor, fields: tuple[type, dict]):
    """The planned descriptor over `base`: its shape, strides and block passed their checks at
    planning, for this signature, so TensorDescriptor's own checks are not run again."""
    kind, attributes = fields
    moved = object.__new__(kind)
    moved.__dict__.update(attributes)
    moved.base = base
    return moved


class Unbindable(Exception):
    """The plan reads something a replay could not make again (a copy made on the host)."""


class Fill(enum.Enum):
    """What fills an argument slot on each call."""

    ROLE = "role"  # the caller's tensor of role `source`, as it is
    ROLE_VIEW = "role-view"  # that tensor through the op's view (a Python stage planned with a 3-D view)
    ROLE_DESCRIPTOR = "role-descriptor"  # the planned TMA descriptor over that tensor
    BUFFER = "buffer"  # buffer `source`, made anew for this call
    BUFFER_DESCRIPTOR = "buffer-descriptor"  # the planned descriptor over that buffer
    SCALAR = "scalar"  # the call's scalar number `source` (a dropout seed)
    OPERANDS = "operands"  # the operands object the op makes for this call


@dataclass(frozen=True)
class Slot:
    """Argument `index` of a launch takes what `fill` says, from `source` (a role, buffer or
    scalar number); `fields` are a planned descriptor's class and attributes (all but its base)."""

    index: int
    fill: Fill
    source: int = 0
    fields: tuple[type, Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Buffer:
    """A tensor the plan made for its launches, made again per call in the same layout."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    zeroed: bool  # the kernels expect zeros (stream-K's flags, atomic split sums)

    def make(self, device) -> torch.Tensor:
        tensor = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)
        return tensor.zero_() if self.zeroed else tensor


@dataclass(frozen=True)
class Stage:
    """One launch: the bare launcher, the grid, the arguments with holes, and what fills them.
    Plain role tensors, the common hole, are listed apart: (argument index, role)."""

    launcher: Any
    grid: tuple
    template: list  # copied per call, never written
    roles: tuple[tuple[int, int], ...]
    slots: tuple[Slot, ...]


@dataclass(frozen=True)
class Binding:
    """What the op tells the engine about a plan, beside the plan itself.

    `roles` are the planning tensors in the order the op passes a call's tensors (None for a role
    the call left out); `scratch` the tensors the plan made besides `plan.scratch` (an output the
    plan allocated), `zeroed` those besides `plan.zeroed` that must be zeros; `names` each stage's
    argument names, needed where `scalars` names arguments filled per call; `operands_type` the
    type of an argument that is the whole call; `view` what a Python stage reads of a role tensor.
    """

    roles: Sequence[torch.Tensor | None]
    scratch: Iterable[torch.Tensor] = ()
    zeroed: Iterable[torch.Tensor] = ()
    names: Mapping[str, Sequence[str]] | None = None
    scalars: Sequence[str] = ()
    operands_type: type | None = None
    view: Callable[[torch.Tensor], Any] | None = None


class BoundPlan:
    """A plan's launches as templates, replayed on a call's own tensors (module docstring)."""

    def __init__(self, plan, launchers: Mapping[str, Any], binding: Binding, device) -> None:
        self._roles: dict[int, int] = {}
        for i, tensor in enumerate(binding.roles):
            if tensor is not None:
                self._roles.setdefault(id(tensor), i)
        self._scratch = {id(t) for t in (*plan.scratch, *plan.zeroed, *binding.scratch) if t is not None}
        self._zeroed = {id(t) for t in (*plan.zeroed, *binding.zeroed) if t is not None}
        self._buffer_ids: dict[int, int] = {}
        self._kept: list[torch.Tensor] = []  # planning tensors, alive while ids are compared
        self.buffers: list[Buffer] = []
        self._binding = binding
        self._view = binding.view
        self.stages = tuple(self._stage(launch, launchers[launch.stage]) for launch in plan.launches)
        self.device = device
        self.run = self._run  # `seal` may put a leaner one for the plan's shape in its place

    def buffer_of(self, tensor: torch.Tensor) -> int:
        """The buffer number of a tensor the plan made (an output the op hands back), made one if
        no launch reads it."""
        if id(tensor) in self._roles:
            raise Unbindable("the plan hands an input back as its result")
        return self._buffer(tensor)

    def seal(self) -> "BoundPlan":
        """Drops what binding needed: the planning tensors' ids mean nothing once they are freed."""
        self.buffers = tuple(self.buffers)
        del self._roles, self._scratch, self._zeroed, self._buffer_ids, self._kept, self._binding
        if len(self.stages) == 1 and not self.buffers and not self.stages[0].slots:
            self.run = _one_plain_stage(self.stages[0])
        return self

    def _buffer(self, tensor: torch.Tensor) -> int:
        index = self._buffer_ids.get(id(tensor))
        zeroed = id(tensor) in self._zeroed
        if index is None:
            index = self._buffer_ids[id(tensor)] = len(self.buffers)
            self.buffers.append(Buffer(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, zeroed))
            self._kept.append(tensor)
        return index

    def _tensor_slot(self, j: int, name: str, tensor: torch.Tensor, fields, python: bool) -> Slot | tuple[int, int]:
        """The slot of a tensor argument; a plain role tensor's as the pair `Stage.roles` lists."""
        role = self._roles.get(id(tensor))
        if role is not None:
            if fields is not None:
                return Slot(j, Fill.ROLE_DESCRIPTOR, role, fields)
            if python and self._binding.view is not None:
                return Slot(j, Fill.ROLE_VIEW, role)
            return (j, role)
        if id(tensor) not in self._scratch and id(tensor) not in self._buffer_ids:
            raise Unbindable(f"argument {name} reads a tensor the plan copied on the host")
        buffer = self._buffer(tensor)
        return Slot(j, Fill.BUFFER if fields is None else Fill.BUFFER_DESCRIPTOR, buffer, fields)

    def _stage(self, launch, launcher) -> Stage:
        from triton.tools.tensor_descriptor import TensorDescriptor  # Triton is imported by then: it planned

        binding = self._binding
        python = isinstance(launcher, PythonLauncher)
        names = binding.names[launch.stage] if binding.names is not None else None
        roles, slots, template = [], [], list(launch.args)
        for j, value in enumerate(launch.args):
            name = names[j] if names is not None else str(j)
            if binding.operands_type is not None and isinstance(value, binding.operands_type):
                slot = Slot(j, Fill.OPERANDS)
            elif isinstance(value, TensorDescriptor):
                slot = self._tensor_slot(j, name, value.base, _fields(value), python)
            elif isinstance(value, torch.Tensor):
                slot = self._tensor_slot(j, name, value, None, python)
            elif name in binding.scalars:
                slot = Slot(j, Fill.SCALAR, binding.scalars.index(name))
            else:
                continue
            (roles if type(slot) is tuple else slots).append(slot)
            template[j] = None  # a planning tensor kept in the template would pin its memory
        run = launcher.launch if isinstance(launcher, CudaLauncher) else launcher  # one frame less a call
        return Stage(run, launch.grid, template, tuple(roles), tuple(slots))

    def _run(self, values: Sequence, stream, scalars: Sequence = (), operands: Callable[[], Any] | None = None
             ) -> list[torch.Tensor]:
        """Launches every stage on `values` (the call's tensors in role order); returns the buffers
        made for this call, so that the op can hand back the ones that are results. Called as
        `run`, which for a plan of one stage that only takes role tensors is `_one_plain_stage`."""
        device = self.device
        buffers = [b.make(device) for b in self.buffers] if self.buffers else ()
        made = None
        for stage in self.stages:
            args = stage.template.copy()
            for j, role in stage.roles:
                args[j] = values[role]
            for slot in stage.slots:
                fill = slot.fill
                if fill is Fill.ROLE_DESCRIPTOR:
                    args[slot.index] = _descriptor(values[slot.source], slot.fields)
                elif fill is Fill.BUFFER:
                    args[slot.index] = buffers[slot.source]
                elif fill is Fill.BUFFER_DESCRIPTOR:
                    args[slot.index] = _descriptor(buffers[slot.source], slot.fields)
                elif fill is Fill.ROLE_VIEW:
                    args[slot.index] = self._view(values[slot.source])
                elif fill is Fill.SCALAR:
                    args[slot.index] = scalars[slot.source]
                else:
                    if made is None:
                        made = operands()
                    args[slot.index] = made
            stage.launcher(stage.grid, args, stream)
        return buffers


def _one_plain_stage(stage: Stage) -> Callable[..., tuple]:
    """`BoundPlan.run` for the most common plan, one launch that reads only the call's tensors:
    each call is a host cost the caller pays, so this one does nothing else."""
    launcher, grid, template, roles = stage.launcher, stage.grid, stage.template, stage.roles

    def run(values, stream, scalars=(), operands=None) -> tuple:
        args = template.copy()
        for j, role in roles:
            args[j] = values[role]
        launcher(grid, args, stream)
        return ()

    return run
