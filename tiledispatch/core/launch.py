"""Launch plans: the stages of one operation, each a grid and its bound arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Launch:
    stage: str  # the KernelUnit.stage that runs it
    grid: tuple[int, int, int]
    args: tuple  # every kernel argument in signature order, constexprs included


@dataclass(frozen=True)
class Plan:
    launches: tuple[Launch, ...]
    output: Any  # the tensor the caller gets back
    # Scratch tensors the kernels expect as zeros (stream-K's flags): a replay of the plan
    # on new operands must make these anew as zeros, not merely allocate them.
    zeroed: tuple = ()
    # Every tensor the plan made for its launches to fill before they read it (split workspaces,
    # padded copies; `zeroed` among them), where an op's replay says which tensors it may make anew:
    # one the plan filled on the host instead (a copy of an operand) is not listed, so not replayable.
    scratch: tuple = ()


def execute(plan: Plan, launchers: Mapping[str, Any], stream: int | None) -> Any:
    for launch in plan.launches:
        launchers[launch.stage](launch.grid, launch.args, stream)
    return plan.output
