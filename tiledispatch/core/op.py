"""The contract an op folder fulfils, and the registry of ops, so that the core never needs to know any op.

Each op package (``tiledispatch/ops/<op>/``) names its kind (``OpKind("<op>")``), builds one
`OpDefinition` and registers it (`register`); ``tiledispatch/ops/__init__.py`` imports the op
packages. The registry, dispatcher, cache and CLI only ever talk to the definitions they get
from `get_op` and `all_ops`: a new op is a new folder that registers itself.
"""

from __future__ import annotations

import enum
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence

from .choice import Choice
from .errors import UnsupportedError

_NAME = re.compile(r"[a-z][a-z0-9_]*")


class _OpKinds(type):
    """`OpKind.<NAME>` is the registered op of that name in lower case, and iterating `OpKind`
    gives the registered kinds in registration order: the core spells no op's name."""

    def __getattr__(cls, name: str) -> "OpKind":
        definition = _OPS.get(name.lower()) if name.isupper() else None
        if definition is None:
            raise AttributeError(f"{cls.__name__} has no attribute {name!r} (no op {name.lower()!r} is registered)")
        return definition.kind

    def __iter__(cls) -> Iterator["OpKind"]:
        return iter([definition.kind for definition in all_ops()])


class OpKind(metaclass=_OpKinds):
    """An op's name, the value its kernel specs and problems carry (``spec.op``, ``problem.op``).

    Each op defines its own (``OpKind("gemm")``). Kinds of one name are one object, in this
    process and in any that unpickles one, so `is` compares them as it compared enum members.
    """

    __slots__ = ("value",)
    _interned: dict[str, "OpKind"] = {}
    _lock = threading.Lock()

    def __new__(cls, value: "OpKind | str") -> "OpKind":
        if isinstance(value, OpKind):
            return value
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise ValueError(f"an op's name is lower-case letters, digits and '_', starting with a letter; "
                             f"got {value!r}")
        with cls._lock:
            kind = cls._interned.get(value)
            if kind is None:
                kind = object.__new__(cls)
                object.__setattr__(kind, "value", value)
                cls._interned[value] = kind
        return kind

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"an OpKind is immutable (setting {name!r})")

    def __reduce__(self):
        return OpKind, (self.value,)

    def __repr__(self) -> str:
        return f"OpKind({self.value!r})"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: "OpKind | str", *, exact: bool = False) -> "OpKind":
        """The registered kind `value` names (any case, unless `exact`); anything else is refused
        naming the registered ones."""
        if isinstance(value, OpKind) and value.value in _OPS:
            return value
        name = value.value if isinstance(value, OpKind) else str(value) if exact else str(value).lower()
        definition = _OPS.get(name)
        if definition is None:
            known = ", ".join(d.kind.value for d in all_ops()) or "none is registered"
            raise UnsupportedError(f"unknown op kind {value!r}; use one of: {known}")
        return definition.kind


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
    ``constexpr``; `constexprs` gives the values of the constexpr ones. What the compiled
    code depends on in source is `function`'s own Triton cache key (`core.jitkey`).
    """

    stage: str
    module: str
    function: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    num_stages: int
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
    # rule set -> config generator; with `problem_class`, a generator also takes `within=<class>`
    # and yields that class's configs alone, in the order of the whole set
    rule_sets: Mapping[RuleSet, Callable[..., Iterable[Any]]]
    supports: Callable[[Any, Any], str | None]  # (config, problem) -> None, or why not
    kernel_units: Callable[..., tuple[KernelUnit, ...]]  # (config, specialization, arch) -> what to compile
    specialization_of: Callable[[Any], Any]  # problem -> what the artifact specialises on (has .tag)
    specializations: tuple[Any, ...]  # the ones `tiledispatch build` compiles ahead of time
    plan: Callable[[Any, Any], Any]  # (config, operands) -> core.launch.Plan
    rule_score: Callable[[Any, Any, Any], Score]  # (config, problem, arch) -> Score
    family_of: Callable[[Any], str]  # config -> family name (for filters and counts)
    # config -> whether it is the vendor library's kernel (cuBLAS, cuDNN, SDPA through PyTorch):
    # a sweep's baseline, always timed; a family of ours that calls another op of ours is not
    is_vendor: Callable[[Any], bool]
    dtype_of: Callable[[Any], str]  # config -> dtype name (for filters and counts)
    # (problem, device, seed) -> fresh random operands laid out as the problem says, or None where
    # none reproduce it; what the `autotune` strategy times. None: the op is ranked by rules only.
    tuning_operands: Callable[[Any, Any, int], Any] | None = None
    # problem -> its class (hashable): the configs of other classes never take the problem, so a
    # lazy registry generates only the class's (`core.registry.RuleSetSource`). None: no classes.
    problem_class: Callable[[Any], Hashable] | None = None
    # operands -> the op's float64 reference result, what a sweep checks every kernel's output
    # against before timing it (computed once per operands, shared by the kernels checked on them).
    # None: the op's kernels are timed unchecked.
    reference: Callable[[Any], Any] | None = None
    # (a plan's output, the reference, operands) -> core.comparison.Comparison under the tolerance
    # of the problem's dtypes. Set wherever `reference` is.
    check: Callable[[Any, Any, Any], Any] | None = None
    # name -> (problem, arch) -> configs: tile spaces a sweep times beyond the rule sets, for one
    # problem (`tiledispatch sweep --space`). Empty: the op has none.
    spaces: Mapping[str, Callable[[Any, Any], Iterable[Any]]] = field(default_factory=dict)
    # How many of the rules' best candidates a learned model ranks, beside the vendor's (None: every
    # candidate): a shortlist saves first-sight time where the rules already rank well, and loses
    # the kernels the rules place low where they do not (core.candidate_set.model_shortlist).
    model_shortlist: int | None = 16
    # config -> what of a config `supports` reads (hashable): configs of one key take or refuse every
    # problem alike, so a ranking asks once per key (`core.candidate_set`). None: once per config.
    support_key: Callable[[Any], Hashable] | None = None
    # problem -> the problem whose ranking stands for its own (sizes that rank alike, such as a GEMM's
    # token counts in one bucket): the stand-in is ranked once, and each problem it stands for takes
    # its order of the candidates the problem accepts. None: each problem is ranked itself.
    ranking_problem: Callable[[Any], Any] | None = None
    # (configs, arch) -> a `core.candidate_set.ScoreBatch`: the configs' rule scores prepared once, each
    # problem's made in one pass (`rule_score`'s numbers). None: `rule_score` per config.
    score_batch: Callable[[Sequence[Any], Any], Any] | None = None


# The registered ops by name, in registration order (the order `all_ops` and a default
# dispatcher's registry follow). Written at import time by the op packages; read by every call.
_OPS: dict[str, OpDefinition] = {}
_REGISTER_LOCK = threading.Lock()


def register(definition: OpDefinition) -> OpDefinition:
    """Makes an op known to the core; returns `definition`. Registering the same definition again
    is a no-op; another definition under a registered kind is a bug, and raises."""
    if not isinstance(definition, OpDefinition) or not isinstance(definition.kind, OpKind):
        raise TypeError(f"register takes an OpDefinition whose kind is an OpKind; got {definition!r}")
    with _REGISTER_LOCK:
        known = _OPS.get(definition.kind.value)
        if known is not None and known is not definition:
            raise ValueError(f"op {definition.kind.value!r} is registered already, by another definition")
        _OPS[definition.kind.value] = definition
    return definition


def get_op(kind: "OpKind | str") -> OpDefinition:
    """The registered definition of `kind` (an OpKind or its name, any case)."""
    return _OPS[OpKind.parse(kind).value]


def all_ops() -> tuple[OpDefinition, ...]:
    """Every registered op's definition, in registration order."""
    return tuple(_OPS.values())
