"""What every op's fuzz cases share: the case record, the outcome rules and the comparison.

A case is one call of the public API with everything needed to judge it: what it must do
(return the reference's result, refuse, or either), the argument a refusal must name, the
float64 reference of its outputs, and the inputs it must leave untouched.
"""

from __future__ import annotations


import enum
import functools
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

import tiledispatch
from tiledispatch.core.dtypes import DType
from tiledispatch.core.errors import NoKernelError, TiledispatchError, UnsupportedError

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# The interpreter has no bf16 tl.dot: bf16 runs on a GPU only.
DTYPES = (torch.float16, torch.float32, torch.bfloat16) if ON_GPU else (torch.float16, torch.float32)
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
# tf32 rounds both inputs of every product to 10 bits; short sums of such products cancel, so the
# result's relative error reaches a few times the inputs' roundoff (2**-11).
TF32_ROUNDOFF = 4 * 2.0**-11

# Errors a refusal may raise; anything else (AttributeError, KeyError, IndexError, RuntimeError,
# OverflowError, the interpreter's errors, ...) is a crash.
ALLOWED_ERRORS = (TiledispatchError, TypeError, ValueError)
# Errors a valid call may raise: a limitation stated by the library, counted and capped.
LIMITATIONS = (UnsupportedError, NoKernelError)


class Expect(enum.Enum):
    WORKS = "works"  # must return the reference's result
    RAISES = "raises"  # must refuse with an allowed error that names the argument
    EITHER = "either"  # refuses as above, or returns the reference's result


@dataclass(frozen=True)
class Case:
    ident: str
    summary: str
    run: Callable[[], dict[str, torch.Tensor]] = field(repr=False)  # calls the API; its outputs by name
    expect: Expect
    argument: str | None = None  # the mutated argument a refusal must name; None: a valid call
    reference: Callable[[], dict[str, torch.Tensor]] | None = field(default=None, repr=False)  # float64
    tolerance: dict[str, float] = field(default_factory=dict)  # by name; relative Frobenius error
    reads: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # inputs the call must not write
    out: torch.Tensor | None = field(default=None, repr=False)  # the caller's out: holds outputs["result"]
    floor: float = 1e-3  # the RMS below which outputs are compared absolutely (see compare)
    floors: dict[str, float] = field(default_factory=dict)  # by name, where an output's own floor is higher
    warmup: Callable[[], Any] | None = field(default=None, repr=False)  # the same signature on twins, first
    result_dtype: torch.dtype | None = None  # the dtype outputs["result"] must have
    notes: list[str] = field(default_factory=list)  # what the run chose (a forced kernel), for the report

    @property
    def valid(self) -> bool:
        return self.argument is None

    def floor_of(self, name: str) -> float:
        return max(self.floor, self.floors.get(name, 0.0))


# -- the argument named in a message ------------------------------------------------------------
ALIASES = {"k": ("k", "key"), "v": ("v", "value"), "q": ("q", "quer"), "kernel": ("kernel",),
           "dy": ("dy",), "w": ("w", "weight"), "x": ("x", "input")}
# "a" is also the English article: as a name it is followed by a verb, a bracket or punctuation.
_A_AS_NAME = re.compile(r"(?<![\w'])a(?=('s|\)|,|:|=|\[| is\b| must\b| has\b| and\b| overlaps\b| in\b| on\b|"
                        r" \(| of shape\b|$))")


def names_argument(message: str, argument: str) -> bool:
    """Whether `message` names `argument` as a word (`stride[1]` names stride); "a/b" accepts
    either name (a size that disagrees with a tensor may be blamed on the tensor)."""
    for one in argument.split("/"):
        if one == "a" and _A_AS_NAME.search(message):
            return True
        for name in ALIASES.get(one, (one,)) if one != "a" else ():
            if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}", message):
                return True
    return False


# -- comparison -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Error:
    max_abs: float
    relative: float
    unwritten: int  # NaN (the poison of a given out) where the reference is finite
    shape_ok: bool

    def passed(self, tolerance: float) -> bool:
        return self.shape_ok and self.unwritten == 0 and math.isfinite(self.relative) and self.relative <= tolerance

    def describe(self, tolerance: float) -> str:
        if not self.shape_ok:
            return "wrong shape"
        return (f"max abs error {self.max_abs:.3g}, relative error {self.relative:.3g} (tolerance {tolerance:.3g}), "
                f"{self.unwritten} unwritten")


def compare(got: torch.Tensor, ref: torch.Tensor, floor: float = 1e-3) -> Error:
    """Relative Frobenius error of `got` against the float64 `ref`; infinities must match exactly.

    A reference whose RMS is below `floor` (a gradient that is 0 in exact arithmetic, as dq is
    where every key is equal) is compared absolutely, against `floor` per element."""
    if tuple(got.shape) != tuple(ref.shape):
        return Error(math.inf, math.inf, 0, False)
    got = got.detach().resolve_neg().resolve_conj().to("cpu", torch.float64)
    finite = torch.isfinite(ref)
    unwritten = int((torch.isnan(got) & ~torch.isnan(ref)).sum())
    same_inf = (got == ref) & ~finite
    diff = torch.where(finite, got - ref, torch.where(same_inf, 0.0, math.inf))
    norm = max(float(torch.linalg.vector_norm(torch.where(finite, ref, 0.0))), floor * max(ref.numel(), 1) ** 0.5)
    relative = float(torch.linalg.vector_norm(diff)) / norm if diff.numel() else 0.0
    return Error(float(diff.abs().max()) if diff.numel() else 0.0, relative, unwritten, True)


