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


def poison(output: Any, zeroed: tuple = ()) -> None:
    """NaN into every floating tensor of a plan's output (a tensor or a dataclass of them), except
    those the plan needs as zeros: an element the kernel never writes then fails the check."""
    import torch

    tensors = [output] if isinstance(output, torch.Tensor) else list(vars(output).values()) if hasattr(
        output, "__dataclass_fields__") else []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not any(t is z for z in zeroed):
            t.fill_(float("nan"))


def run_checked(definition: Any, config: Any, operands: Any, expected: Any, launchers: Mapping[str, Any],
                stream: int | None, device: Any) -> tuple[Plan, Any]:
    """Runs `config`'s plan once on `operands` into poisoned outputs and compares the result with
    `expected`, the op's reference of those operands: (the plan, the op's Comparison, or None for
    an op without a check). A sweep checks every kernel so before it times it, and autotune every
    finalist."""
    plan = definition.plan(config, operands)
    poison(plan.output, plan.zeroed)
    execute(plan, launchers, stream)
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)  # a fault raises here, at the kernel that made it
    return plan, None if definition.check is None else definition.check(plan.output, expected, operands)
