"""One argument of a valid attention call made bad (or legal in an unusual form), with what must follow.

Each mutation is (argument, label, the mutated call, Expect); "k/v" accepts either name.
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


def _without(call, *names):
    return replace(call, kwargs={k: v for k, v in call.kwargs.items() if k not in names})


def _tensor_mutations(call, rng, gen) -> list:
    out = []
    varlen = call.lengths is not None
    for index, name in enumerate("qkv"):
        shape = tuple(call.args[index].shape)
        for label, value in bad_tensors(shape, call.dtype, DEVICE, required=True):
            out.append((name, f"{name} {label}", _arg(call, index, value), Expect.RAISES))
    q, k, v = call.args
    dt = call.dtype
    if not varlen:
        out.append(("q", "q 3-D without cu_seqlens", _arg(call, 0, T.ramp(q.shape[1:], dt, DEVICE)), Expect.RAISES))
        heads = k.shape[1] + 1 if q.shape[1] % (k.shape[1] + 1) else k.shape[1] + 2
        other = (k.shape[0], heads, *k.shape[2:])
        out.append(("k/v", "k, v heads not dividing q's", replace(call, args=(q, T.ramp(other, dt, DEVICE),
                                                                             T.ramp(other, dt, DEVICE))),
                    Expect.RAISES))
        longer = (v.shape[0], v.shape[1], v.shape[2] + 1, v.shape[3])
        out.append(("v", "v with one more key than k", _arg(call, 2, T.ramp(longer, dt, DEVICE)), Expect.RAISES))
        out.append(("q", "q, k, v with seqlen_q = 0", _arg(_without(call, "bias", "mask"), 0, q[:, :, :0]),
                    Expect.EITHER))
    narrow = tuple(t[..., :16] for t in call.args)
    out.append(("q", "head dim 16", replace(call, args=narrow), Expect.RAISES))
    out.append(("k", "k with another head dim", _arg(call, 1, T.ramp((*k.shape[:-1], 64 if k.shape[-1] != 64 else 32),
                                                                      dt, DEVICE)), Expect.RAISES))
    if not varlen:
        same = replace(_without(call, "bias", "mask"), args=(q, q, q), shape=(*call.shape[:2], call.shape[1],
                                                                            *call.shape[3:4] * 2, call.shape[5]))
        out.append(("q", "q, k and v one tensor", same, Expect.WORKS))
    out.append(("v", "k is v", _arg(call, 2, k if k.shape[-1] == v.shape[-1] else v), Expect.WORKS))
    out.append(("v", "v of another dtype", _arg(call, 2, T.make(gen, tuple(v.shape), other_float(dt), DEVICE)),
                Expect.RAISES))
    other_dv = T.make(gen, (*v.shape[:-1], 64 if v.shape[-1] != 64 else 32), dt, DEVICE)
    out.append(("v", "v with another head dim than q and k", _arg(call, 2, other_dv), Expect.EITHER))
    if not varlen:
        huge = tuple(T.with_huge_stride(t[:1], 0) for t in call.args)
        out.append(("q", "a batch of 1 at stride 2**40", replace(_without(call, "bias", "mask", "alibi_slopes"),
                                                                 args=huge, shape=(1, *call.shape[1:])), Expect.WORKS))
    strided = T.make(gen, (*q.shape[:-1], 2 * q.shape[-1]), dt, DEVICE)[..., ::2]
    out.append(("q", "q with a head-dim stride of 2", _arg(call, 0, strided), Expect.EITHER))
    return out


def _option_mutations(call, rng, gen) -> list:
    plain = _without(call, "window")
    out = [("causal", f"causal={v!r}", _kw(call, causal=v), Expect.RAISES) for v in ("yes", 2, "bottom-right", 1.5)]
    out.append(("causal", "causal np.bool_(True)", _kw(plain, causal=np.bool_(True)), Expect.WORKS))
    no_causal = _without(call, "causal")
    for value in ((1,), "ab", (1.5, 0), (None, 0), 5, (1, 2, 3), ("a", 0)):
        out.append(("window", f"window={value!r}", _kw(no_causal, window=value), Expect.RAISES))
    out.append(("window", "window of NumPy ints", _kw(no_causal, window=T.np_int((3, 1))), Expect.WORKS))
    out.append(("window", "window=(2**70, 0)", _kw(no_causal, window=(2**70, 0)), Expect.EITHER))
    out.append(("window", "window=(-5, 0)", _kw(no_causal, window=(-5, 0)), Expect.EITHER))
    for value in (0, -1.0, math.nan, math.inf, "x", True, complex(1, 1)):
        out.append(("softcap", f"softcap={value!r}", _kw(call, softcap=value), Expect.RAISES))
    out.append(("softcap", "softcap np.float64", _kw(call, softcap=np.float64(20.0)), Expect.WORKS))
    for value in (math.nan, math.inf, "x", True, complex(1, 1)):
        out.append(("scale", f"scale={value!r}", _kw(call, scale=value), Expect.RAISES))
    out.append(("scale", "scale np.float32", _kw(call, scale=np.float32(0.25)), Expect.WORKS))
    out.append(("scale", "scale a 0-d tensor", _kw(call, scale=torch.tensor(0.3)), Expect.EITHER))
    out.append(("softcap", "softcap a 0-d tensor", _kw(call, softcap=torch.tensor(20.0)), Expect.EITHER))
    out.append(("window", "window of 0-d tensors", _kw(no_causal, window=(torch.tensor(3), torch.tensor(0))),
                Expect.EITHER))
    for value in (1.5, -0.1, math.nan, "0.1", True, 1.0):
        out.append(("dropout_p", f"dropout_p={value!r}", _kw(call, dropout_p=value), Expect.RAISES))
    if call.lengths is None:
        dropout = _kw(call, dropout_p=0.25)
        for value in ("abc", 1.5):
            out.append(("dropout_seed", f"dropout_seed={value!r}", _kw(dropout, dropout_seed=value), Expect.RAISES))
        out.append(("dropout_seed", "dropout_seed np.int64", _kw(dropout, dropout_seed=np.int64(7)), Expect.WORKS))
        out.append(("dropout_seed", "dropout_seed=2**70 (past 64 bits)", _kw(dropout, dropout_seed=2**70),
                    Expect.RAISES))
        for value in ("x", 1.5):
            out.append(("dropout_offset", f"dropout_offset={value!r}", _kw(dropout, dropout_seed=3,
                                                                          dropout_offset=value), Expect.RAISES))
    for name, values in (("return_lse", ("yes", 1, None)), ("deterministic", ("no", 1, None))):
        out += [(name, f"{name}={v!r}", _kw(call, **{name: v}), Expect.RAISES) for v in values]
    out.append(("return_lse", "return_lse np.bool_(True)", _kw(call, return_lse=np.bool_(True)), Expect.WORKS))
    return out


def _extra_tensor_mutations(call, rng, gen) -> list:
    b, hq, _, sq, skv, _ = call.shape
    dt = call.dtype
    out = []
    dtype_free = ("list", "str", "float", "complex", "meta", "0-d", "numpy")
    for name, shape, allowed in (("mask", (sq, skv), dtype_free + ("int32", "float64")),
                                 ("bias", (sq, skv), dtype_free + ("int32", "float64", "bool")),
                                 ("alibi_slopes", (hq,), dtype_free), ("sinks", (hq,), dtype_free)):
        if call.lengths is not None and name in ("mask", "bias"):
            continue
        for label, value in bad_tensors(shape, dt, DEVICE, required=False):
            if label in allowed and not (dt == torch.float32 and label == "float64" and name == "mask"):
                out.append((name, f"{name} {label}", _kw(call, **{name: value}), Expect.RAISES))
        wrong = (shape[0] + 1, *shape[1:])
        out.append((name, f"{name} of the wrong shape", _kw(call, **{name: T.ramp(wrong, torch.float32 if name in (
            "alibi_slopes", "sinks") else dt, DEVICE)}), Expect.RAISES))
    if call.lengths is None:
        cu = torch.tensor([0, sq], dtype=torch.int32, device=DEVICE)
        out.append(("cu_seqlens_k", "cu_seqlens_q alone", _kw(call, cu_seqlens_q=cu), Expect.RAISES))
    else:
        cu = call.kwargs["cu_seqlens_q"]
        out.append(("cu_seqlens_q", "cu_seqlens_q int64", _kw(call, cu_seqlens_q=cu.long()), Expect.WORKS))
        strided = torch.zeros(2 * len(cu), dtype=torch.int32, device=DEVICE)[::2]
        strided.copy_(cu)
        out.append(("cu_seqlens_q", "cu_seqlens_q a strided view", _kw(call, cu_seqlens_q=strided), Expect.WORKS))
        for label, value in (("list", cu.tolist()), ("float", cu.float()), ("decreasing", cu.flip(0)),
                             ("past the tokens", cu + 1), ("2-D", cu[None]), ("meta", cu.to("meta"))):
            out.append(("cu_seqlens_q", f"cu_seqlens_q {label}", _kw(call, cu_seqlens_q=value), Expect.RAISES))
    if call.kwargs.get("alibi_slopes") is not None:
        half = call.kwargs["alibi_slopes"].to(torch.float16)
        out.append(("alibi_slopes", "alibi_slopes fp16", _kw(call, alibi_slopes=half), Expect.EITHER))
    scale = torch.ones(1, dtype=torch.float32, device=DEVICE)
    out.append(("scale_q", "scale_q on 16/32-bit inputs", _kw(call, scale_q=scale), Expect.RAISES))
    return out


def _dispatch_mutations(call, rng, gen) -> list:
    other = torch.float32 if call.dtype != torch.float32 else torch.float16
    kernels = (123, 1.5, "no_such_kernel", kernel_of(OpKind.GEMM, call.dtype), kernel_of(OpKind.CONV, call.dtype),
               kernel_of(OpKind.ATTENTION, other))
    out = [("kernel", f"kernel={v!r}", _kw(call, kernel=v), Expect.RAISES) for v in kernels]
    # Mutated calls take no gradient: a backward kernel's name may wait for a backward to be checked.
    out += [("backward_kernel", f"backward_kernel={v!r}", _kw(call, backward_kernel=v),
             Expect.EITHER if isinstance(v, str) else Expect.RAISES) for v in kernels]
    out += [("dispatcher", f"dispatcher={v!r}", _kw(call, dispatcher=v), Expect.RAISES) for v in ("foo", 42)]
    return out


GROUPS = (_tensor_mutations, _option_mutations, _extra_tensor_mutations, _dispatch_mutations)


def mutations(call, rng, gen) -> list:
    return rng.choice(GROUPS)(call, rng, gen)