def roundoff(dtype: torch.dtype, tf32: bool = False) -> float:
    return max(UNIT_ROUNDOFF[dtype], TF32_ROUNDOFF if tf32 else 0.0, 2e-6)


def dtype_name(dtype: torch.dtype) -> str:
    return DType.from_torch(dtype).value


# -- names of kernels of every op, for `kernel=` given another op's kernel ------------------------
def kernel_of(op: tiledispatch.OpKind, dtype: torch.dtype) -> str:
    """A registered kernel name of `op` (one of this dtype where the registry has one)."""
    names = [s.name for s in tiledispatch.default_dispatcher().registry if s.op is op]
    wanted = f"_{dtype_name(dtype)}_"
    return next((n for n in names if wanted in n), names[0])


def forced_kernel(problem, seed: int, notes: list[str]):
    """One of the kernels the default dispatcher accepts for `problem`, by `seed`: a valid `kernel=`,
    given by name or (odd seeds) as its KernelSpec."""
    ranked = tiledispatch.default_dispatcher().explain(problem).ranked
    spec = ranked[seed % len(ranked)].spec
    notes.append(f"kernel={spec.name}{' (a KernelSpec)' if seed % 2 else ''}")
    return spec if seed % 2 else spec.name


@functools.cache
def rule_set_dispatcher(op: tiledispatch.OpKind, rule_set: str) -> tiledispatch.Dispatcher:
    """A dispatcher of one op's rule set: a valid `dispatcher=` that is not the default one."""
    arch = tiledispatch.default_dispatcher().arch
    return tiledispatch.Dispatcher(tiledispatch.Registry.from_rule_set(op, rule_set, arch), arch)


def some_dispatcher(rng, op: tiledispatch.OpKind) -> dict:
    """`dispatcher=` the default one or the `tests` rule set's, a twentieth of the time; else nothing."""
    if rng.random() >= 0.05:
        return {}
    return {"dispatcher": rng.choice([tiledispatch.default_dispatcher(), rule_set_dispatcher(op, "tests")])}


def other_float(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype != torch.float32 else torch.float16


def bad_tensors(shape, dtype, device, *, required: bool) -> list[tuple[str, Any]]:
    """Values that are no tensor of this op: other types, complex, meta, integer, float64, 0-d."""
    values = [("list", torch.zeros(shape).tolist()), ("str", "tensor"), ("float", 1.5),
              ("complex", torch.zeros(shape, dtype=torch.complex64, device=device)),
              ("meta", torch.empty(shape, dtype=dtype, device="meta")),
              ("int32", torch.ones(shape, dtype=torch.int32, device=device)),
              ("float64", torch.ones(shape, dtype=torch.float64, device=device)),
              ("bool", torch.ones(shape, dtype=torch.bool, device=device)),
              ("0-d", torch.tensor(1.0, dtype=dtype, device=device)),
              ("numpy", torch.zeros(shape).numpy())]
    if ON_GPU:
        values.append(("on the CPU", torch.zeros(shape, dtype=dtype)))
    if required:
        values.append(("None", None))
    return values


def warmup_for(ident: str, run_twin: Callable[[], Any], values) -> Callable[[], Any] | None:
    """On a GPU, where a call seen before replays its bound plan, a call whose views or aliasing a
    replay would have to notice, and every other case of an odd id, first runs once on twins
    (tensors.twin) to bind that plan: the call itself is then a replay. The CPU has no replays."""
    from .tensors import needs_warmup

    odd = int(ident.rsplit("-", 1)[1]) % 2 == 1
    return run_twin if ON_GPU and (odd or needs_warmup(values)) else None


def pick(rng, mutations: list) -> tuple:
    """One mutation: an (argument, expectation) pair first, then one of its values, so that the
    many bad values of one tensor do not crowd out the rarer legal forms."""
    keys = sorted({(m[0], m[3].value) for m in mutations})
    key = rng.choice(keys)
    return rng.choice([m for m in mutations if (m[0], m[3].value) == key])


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        text = f"tensor{tuple(value.shape)}/{str(value.dtype).removeprefix('torch.')}/{value.device.type}"
        if value.numel() and not value.is_contiguous():
            text += f"/strides{tuple(value.stride())}"
        if value.device.type != "meta" and value.numel() and value.data_ptr() % 16:
            text += "/unaligned"
        return text + ("/neg_view" if value.is_neg() else "") + ("/conj" if value.is_conj() else "")
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def with_kwargs(call, **changes):
    """`call` (a frozen case) with some keyword arguments replaced."""
    return replace(call, kwargs={**call.kwargs, **changes})


def with_arg(call, index: int, value):
    """`call` with its positional argument `index` replaced."""
    args = list(call.args)
    args[index] = value
    return replace(call, args=tuple(args))
