"""The contract an op folder fulfils, so that the core never needs to know any op.

Each op package (``tiledispatch/ops/<op>/``) exposes one `OpDefinition` named ``OP``.
The registry, dispatcher, cache and CLI only ever talk to that object.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from .choice import Choice
from .errors import UnsupportedError


class OpKind(Choice):
    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"


class RuleSet(Choice):
    """Named config generators. tiny ⊂ tests ⊂ full and default ⊂ full (tests prove it)."""

    TINY = "tiny"  # a handful, cheap enough for the CPU interpreter
    TESTS = "tests"  # broader coverage for correctness tests
    DEFAULT = "default"  # the curated set that ships
    FULL = "full"  # the whole sensible space, for sweeps


class UnitKind(enum.Enum):
    TRITON = "triton"  # a @triton.jit function: compiled, cached, launched on a grid
    GLUON = "gluon"  # a @gluon.jit function (Triton's layout-explicit front end): the same, GPU only
    PYTHON = "python"  # a plain function (the vendor library through PyTorch): called with the args

    @property
    def compiled(self) -> bool:
        return self is not UnitKind.PYTHON


@dataclass(frozen=True)
class KernelUnit:
    """One function a plan stage runs: where it lives and how it is specialised.

    `signature` maps every argument name to a Triton type (``*fp16``, ``i32``) or
    ``constexpr``; `constexprs` gives the values of the constexpr ones.
    `modules` are every source file whose text the compiled code depends on.
    """

    stage: str
    module: str
    function: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    num_stages: int
    modules: tuple[str, ...]
    divisible_by_16: tuple[str, ...] = ()  # arguments the compiler may assume divisible by 16
    # (argument, divisor) pairs: what the compiler may assume divides each (a pointer: its address in
    # bytes; an integer: its value). For facts other than 16, e.g. 16-byte strides of 2-byte elements: 8.
    divisibility: tuple[tuple[str, int], ...] = ()
    kind: UnitKind = UnitKind.TRITON
    # ptxas's register cap per thread. A warp-specialised kernel needs one: its partitions trade
    # registers at run time (setmaxnreg), and without a cap the compiler assumes 255 for all.
    max_registers: int | None = None


@dataclass(frozen=True)
class Score:
    """A ranking score in [0, 1] (higher is better) with the terms that made it."""

    value: float
    terms: Mapping[str, float]


@dataclass(frozen=True)
class OpDefinition:
    """Everything the core needs from an op. See DESIGN.md, "the op contract"."""

    kind: OpKind
    problem_type: type
    config_type: type
    validate: Callable[[Any, Any], Any]  # (config, arch) -> ValidationResult
    auto_correct: Callable[[Any, Any], tuple[Any, tuple]]  # (config, arch) -> (config, corrections)
    rule_sets: Mapping[RuleSet, Callable[[], Iterable[Any]]]  # rule set -> config generator
    supports: Callable[[Any, Any], str | None]  # (config, problem) -> None, or why not
    kernel_units: Callable[..., tuple[KernelUnit, ...]]  # (config, specialization) -> what to compile
    specialization_of: Callable[[Any], Any]  # problem -> what the artifact specialises on (has .tag)
    specializations: tuple[Any, ...]  # the ones `tiledispatch build` compiles ahead of time
    plan: Callable[[Any, Any], Any]  # (config, operands) -> core.launch.Plan
    rule_score: Callable[[Any, Any, Any], Score]  # (config, problem, arch) -> Score
    family_of: Callable[[Any], str]  # config -> family name (for filters and counts)
    dtype_of: Callable[[Any], str]  # config -> dtype name (for filters and counts)
    # (problem, device, seed) -> fresh random operands laid out as the problem says, or None where
    # none reproduce it; what the `autotune` strategy times. None: the op is ranked by rules only.
    tuning_operands: Callable[[Any, Any, int], Any] | None = None


def get_op(kind: "OpKind | str") -> OpDefinition:
    """The op's definition, imported on first use so that `import tiledispatch` stays light."""
    kind = OpKind.parse(kind)
    try:
        module = importlib.import_module(f"tiledispatch.ops.{kind.value}")
    except ModuleNotFoundError:
        raise UnsupportedError(f"op {kind.value!r} is not implemented yet") from None
    return module.OP
