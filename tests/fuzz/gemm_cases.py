"""Fuzz cases of `tiledispatch.gemm`: valid calls over ranks, shapes, dtypes, layouts and epilogues,
and calls with one argument made bad."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import OpKind

from . import tensors as T
from tiledispatch.ops.gemm import check_operands

from .cases import (
    DEVICE, DTYPES, Case, Expect, bad_tensors, describe_value, forced_kernel, kernel_of, pick, roundoff,
    some_dispatcher, warmup_for,
)

_ACTIVATIONS = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}


@dataclass(frozen=True)
class Call:
    """A gemm call and the facts about it that mutations need."""

    args: tuple
    kwargs: dict
    dtype: torch.dtype
    out_dtype: torch.dtype
    shape: tuple[int, int, int, int]  # batch, m, n, k
    ranks: tuple[int, int]  # a's and b's
    force: int | None = None  # picks a kernel the dispatcher accepts, passed as kernel=

    @property
    def result_shape(self) -> tuple[int, ...]:
        batch, m, n, _ = self.shape
        return (m, n) if self.ranks == (2, 2) else (batch, m, n)

    def describe(self) -> str:
        a, b = self.args
        parts = [f"a={describe_value(a)}", f"b={describe_value(b)}"]
        parts += [f"{key}={describe_value(v)}" for key, v in self.kwargs.items() if v is not None]
        return " ".join(parts)


def _operand(rng, gen, shape, dtype):
    layout = T.random_layout(rng, len(shape))
    return T.make(gen, shape, dtype, DEVICE, layout), layout


def draw(rng: random.Random, gen: torch.Generator) -> Call:
    """A valid call: 2-D or 3-D operands (a batch of 1 broadcasts), any layout, an epilogue."""
    dtype = rng.choice(DTYPES)
    batch, m, n, k = rng.randint(1, 3), rng.randint(1, 48), rng.randint(1, 48), rng.randint(1, 48)
    ranks = rng.choice([(2, 2), (2, 2), (3, 3), (3, 2), (2, 3)])
    batch = 1 if ranks == (2, 2) else batch
    a_shape = (m, k) if ranks[0] == 2 else (1 if ranks[1] == 3 and rng.random() < 0.2 else batch, m, k)
    b_shape = (k, n) if ranks[1] == 2 else (batch, k, n)
    a, _ = _operand(rng, gen, a_shape, dtype)
    b, _ = _operand(rng, gen, b_shape, dtype)
    out_dtype = torch.float32 if dtype != torch.float32 and rng.random() < 0.2 else dtype
    kwargs: dict = {}
    if out_dtype != dtype:
        kwargs["out_dtype"] = rng.choice([out_dtype, "fp32"])
    result = (m, n) if ranks == (2, 2) else (batch, m, n)
    if rng.random() < 0.3:
        kwargs["bias"] = T.make(gen, (n,), out_dtype, DEVICE, T.random_layout(rng, 1))
    if rng.random() < 0.5:
        kwargs["activation"] = rng.choice([None, "none", "relu", "gelu", "silu", "RELU"])
    in_place = rng.random() < 0.12
    if in_place or rng.random() < 0.3:
        res_shape = result if in_place or rng.random() < 0.7 else (m, n)
        layout = T.random_layout(rng, len(res_shape), written=in_place)
        kwargs["residual"] = T.make(gen, res_shape, out_dtype, DEVICE, layout)
    if in_place:
        kwargs["out"] = kwargs["residual"]  # out = a @ b + out
    elif rng.random() < 0.4:
        layout = T.random_layout(rng, len(result), written=True)
        kwargs["out"] = T.make(gen, result, out_dtype, DEVICE, layout, fill=float("nan"))
    if dtype == torch.float32 and rng.random() < 0.2:
        kwargs["allow_tf32"] = True
    force = rng.getrandbits(30) if rng.random() < 0.1 else None
    kwargs |= some_dispatcher(rng, OpKind.GEMM)
    return Call((a, b), kwargs, dtype, out_dtype, (batch, m, n, k), ranks, force)


def reference(call: Call) -> dict[str, torch.Tensor]:
    a, b = call.args
    kw = call.kwargs
    result = T.f64(a) @ T.f64(b)
    if kw.get("bias") is not None:
        result = result + T.f64(kw["bias"])
    activation = kw.get("activation")
    result = _ACTIVATIONS[(activation or "none").lower()](result)
    if kw.get("residual") is not None:
        result = result + T.f64(kw["residual"])
    out = kw.get("out")
    return {"result": result.reshape(out.shape) if isinstance(out, torch.Tensor) else result}


def _case(ident, call: Call, expect: Expect, argument=None, label="") -> Case:
    a, b = call.args
    kwargs = call.kwargs
    reads = {"a": a, "b": b, **{name: kwargs[name] for name in ("bias", "residual")
                               if isinstance(kwargs.get(name), torch.Tensor)}}
    out = kwargs.get("out") if isinstance(kwargs.get("out"), torch.Tensor) else None
    if out is not None:
        reads = {name: t for name, t in reads.items() if t is not out}  # in place: out is written
    tf32 = kwargs.get("allow_tf32") is True
    notes: list[str] = []
    return Case(
        ident=ident, summary=f"{label} {call.describe()}".strip(), run=lambda: _run(call, notes),
        expect=expect, argument=argument, reference=lambda: reference(call),
        tolerance={"result": 4 * roundoff(call.out_dtype, tf32)}, reads=reads, out=out,
        result_dtype=call.out_dtype, notes=notes,
        warmup=warmup_for(ident, lambda: _run(_twin(call), []), [*call.args, *kwargs.values()]),
    )


def _twin(call: Call) -> Call:
    twins = {id(v): T.twin(v) for v in (*call.args, *call.kwargs.values())}  # one twin for a tensor given twice
    return replace(call, args=tuple(twins[id(a)] for a in call.args),
                   kwargs={key: twins[id(v)] for key, v in call.kwargs.items()})


def _run(call: Call, notes: list[str]) -> dict[str, torch.Tensor]:
    kwargs = call.kwargs
    if call.force is not None:  # a kernel the dispatcher would accept, forced by name
        kwargs = {key: v for key, v in kwargs.items() if key != "dispatcher"}  # the default one's kernels
        problem = check_operands(*call.args, **kwargs).problem
        kwargs["kernel"] = forced_kernel(problem, call.force, notes)
    return {"result": tiledispatch.gemm(*call.args, **kwargs)}


# -- mutations ------------------------------------------------------------------------------------
def _kw(call: Call, **changes) -> Call:
    return replace(call, kwargs={**call.kwargs, **changes})


def _operand_mutations(call: Call, rng, gen) -> list:
    a, b = call.args
    batch, m, n, k = call.shape
    out = []
    for index, name in ((0, "a"), (1, "b")):
        shape = tuple(call.args[index].shape)
        for label, value in bad_tensors(shape, call.dtype, DEVICE, required=True):
            args = list(call.args)
            args[index] = value
            out.append((name, f"{name} {label}", replace(call, args=tuple(args)), Expect.RAISES))
    out.append(("a", "a 1-D", replace(call, args=(T.ramp((k,), call.dtype, DEVICE), b)), Expect.RAISES))
    out.append(("a", "a 4-D", replace(call, args=(T.ramp((1, 1, m, k), call.dtype, DEVICE), b)), Expect.RAISES))
    out.append(("b", "b K+1", replace(call, args=(a, T.ramp((*b.shape[:-2], k + 1, n), call.dtype, DEVICE))),
                Expect.RAISES))
    other = torch.float32 if call.dtype != torch.float32 else torch.float16
    out.append(("b", "b of another dtype", replace(call, args=(a, b.to(other))), Expect.RAISES))
    plain = replace(call, kwargs={key: v for key, v in call.kwargs.items() if key not in ("bias", "residual", "out")})
    out.append(("a", "a with M = 0", replace(plain, args=(a[..., :0, :], b)), Expect.EITHER))
    square = T.make(gen, (k, k), call.dtype, DEVICE, T.random_layout(rng, 2))
    out.append(("a", "a is b (one square tensor)", replace(plain, args=(square, square), shape=(1, k, k, k),
                                                           ranks=(2, 2)), Expect.WORKS))
    three = T.with_huge_stride(T.make(gen, (1, m, k), call.dtype, DEVICE), 0)
    out.append(("a", "a with a batch of 1 at stride 2**40", replace(plain, args=(three, b), ranks=(3, call.ranks[1]),
                                                                  shape=(call.shape[0] if call.ranks[1] == 3 else 1,
                                                                         m, n, k)), Expect.WORKS))
    a2, res = T.buffer_views((m, k), (m, n), call.dtype, DEVICE, gen, shift=rng.randrange(m * k), separate=False)
    if call.out_dtype == call.dtype:
        out.append(("residual", "residual sharing memory with a (both read)",
                    replace(plain, args=(a2, b), kwargs={**plain.kwargs, "residual": res}), Expect.WORKS))
    return out


def _epilogue_mutations(call: Call, rng, gen) -> list:
    batch, m, n, k = call.shape
    dt = call.out_dtype
    out = []
    for label, value in bad_tensors((n,), dt, DEVICE, required=False):
        out.append(("bias", f"bias {label}", _kw(call, bias=value), Expect.RAISES))
    out.append(("bias", "bias (n+1,)", _kw(call, bias=T.ramp((n + 1,), dt, DEVICE)), Expect.RAISES))
    out.append(("bias", "bias 2-D", _kw(call, bias=T.ramp((m + 1, n), dt, DEVICE)), Expect.RAISES))
    for value in ("foo", 3, True, 1.5):
        out.append(("activation", f"activation {value!r}", _kw(call, activation=value), Expect.RAISES))
    for label, value in bad_tensors((m, n), dt, DEVICE, required=False):
        out.append(("residual", f"residual {label}", _kw(call, residual=value), Expect.RAISES))
    out.append(("residual", "residual (m+1, n)", _kw(call, residual=T.ramp((m + 1, n), dt, DEVICE)), Expect.RAISES))
    for value in ("foo", 123, torch.int32, torch.float64, torch.float8_e4m3fn):
        out.append(("out_dtype", f"out_dtype {value!r}", _kw(call, out_dtype=value), Expect.RAISES))
    for value in ("yes", 1, None, 1.0):
        out.append(("allow_tf32", f"allow_tf32 {value!r}", _kw(call, allow_tf32=value), Expect.RAISES))
    out.append(("allow_tf32", "allow_tf32 np.bool_(False)", _kw(call, allow_tf32=np.bool_(False)), Expect.WORKS))
    out.append(("scale_a", "scale_a 2.0 on non-fp8", _kw(call, scale_a=2.0), Expect.RAISES))
    return out


def _out_mutations(call: Call, rng, gen) -> list:
    batch, m, n, k = call.shape
    dt, shape = call.out_dtype, call.result_shape
    clean = {key: v for key, v in call.kwargs.items() if key not in ("out", "residual")}
    plain = replace(call, kwargs=clean)
    out = []
    for label, value in bad_tensors(shape, dt, DEVICE, required=False):
        out.append(("out", f"out {label}", _kw(plain, out=value), Expect.RAISES))
    out.append(("out", "out of the wrong shape", _kw(plain, out=T.ramp((m + 1, n), dt, DEVICE)), Expect.RAISES))
    out.append(("out", "out broadcast (stride 0)",
                _kw(plain, out=torch.zeros((1, n), dtype=dt, device=DEVICE).expand(*shape)), Expect.RAISES))
    neg = torch._neg_view(torch.zeros(shape, dtype=dt, device=DEVICE))
    out.append(("out", "out a negated view", _kw(plain, out=neg), Expect.RAISES))
    a_shape = tuple(call.args[0].shape)
    if dt == call.dtype:
        a_count = int(np.prod(a_shape))
        for separate in (False, True):
            shift = rng.randrange(max(a_count, 1))
            a, o = T.buffer_views(a_shape, shape, dt, DEVICE, gen, shift=shift, separate=separate)
            o.fill_(float("nan"))
            how = "from_numpy/dlpack" if separate else "slices"
            out.append(("out", f"out overlapping a ({how})", replace(plain, args=(a, call.args[1]),
                                                                     kwargs={**clean, "out": o}), Expect.RAISES))
            a, o = T.buffer_views(a_shape, shape, dt, DEVICE, gen, shift=a_count + 1, separate=separate)
            out.append(("out", f"out disjoint from a in one buffer ({how})",
                        replace(plain, args=(a, call.args[1]), kwargs={**clean, "out": o}), Expect.WORKS))
    b_shape = tuple(call.args[1].shape)
    if dt == call.dtype:
        b2, o = T.buffer_views(b_shape, shape, dt, DEVICE, gen, shift=rng.randrange(int(np.prod(b_shape))),
                               separate=rng.random() < 0.5)
        out.append(("out", "out overlapping b", replace(plain, args=(call.args[0], b2), kwargs={**clean, "out": o}),
                    Expect.RAISES))
    bias, o = T.buffer_views((n,), shape, dt, DEVICE, gen, shift=rng.randrange(n), separate=False)
    out.append(("out/bias", "out overlapping bias", _kw(plain, out=o, bias=bias), Expect.RAISES))
    if batch == 1 and len(shape) == 3:
        two_d = T.make(gen, (m, n), dt, DEVICE, fill=float("nan"))
        out.append(("out", "out 2-D for a batch of 1", _kw(plain, out=two_d), Expect.WORKS))
    o, res = T.buffer_views(shape, shape, dt, DEVICE, gen, shift=1, separate=False)
    out.append(("residual", "residual shifted one element from out", _kw(plain, out=o, residual=res),
                Expect.RAISES))
    res = T.make(gen, shape, dt, DEVICE)
    out.append(("residual", "residual is out (in place)", _kw(plain, out=res, residual=res), Expect.WORKS))
    return out


def _dispatch_mutations(call: Call, rng, gen) -> list:
    other = torch.float32 if call.dtype != torch.float32 else torch.float16
    kernels = (123, 1.5, "no_such_kernel", kernel_of(OpKind.CONV, call.dtype), kernel_of(OpKind.ATTENTION, call.dtype),
               kernel_of(OpKind.GEMM, other))
    out = [("kernel", f"kernel {describe_value(v)}", _kw(call, kernel=v), Expect.RAISES) for v in kernels]
    out += [("dispatcher", f"dispatcher {v!r}", _kw(call, dispatcher=v), Expect.RAISES) for v in ("foo", 42)]
    return out


GROUPS = (_operand_mutations, _epilogue_mutations, _out_mutations, _dispatch_mutations)


def make_case(ident: str, rng: random.Random, gen: torch.Generator, mutate: bool) -> Case:
    call = draw(rng, gen)
    if not mutate:
        return _case(ident, call, Expect.WORKS)
    group = rng.choice(GROUPS)
    argument, label, mutated, expect = pick(rng, group(call, rng, gen))
    return _case(ident, replace(mutated, force=None), expect, argument, label)
