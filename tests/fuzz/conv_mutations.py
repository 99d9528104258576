"""One argument of a valid conv call made bad (or legal in an unusual form), with what must follow.

Each mutation is (argument, label, the mutated call, Expect). The argument is what a
refusal's message must name; "input_size/dy" accepts either name.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from tiledispatch import OpKind

from . import tensors as T
from .cases import DEVICE, Expect, bad_tensors, kernel_of, other_float
from .cases import with_arg as _arg
from .cases import with_kwargs as _kw

ROLES = {"forward": ("x", "w"), "bwd_data": ("dy", "w"), "bwd_weight": ("x", "dy")}
SIZE_NAME = {"bwd_data": "input_size", "bwd_weight": "weight_size"}


def _tensor_mutations(call, rng, gen) -> list:
    out = []
    for index, role in enumerate(ROLES[call.direction]):
        shape = tuple(call.args[index].shape)
        for label, value in bad_tensors(shape, call.dtype, DEVICE, required=True):
            out.append((role, f"{role} {label}", _arg(call, index, value), Expect.RAISES))
        out.append((role, f"{role} 2-D", _arg(call, index, T.ramp(shape[:2], call.dtype, DEVICE)), Expect.RAISES))
        out.append((role, f"{role} 6-D", _arg(call, index, T.ramp((*shape, 1, 1, 1)[:6], call.dtype, DEVICE)),
                    Expect.RAISES))
    first = ROLES[call.direction][0]
    shape = tuple(call.args[0].shape)
    other = T.make(gen, tuple(call.args[1].shape), other_float(call.dtype), DEVICE)
    out.append((ROLES[call.direction][1], f"{ROLES[call.direction][1]} of another dtype", _arg(call, 1, other),
                Expect.RAISES))
    out.append(_huge_batch_stride(call, gen))
    if call.direction != "bwd_weight":
        wrong = (shape[0], shape[1] + 1, *shape[2:])  # a channel count no weight fits
        out.append((f"{first}/w", f"{first} with one more channel", _arg(call, 0, T.ramp(wrong, call.dtype, DEVICE)),
                    Expect.RAISES))
    empty = T.make(gen, (0, *shape[1:]), call.dtype, DEVICE)
    call = replace(call, kwargs={key: v for key, v in call.kwargs.items() if key not in ("out", "residual")})
    out.append((first, f"{first} with N = 0", _arg(call, 0, empty), Expect.EITHER))
    if call.direction == "bwd_weight":
        out[-1] = (first, "x and dy with N = 0", replace(call, args=(empty, call.args[1][:0], call.args[2])),
                   Expect.EITHER)
    elif call.direction == "bwd_data":
        size = call.args[2]
        size = (0, *list(size)[1:]) if len(size) == call.geometry.dims + 2 else size
        out[-1] = ("dy/input_size", "dy with N = 0", replace(call, args=(empty, call.args[1], size)), Expect.EITHER)
    return out


def _huge_batch_stride(call, gen):
    """A batch of one whose batch stride is 2**40: legal (a size-1 dim never moves a pointer)."""
    clean = {key: v for key, v in call.kwargs.items() if key not in ("out", "residual")}
    first, second = call.args[:2]
    args = {"forward": lambda: (T.with_huge_stride(first[:1], 0), second),
            "bwd_data": lambda: (T.with_huge_stride(first[:1], 0), second, call.geometry.spatial),
            "bwd_weight": lambda: (T.with_huge_stride(first[:1], 0), T.with_huge_stride(second[:1], 0),
                                   call.args[2])}[call.direction]()
    return (ROLES[call.direction][0], "a batch of 1 at stride 2**40", replace(call, args=args, kwargs=clean),
            Expect.WORKS)


def _scalar_mutations(call, rng, gen) -> list:
    g = call.geometry
    dims = g.dims
    out = []
    for name, bad in (("stride", (0, -1, 2.0, "2", True, None, 2**70, (1,) * (dims + 1), ("a",) * dims)),
                      ("padding", (-1, 1.5, "full", True, None, 2**40, 2**70, (0,) * (dims + 1))),
                      ("dilation", (0, -2, 1.5, "1", None, 2**70, (1,) * (dims + 1))),
                      ("groups", (0, -1, 2.0, True, "2", None, 2**70, (1, 1)))):
        for value in bad:
            out.append((name, f"{name}={value!r}", _kw(call, **{name: value}), Expect.RAISES))
    if call.direction == "forward":  # one output pixel a dim: a legal conv
        out.append(("stride", "stride=2**40", _kw(call, stride=2**40), Expect.EITHER))
    else:  # dy no longer has the output's size
        out.append(("stride/dy", "stride=2**40", _kw(call, stride=2**40), Expect.RAISES))
    out.append(("stride", "stride of NumPy ints", _kw(call, stride=T.np_int(g.stride)), Expect.WORKS))
    out.append(("padding", "padding np.int64", _kw(call, padding=T.np_int(g.padding)), Expect.WORKS))
    out.append(("dilation", "dilation np.int64", _kw(call, dilation=T.np_int(g.dilation)), Expect.WORKS))
    out.append(("stride", "stride a 0-d tensor", _kw(call, stride=torch.tensor(g.stride[0]))
                if len(set(g.stride)) == 1 else _kw(call, stride=tuple(torch.tensor(s) for s in g.stride)),
                Expect.EITHER))
    out.append(("groups", "groups a 0-d tensor", _kw(call, groups=torch.tensor(g.groups)), Expect.EITHER))
    if call.direction == "forward":  # another output size: no residual or out of the old one
        shapeless = replace(call, kwargs={k: v for k, v in call.kwargs.items() if k not in ("residual", "out")})
        fits = all(d * (f - 1) + 1 <= n for d, f, n in zip(g.dilation, g.filt, g.spatial))
        out.append(("padding" if fits else "padding/x/w", "padding='valid'", _kw(shapeless, padding="valid"),
                    Expect.EITHER if fits else Expect.RAISES))  # unpadded, a filter past the input has no output
        if set(g.stride) == {1}:
            out.append(("padding", "padding='same'", _kw(shapeless, padding="same"), Expect.EITHER))
    out.append(("groups", "groups np.int64", _kw(call, groups=np.int64(g.groups)), Expect.WORKS))
    wrong = next(v for v in range(2, 40) if g.c % v or g.k % v)
    out.append(("groups", f"groups={wrong} not dividing C={g.c}, K={g.k}", _kw(call, groups=wrong), Expect.RAISES))
    for value in ("yes", 1, None):
        out.append(("allow_tf32", f"allow_tf32={value!r}", _kw(call, allow_tf32=value), Expect.RAISES))
    out.append(("allow_tf32", "allow_tf32 np.bool_(False)", _kw(call, allow_tf32=np.bool_(False)), Expect.WORKS))
    if call.dtype != torch.float32:
        out.append(("allow_tf32", "allow_tf32=True on 16-bit", _kw(call, allow_tf32=True), Expect.RAISES))
    other = torch.float32 if call.dtype != torch.float32 else torch.float16
    kernels = (123, 1.5, "no_such_kernel", kernel_of(OpKind.GEMM, call.dtype), kernel_of(OpKind.ATTENTION, call.dtype),
               kernel_of(OpKind.CONV, other))
    out += [("kernel", f"kernel={v!r}", _kw(call, kernel=v), Expect.RAISES) for v in kernels]
    out += [("dispatcher", f"dispatcher={v!r}", _kw(call, dispatcher=v), Expect.RAISES) for v in ("foo", 42)]
    return out


def _epilogue_mutations(call, rng, gen) -> list:
    if call.direction != "forward":
        return [(name, f"{name} on {call.direction}", _kw(call, **{name: value}), Expect.RAISES)
                for name, value in (("bias", T.ramp((call.geometry.k,), call.dtype, DEVICE)), ("activation", "relu"))]
    g, dt = call.geometry, call.dtype
    out = []
    for label, value in bad_tensors((g.k,), dt, DEVICE, required=False):
        out.append(("bias", f"bias {label}", _kw(call, bias=value), Expect.RAISES))
    out.append(("bias", "bias (K+1,)", _kw(call, bias=T.ramp((g.k + 1,), dt, DEVICE)), Expect.RAISES))
    for value in ("foo", 3, True):
        out.append(("activation", f"activation={value!r}", _kw(call, activation=value), Expect.RAISES))
    for label, value in bad_tensors(g.y_shape, dt, DEVICE, required=False):
        out.append(("residual", f"residual {label}", _kw(call, residual=value), Expect.RAISES))
    bigger = (g.n, g.k + 1, *g.out_spatial)
    out.append(("residual", "residual of the wrong shape", _kw(call, residual=T.ramp(bigger, dt, DEVICE)),
                Expect.RAISES))
    return out


def _channels_last_pair(shape_a, shape_b, dt, gen, shift, separate):
    """Two channels-last tensors over one buffer, the second `shift` elements after the first."""
    perm = (0, *range(2, len(shape_a)), 1)
    back = [perm.index(i) for i in range(len(shape_a))]
    a, b = T.buffer_views(tuple(shape_a[p] for p in perm), tuple(shape_b[p] for p in perm), dt, DEVICE, gen,
                          shift=shift, separate=separate)
    return a.permute(back), b.permute(back)


def _out_mutations(call, rng, gen) -> list:
    g, dt = call.geometry, call.dtype
    shape = {"forward": g.y_shape, "bwd_data": g.x_shape, "bwd_weight": g.w_shape}[call.direction]
    clean = {key: v for key, v in call.kwargs.items() if key not in ("out", "residual")}
    plain = replace(call, kwargs=clean)
    out = []
    for label, value in bad_tensors(shape, dt, DEVICE, required=False):
        out.append(("out", f"out {label}", _kw(plain, out=value), Expect.RAISES))
    out.append(("out", "out of the wrong shape", _kw(plain, out=T.ramp((*shape[:-1], shape[-1] + 1), dt, DEVICE)),
                Expect.RAISES))
    out.append(("out", "out broadcast (stride 0)", _kw(plain, out=torch.zeros(1, dtype=dt, device=DEVICE).expand(
        shape)), Expect.RAISES))
    out.append(("out", "out a negated view", _kw(plain, out=torch._neg_view(T.make(gen, shape, dt, DEVICE))),
                Expect.RAISES))
    out.append(("out", "out contiguous (not channels-last)", _kw(plain, out=torch.full(
        shape, math.nan, dtype=dt, device=DEVICE)), Expect.EITHER))
    first, role = tuple(call.args[0].shape), ROLES[call.direction][0]
    count = math.prod(first)
    for separate in (False, True):
        how = "from_numpy/dlpack" if separate else "slices"
        src, o = _channels_last_pair(first, shape, dt, gen, rng.randrange(count), separate)
        out.append(("out", f"out overlapping {role} ({how})", replace(_arg(plain, 0, src), kwargs={**clean, "out": o}),
                    Expect.RAISES))
        src, o = _channels_last_pair(first, shape, dt, gen, count, separate)
        out.append(("out", f"out disjoint from {role} in one buffer ({how})",
                    replace(_arg(plain, 0, src), kwargs={**clean, "out": o}), Expect.WORKS))
    if call.direction == "forward":
        second = tuple(call.args[1].shape)
        w, o = _channels_last_pair(second, shape, dt, gen, rng.randrange(math.prod(second)), rng.random() < 0.5)
        out.append(("out", "out overlapping w", replace(_arg(plain, 1, w), kwargs={**clean, "out": o}), Expect.RAISES))
        bias, o = _channels_last_pair((g.k, 1, 1), shape, dt, gen, rng.randrange(g.k), False)
        out.append(("out/bias", "out overlapping bias", _kw(plain, out=o, bias=bias.reshape(g.k)), Expect.RAISES))
        x, res = _channels_last_pair(first, shape, dt, gen, rng.randrange(count), False)
        out.append(("residual", "residual sharing memory with x (both read)",
                    replace(_arg(plain, 0, x), kwargs={**clean, "residual": res}), Expect.WORKS))
        o, res = _channels_last_pair(shape, shape, dt, gen, 1, False)
        out.append(("residual", "residual shifted one element from out", _kw(plain, out=o, residual=res),
                    Expect.RAISES))
        res = _channels_last_pair(shape, shape, dt, gen, 0, False)[0]
        out.append(("residual", "residual is out (in place)", _kw(plain, out=res, residual=res), Expect.WORKS))
    return out


def _size_mutations(call, rng, gen) -> list:
    if call.direction == "forward":
        return []
    name, g = SIZE_NAME[call.direction], call.geometry
    full = g.x_shape if call.direction == "bwd_data" else g.w_shape
    spatial = full[2:]
    label = f"{name}/{'dy' if call.direction == 'bwd_data' else 'x'}"
    bad = (None, "abc", 5.0, tuple(float(v) for v in spatial), (2**70,) * g.dims, (-1,) * g.dims,
           (0,) * g.dims, tuple(spatial) + (1,), (1.5, "a"), (full[0] + 1, *full[1:]))
    out = [(name, f"{name}={v!r}", _arg(call, 2, v), Expect.RAISES) for v in bad]
    if call.direction == "bwd_data":
        grown = tuple(s + g.stride[i] for i, s in enumerate(spatial))  # another output size than dy's
        out.append((label, f"{name} disagreeing with dy", _arg(call, 2, grown), Expect.RAISES))
    out.append((name, f"{name} of NumPy ints", _arg(call, 2, T.np_int(full)), Expect.WORKS))
    out.append((name, f"{name} as torch.Size", _arg(call, 2, torch.Size(full)), Expect.WORKS))
    out.append((name, f"{name} as an int64 tensor", _arg(call, 2, torch.tensor(full)), Expect.EITHER))
    return out


GROUPS = (_tensor_mutations, _scalar_mutations, _epilogue_mutations, _out_mutations, _size_mutations)


def mutations(call, rng, gen) -> list:
    group = rng.choice(GROUPS[:-1] if call.direction == "forward" else GROUPS)
    return group(call, rng, gen)
