"""Fuzz cases of `tiledispatch.conv`, `conv_backward_data` and `conv_backward_weight`: grouped convs
in 1-3 spatial dims over random geometry, layouts and epilogues, and calls with one argument made bad."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import OpKind

from . import tensors as T
from tiledispatch.ops.conv import check_operands

from .cases import (
    DEVICE, DTYPES, Case, Expect, describe_value, forced_kernel, pick, roundoff, some_dispatcher, warmup_for,
)
from .conv_mutations import mutations

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_ACTIVATIONS = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}
_MAX_SPATIAL = {1: 12, 2: 7, 3: 4}
FUNCTIONS = {"forward": tiledispatch.conv, "bwd_data": tiledispatch.conv_backward_data,
             "bwd_weight": tiledispatch.conv_backward_weight}


@dataclass(frozen=True)
class Geometry:
    n: int
    c: int
    k: int
    groups: int
    spatial: tuple[int, ...]
    filt: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    @property
    def dims(self) -> int:
        return len(self.spatial)

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple((i + 2 * p - d * (f - 1) - 1) // s + 1 for i, f, s, p, d in
                     zip(self.spatial, self.filt, self.stride, self.padding, self.dilation))

    @property
    def x_shape(self):
        return (self.n, self.c, *self.spatial)

    @property
    def w_shape(self):
        return (self.k, self.c // self.groups, *self.filt)

    @property
    def y_shape(self):
        return (self.n, self.k, *self.out_spatial)


@dataclass(frozen=True)
class Call:
    direction: str
    args: tuple
    kwargs: dict
    dtype: torch.dtype
    geometry: Geometry
    grad: bool = False  # forward under autograd: dx, dw (and dbias) checked too
    force: int | None = None  # picks a kernel the dispatcher accepts, passed as kernel=

    def describe(self) -> str:
        parts = [describe_value(a) for a in self.args]
        parts += [f"{key}={describe_value(v)}" for key, v in self.kwargs.items() if v is not None]
        return f"{self.direction} " + " ".join(parts) + (" (autograd)" if self.grad else "")


def draw_geometry(rng: random.Random) -> Geometry:
    dims = rng.choice([1, 2, 2, 3])
    if rng.random() < 0.2:  # depthwise
        groups, cpg, kpg = rng.randint(1, 8), 1, rng.choice([1, 1, 2])
    else:
        groups, cpg, kpg = rng.choice([1, 1, 2, 4]), rng.randint(1, 4), rng.randint(1, 4)
    while True:
        spatial = tuple(rng.randint(1, _MAX_SPATIAL[dims]) for _ in range(dims))
        filt = tuple(rng.randint(1, 3) for _ in range(dims))
        stride = tuple(rng.choice([1, 1, 2]) for _ in range(dims))
        padding = tuple(rng.choice([0, 0, 1]) for _ in range(dims))
        dilation = tuple(rng.choice([1, 1, 1, 2]) for _ in range(dims))
        g = Geometry(rng.randint(1, 2), groups * cpg, groups * kpg, groups, spatial, filt, stride, padding, dilation)
        if min(g.out_spatial) >= 1:
            return g


def _form(rng, values: tuple[int, ...]):
    """An int where all dims agree (half the time), else a tuple or a list."""
    if len(set(values)) == 1 and rng.random() < 0.5:
        return values[0]
    return rng.choice([tuple, list])(values)


def _channels_last_layout(rng, rank: int) -> T.Layout:
    """A layout a conv output may have: channels innermost and dense, any other strides."""
    layout = T.random_layout(rng, rank, written=True)
    step = layout.step_dim if layout.step_dim != 1 else None
    return T.Layout((0, *range(2, rank), 1), step, layout.offset)


def _tensor(rng, gen, shape, dtype):
    rank = len(shape)
    preferred = (0, *range(2, rank), 1) if rank > 2 else None
    return T.make(gen, shape, dtype, DEVICE, T.random_layout(rng, rank, preferred=preferred))


def _options(rng, g: Geometry) -> dict:
    kwargs = {"stride": _form(rng, g.stride), "padding": _form(rng, g.padding), "dilation": _form(rng, g.dilation)}
    defaults = {"stride": 1, "padding": 0, "dilation": 1}
    kwargs = {key: v for key, v in kwargs.items() if v != defaults[key] or rng.random() < 0.5}
    if g.groups != 1 or rng.random() < 0.3:
        kwargs["groups"] = g.groups
    return kwargs


def _out(rng, gen, shape, dtype, kwargs):
    if rng.random() < 0.35:
        kwargs["out"] = T.make(gen, shape, dtype, DEVICE, _channels_last_layout(rng, len(shape)), fill=float("nan"))


def draw(direction: str, rng: random.Random, gen: torch.Generator) -> Call:
    g = draw_geometry(rng)
    dtype = rng.choice(DTYPES)
    kwargs = _options(rng, g)
    grad = False
    if direction == "forward":
        args = (_tensor(rng, gen, g.x_shape, dtype), _tensor(rng, gen, g.w_shape, dtype))
        if rng.random() < 0.3:
            kwargs["bias"] = _tensor(rng, gen, (g.k,), dtype)
        if rng.random() < 0.4:
            kwargs["activation"] = rng.choice([None, "none", "relu", "gelu", "silu"])
        if rng.random() < 0.25:
            kwargs["residual"] = _tensor(rng, gen, g.y_shape, dtype)
        grad = rng.random() < 0.08
        if not grad:
            _out(rng, gen, g.y_shape, dtype, kwargs)
            if kwargs.get("out") is not None and rng.random() < 0.3:
                out = kwargs["out"]
                out.copy_(T.make(gen, g.y_shape, dtype, DEVICE))
                kwargs["residual"] = out  # in place: y = conv + y
    elif direction == "bwd_data":
        size = rng.choice([g.x_shape, g.spatial, list(g.spatial), torch.Size(g.x_shape)])
        args = (_tensor(rng, gen, g.y_shape, dtype), _tensor(rng, gen, g.w_shape, dtype), size)
        _out(rng, gen, g.x_shape, dtype, kwargs)
    else:
        size = rng.choice([g.w_shape, g.filt, list(g.filt), torch.Size(g.w_shape)])
        args = (_tensor(rng, gen, g.x_shape, dtype), _tensor(rng, gen, g.y_shape, dtype), size)
        _out(rng, gen, g.w_shape, dtype, kwargs)
    if dtype == torch.float32 and rng.random() < 0.15:
        kwargs["allow_tf32"] = True
    force = rng.getrandbits(30) if not grad and rng.random() < 0.1 else None
    kwargs |= some_dispatcher(rng, OpKind.CONV)
    return Call(direction, args, kwargs, dtype, g, grad, force)


# -- the reference ---------------------------------------------------------------------------------
def _ints(value, dims: int) -> list[int]:
    if isinstance(value, (tuple, list)):
        return [int(v) for v in value]
    return [int(value)] * dims


def reference(call: Call) -> dict[str, torch.Tensor]:
    """float64 by PyTorch on the CPU: the forward conv and its autograd gradients."""
    kw = call.kwargs
    g = call.geometry
    padding = kw.get("padding", 0)
    options = {"stride": _ints(kw.get("stride", 1), g.dims),
               "padding": padding if isinstance(padding, str) else _ints(padding, g.dims),
               "dilation": _ints(kw.get("dilation", 1), g.dims), "groups": int(kw.get("groups", 1))}
    conv = _CONV[g.dims]
    if call.direction == "forward":
        x, w = (T.f64(t).requires_grad_(call.grad) for t in call.args)
        bias = T.f64(kw.get("bias"))
        if bias is not None:
            bias.requires_grad_(call.grad)
        y = _ACTIVATIONS[kw.get("activation") or "none"](conv(x, w, bias, **options))
        if kw.get("residual") is not None:
            y = y + T.f64(kw["residual"])
        if not call.grad:
            return {"result": y.detach()}
        y.backward(_grad_of(y))
        grads = {"result": y.detach(), "dx": x.grad, "dw": w.grad}
        return grads | ({"dbias": bias.grad} if bias is not None else {})
    if call.direction == "bwd_data":
        dy, w = T.f64(call.args[0]), T.f64(call.args[1])
        x = torch.zeros(dy.shape[0], w.shape[1] * options["groups"], *_spatial(call.args[2], g.dims),
                        dtype=torch.float64, requires_grad=True)
        conv(x, w, **options).backward(dy)
        return {"result": x.grad}
    x, dy = T.f64(call.args[0]), T.f64(call.args[1])
    w = torch.zeros(dy.shape[1], x.shape[1] // options["groups"], *_spatial(call.args[2], g.dims),
                    dtype=torch.float64, requires_grad=True)
    conv(x, w, **options).backward(dy)
    return {"result": w.grad}


def _spatial(size, dims: int) -> list[int]:
    return [int(v) for v in list(size)[-dims:]]


def _grad_of(y: torch.Tensor) -> torch.Tensor:
    """The output gradient of an autograd case: fixed, so that the call and the reference share it."""
    return torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape)


def _forced(call: Call, notes: list[str]) -> dict:
    """The call's keywords with kernel= a kernel the default dispatcher accepts for its problem."""
    roles = {"forward": ("x", "w"), "bwd_data": ("dy", "w", "input_size"),
             "bwd_weight": ("x", "dy", "weight_size")}[call.direction]
    kwargs = {key: v for key, v in call.kwargs.items() if key != "dispatcher"}  # the default one's kernels
    problem = check_operands(call.direction, **dict(zip(roles, call.args)), **kwargs).problem
    return {**kwargs, "kernel": forced_kernel(problem, call.force, notes)}


def _run(call: Call, notes: list[str]) -> dict[str, torch.Tensor]:
    fn = FUNCTIONS[call.direction]
    if not call.grad:
        kwargs = call.kwargs if call.force is None else _forced(call, notes)
        return {"result": fn(*call.args, **kwargs)}
    leaves = [t.requires_grad_() for t in call.args] + ([call.kwargs["bias"].requires_grad_()]
                                                         if call.kwargs.get("bias") is not None else [])
    y = fn(*call.args, **call.kwargs)
    y.backward(_grad_of(y).to(y.dtype).to(y.device))
    names = ("dx", "dw", "dbias")
    return {"result": y.detach(), **{name: t.grad for name, t in zip(names, leaves)}}


def _case(ident: str, call: Call, expect: Expect, argument=None, label="") -> Case:
    kw = call.kwargs
    out = kw.get("out") if isinstance(kw.get("out"), torch.Tensor) else None
    reads = {f"arg{i}": t for i, t in enumerate(call.args) if isinstance(t, torch.Tensor)}
    reads |= {name: kw[name] for name in ("bias", "residual") if isinstance(kw.get(name), torch.Tensor)}
    reads = {name: t for name, t in reads.items() if t is not out}
    u = roundoff(call.dtype, kw.get("allow_tf32") is True)
    tolerance = {"result": 4 * u, "dx": 8 * u, "dw": 8 * u, "dbias": 8 * u}
    notes: list[str] = []
    return Case(ident=ident, summary=f"{label} {call.describe()}".strip(), run=lambda: _run(call, notes),
                expect=expect, argument=argument, reference=lambda: reference(call), tolerance=tolerance,
                reads=reads, out=out, result_dtype=call.dtype, notes=notes,
                warmup=warmup_for(ident, lambda: _run(_twin(call), []), [*call.args, *kw.values()]))


def _twin(call: Call) -> Call:
    twins = {id(v): T.twin(v) for v in (*call.args, *call.kwargs.values())}  # one twin for a tensor given twice
    return replace(call, args=tuple(twins[id(a)] for a in call.args),
                   kwargs={key: twins[id(v)] for key, v in call.kwargs.items()})


def _make(direction: str, ident: str, rng: random.Random, gen: torch.Generator, mutate: bool) -> Case:
    call = draw(direction, rng, gen)
    if not mutate:
        return _case(ident, call, Expect.WORKS)
    call = replace(call, grad=False, force=None)
    argument, label, mutated, expect = pick(rng, mutations(call, rng, gen))
    return _case(ident, mutated, expect, argument, label)


def forward_case(ident, rng, gen, mutate):
    return _make("forward", ident, rng, gen, mutate)


def backward_data_case(ident, rng, gen, mutate):
    return _make("bwd_data", ident, rng, gen, mutate)


def backward_weight_case(ident, rng, gen, mutate):
    return _make("bwd_weight", ident, rng, gen, mutate)
