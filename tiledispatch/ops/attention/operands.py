"""From user tensors to a checked AttentionProblem plus the views and scalars the kernels read.

This is the one place that inspects the caller's tensors: shapes, dtypes, devices and
strides. Everything downstream trusts what it returns. Each refusal names its rule in
brackets (``[heads-group]``) and says what would work.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch

from ...core.args import INT64_MAX
from ...core.dtypes import DType
from ...core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from ...core.tensors import check_plain
from .arguments import already_checked, checked_options
from .problem import (
    DTYPES,
    FP8_DTYPES,
    HEAD_DIMS,
    INT32_MAX,
    AttentionProblem,
    AttentionVariant,
    Direction,
    Layout,
    MaskKind,
    UserMask,
    Window,
    check_seqlen_limit,
)


@dataclass(frozen=True)
class AttentionOptions:
    """Everything of a call that is not a tensor, checked, typed and hashable."""

    causal: MaskKind = MaskKind.NONE  # NONE, CAUSAL_TOP_LEFT or CAUSAL_BOTTOM_RIGHT
    window: Window | None = None
    scale: float | None = None
    softcap: float | None = None
    dropout_p: float = 0.0
    dropout_seed: int = 0
    dropout_offset: int = 0
    needs_lse: bool = False
    deterministic: bool = False

    def __post_init__(self) -> None:
        # Every field checked and normalised here (a window pair becomes a Window, a NumPy
        # float a float), so that options built by hand are held to the rules of attention().
        given = (self.causal, self.window, self.scale, self.softcap, self.dropout_p, self.dropout_seed,
                 self.dropout_offset, self.needs_lse, self.deterministic)
        if already_checked(*given):
            return
        for name, value in checked_options(*given).items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class AttentionOperands:
    problem: AttentionProblem
    q: torch.Tensor  # (batch, heads_q, seqlen_q, d_qk), or (tokens, heads_q, d_qk) for varlen
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor | None  # (batch, heads_q, seqlen_q, seqlen_kv) view, broadcast dims of stride 0
    mask: torch.Tensor | None  # the same shape; uint8 for a boolean mask
    alibi_slopes: torch.Tensor | None  # (batch, heads_q) fp32 view
    sinks: torch.Tensor | None  # (heads_q,) fp32
    cu_seqlens_q: torch.Tensor | None  # (batch + 1,) int32
    cu_seqlens_k: torch.Tensor | None
    scale: float
    softcap: float
    dropout_p: float
    dropout_seed: int
    dropout_offset: int
    # backward only: the forward's output and LSE, and the gradient of the output
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    grad_out: torch.Tensor | None = None
    # fp8 inputs only: per-tensor dequantization scales, one fp32 element each (q's true values
    # are q * scale_q), read by the kernel so they may change between calls without a sync
    scale_q: torch.Tensor | None = None
    scale_k: torch.Tensor | None = None
    scale_v: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.q.device


def _fail(rule: str, message: str) -> InvalidProblemError:
    return InvalidProblemError(f"[{rule}] {message}")


def _shape(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape))


def _aligned(*tensors: torch.Tensor | None) -> bool:
    """16-byte aligned bases and every stride of a non-unit dim a multiple of 16 elements."""
    for t in tensors:
        if t is None:
            continue
        if t.data_ptr() % 16 or any(s % 16 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n != 1):
            return False
    return True


def _layout(q: torch.Tensor, varlen: bool) -> Layout:
    if varlen:
        return Layout.THD
    return Layout.BSHD if q.shape[1] > 1 and q.shape[2] > 1 and q.stride(1) < q.stride(2) else Layout.BHSD


def _broadcast_4d(t: torch.Tensor, shape: tuple[int, int, int, int], what: str) -> torch.Tensor:
    """`t` viewed as `shape` with stride 0 on broadcast dims; never copied (the kernels take any strides)."""
    if t.dim() > 4 or t.dim() < 2:
        raise _fail(f"{what}-shape", f"{what} must have 2 to 4 dims broadcastable to {shape}, got {_shape(t)}")
    try:
        view = t.expand(shape) if t.dim() == 4 else t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).expand(shape)
    except RuntimeError:
        raise _fail(f"{what}-shape", f"{what} of shape {_shape(t)} does not broadcast to (batch, heads_q, seqlen_q, "
                    f"seqlen_kv) = {shape}") from None
    return view


# What the kernels read of the optional tensors, derived the same way by `check_operands` and
# by the fast path's replay (fastpath.py), which skips the checks these follow.
def view_mask(mask: torch.Tensor, full: tuple[int, int, int, int]) -> torch.Tensor:
    """A bool mask as uint8 (the kernels load bytes), either mask broadcast to `full`."""
    return _broadcast_4d(mask.view(torch.uint8) if mask.dtype == torch.bool else mask, full, "mask")


def view_bias(bias: torch.Tensor, full: tuple[int, int, int, int]) -> torch.Tensor:
    return _broadcast_4d(bias, full, "bias")


def view_slopes(alibi_slopes: torch.Tensor, batch: int, heads_q: int) -> torch.Tensor:
    return alibi_slopes.to(torch.float32).expand(batch, heads_q)


def sinks_fp32(sinks: torch.Tensor) -> torch.Tensor:
    return sinks.detach().to(torch.float32).contiguous()


def _check_qkv(q, k, v, varlen: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InvalidProblemError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        want = 3 if varlen else 4
        if t.dim() != want:
            form = "(tokens, heads, head_dim) with cu_seqlens" if varlen else "(batch, heads, seqlen, head_dim)"
            raise _fail("rank", f"{name} must be {want}-D {form}, got shape {_shape(t)}")
        if t.device != q.device:
            raise InvalidProblemError(f"{name} is on {t.device} but q is on {q.device}; put every tensor on one device")
        if t.dtype != q.dtype:
            raise _fail("dtype", f"q is {q.dtype} but {name} is {t.dtype}; q, k and v must share one dtype")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise _fail("head-dim-stride", f"{name}'s head dim must be contiguous (stride 1), got strides "
                        f"{tuple(t.stride())}; call .contiguous()")
        if 0 in t.shape:
            raise _fail("empty", f"{name} has shape {_shape(t)}: zero-size dims are not an attention")


def _cu_seqlens(cu: Any, tokens: int, device, what: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
        raise _fail("varlen", f"{what} must be a 1-D int32 tensor of batch + 1 cumulative offsets, got "
                    f"{_shape(cu) if isinstance(cu, torch.Tensor) else type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise _fail("varlen", f"{what} must be int32 (or int64), got {cu.dtype}")
    cu = check_plain(cu, what)  # the kernels read its memory; the checks below read its values
    values = cu.detach().cpu().tolist()
    lengths = tuple(b - a for a, b in itertools.pairwise(values))
    if values[0] != 0 or any(n < 0 for n in lengths) or values[-1] > min(tokens, INT32_MAX):
        shown = values if len(values) <= 8 else [*values[:4], "...", *values[-2:]]
        raise _fail("varlen", f"{what}={shown} must start at 0, never decrease, and end at most at the "
                    f"{tokens} tokens given (and below 2**31: the kernels read int32 offsets)")
    return cu.to(device=device, dtype=torch.int32).contiguous(), lengths


def _fp8_scales(q, dtype: DType | None, scales: dict) -> dict:
    """The dequantization scales of fp8 inputs as one-element fp32 tensors on q's device (None: 1)."""
    given = {name: t for name, t in scales.items() if t is not None}
    if dtype not in FP8_DTYPES:
        if given:
            raise _fail("fp8-scales", f"{', '.join(given)} apply to fp8 inputs only; q is {q.dtype}")
        return {name: None for name in scales}
    out = {}
    for name, t in scales.items():
        if t is None:
            t = torch.ones(1, dtype=torch.float32, device=q.device)
        if not isinstance(t, torch.Tensor) or t.numel() != 1 or t.dtype != torch.float32:
            raise _fail("fp8-scales", f"{name} must be a one-element float32 tensor (a per-tensor scale), got "
                        f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}"
                        f"{' of shape ' + _shape(t) if isinstance(t, torch.Tensor) else ''}")
        if t.device != q.device:
            raise InvalidProblemError(f"{name} is on {t.device} but q is on {q.device}; put every tensor on one device")
        out[name] = check_plain(t, name).reshape(1)
    return out


def _check_fp8_features(options: AttentionOptions, mask, bias, alibi_slopes, varlen: bool,
                        direction: Direction, head_dims: tuple[int, int]) -> None:
    """fp8 runs in the tensor-descriptor forward: bands, soft-cap, sinks and GQA, no gradients,
    whole power-of-two head dims."""
    if direction is not Direction.FORWARD:
        raise _fail("fp8-forward", "fp8 attention is forward only (inference); train in bf16")
    if any(d & (d - 1) for d in head_dims):
        raise _fail("fp8-head-dim", f"fp8 attention takes head dims 32, 64, 128 and 256 (its kernel loads whole "
                    f"head dims by tensor descriptors), not {head_dims[0]}/{head_dims[1]}; pad to the next one")
    extras = [what for what, on in (("a mask tensor", mask is not None), ("a bias", bias is not None),
                                    ("ALiBi", alibi_slopes is not None), ("dropout", options.dropout_p > 0),
                                    ("varlen", varlen)) if on]
    if extras:
        raise _fail("fp8-features", f"fp8 attention takes causal masks, windows, soft-cap, sinks and GQA, not "
                    f"{', '.join(extras)}; use bf16 inputs for those")


def _check_types(given: dict[str, Any]) -> None:
    """mask, bias, alibi_slopes and sinks are tensors or None: checked before anything reads them."""
    for name, t in given.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"{name} must be a torch.Tensor {_FORMS[name]}, or None; got "
                                       f"{type(t).__name__}")


def _optional_tensors(given: dict[str, Any]) -> dict[str, torch.Tensor | None]:
    """The checked tensors of `_check_types`: negated views resolved, slopes and sinks real floats."""
    out = {}
    for name, t in given.items():
        if t is not None and name in _FLOAT_ONLY and not t.dtype.is_floating_point:
            raise _fail(f"{name.replace('_', '-')}-dtype", f"{name} is {t.dtype}; it must have a real floating "
                        f"dtype (the kernels read it as float32: pass {name}.float())")
        out[name] = check_plain(t, name)
    return out


_FORMS = {"mask": "broadcastable to (batch, heads_q, seqlen_q, seqlen_kv), bool or q's dtype",
          "bias": "broadcastable to (batch, heads_q, seqlen_q, seqlen_kv), of q's dtype",
          "alibi_slopes": "of shape (heads_q,) or (batch, heads_q), float32",
          "sinks": "of shape (heads_q,), float (one logit per query head)"}
_FLOAT_ONLY = ("alibi_slopes", "sinks")  # read as fp32: ints would be a guess, complex would lose a part


def _sequences(q, k, v, cu_seqlens_q, cu_seqlens_k, varlen: bool) -> tuple:
    """(batch, seqlen_q, seqlen_kv, seqlens, cu_q, cu_k), the lengths within what the kernels index."""
    if not varlen:
        batch, seqlen_q, seqlen_kv = q.shape[0], q.shape[2], k.shape[2]
        if k.shape[0] != batch or v.shape[0] != batch:
            raise _fail("batch-match", f"q, k, v batch sizes differ: {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
        if v.shape[2] != seqlen_kv:
            raise _fail("seqlen-match", f"k has {seqlen_kv} keys but v has {v.shape[2]}")
        check_seqlen_limit(seqlen_q, seqlen_kv)
        return batch, seqlen_q, seqlen_kv, (), None, None
    if k.shape[0] != v.shape[0]:
        raise _fail("seqlen-match", f"k has {k.shape[0]} tokens but v has {v.shape[0]}")
    cu_q, lengths_q = _cu_seqlens(cu_seqlens_q, q.shape[0], q.device, "cu_seqlens_q")
    cu_k, lengths_k = _cu_seqlens(cu_seqlens_k, k.shape[0], q.device, "cu_seqlens_k")
    if len(lengths_q) != len(lengths_k):
        raise _fail("varlen", f"cu_seqlens_q describes {len(lengths_q)} sequences, cu_seqlens_k {len(lengths_k)}")
    if min(lengths_q) < 1 or min(lengths_k) < 1:
        raise _fail("varlen", "every sequence needs at least one query and one key token")
    check_seqlen_limit(max(lengths_q), max(lengths_k))
    return len(lengths_q), max(lengths_q), max(lengths_k), tuple(zip(lengths_q, lengths_k)), cu_q, cu_k


def _features(q, full: tuple[int, int, int, int], varlen: bool, t: dict) -> tuple:
    """(user mask kind, mask view, bias view, slopes, sinks as fp32) from the checked optional tensors."""
    batch, heads_q = full[0], full[1]
    mask, bias, alibi_slopes, sinks = t["mask"], t["bias"], t["alibi_slopes"], t["sinks"]
    for name, tensor in t.items():
        if tensor is not None and tensor.device != q.device:
            raise InvalidProblemError(f"{name} is on {tensor.device} but q is on {q.device}; put every tensor on "
                                      "one device")
    user_mask, mask_view = UserMask.NONE, None
    if mask is not None:
        if varlen:
            raise _fail("varlen-features", "a mask tensor needs a fixed-length batch; varlen takes causal/window masks")
        if mask.dtype not in (torch.bool, q.dtype):
            raise _fail("mask-dtype", f"mask is {mask.dtype}; use torch.bool (True: attend) or q's dtype {q.dtype} "
                        "(added to the scores)")
        user_mask = UserMask.BOOLEAN if mask.dtype == torch.bool else UserMask.ADDITIVE
        mask_view = view_mask(mask, full)
    bias_view = None
    if bias is not None:
        if varlen:
            raise _fail("varlen-features", "a bias tensor needs a fixed-length batch; varlen takes ALiBi slopes")
        if bias.dtype != q.dtype:
            raise _fail("bias-dtype", f"bias is {bias.dtype}; it must be q's dtype {q.dtype} (bias.to(q.dtype))")
        bias_view = view_bias(bias, full)
    slopes = None
    if alibi_slopes is not None:
        if alibi_slopes.shape not in ((heads_q,), (batch, heads_q)):
            raise _fail("alibi-shape", f"alibi_slopes must be ({heads_q},) or ({batch}, {heads_q}), got "
                        f"{_shape(alibi_slopes)}")
        slopes = view_slopes(alibi_slopes, batch, heads_q)
    sinks32 = None
    if sinks is not None:
        if sinks.shape != (heads_q,):
            raise _fail("sinks-shape", f"sinks must be ({heads_q},): one logit per query head, got {_shape(sinks)}")
        sinks32 = sinks_fp32(sinks)
    return user_mask, mask_view, bias_view, slopes, sinks32


def _position_mask(o: AttentionOptions, seqlen_q: int, seqlen_kv: int, varlen: bool) -> tuple[MaskKind, Window]:
    if o.causal is not MaskKind.NONE and o.window is not None:
        # A causal sliding window: the window, its right side closed at the diagonal.
        mask_kind, window = MaskKind.SLIDING_WINDOW, Window(o.window.left, 0)
        if o.causal is MaskKind.CAUSAL_TOP_LEFT and seqlen_q != seqlen_kv and not varlen:
            raise _fail("window-alignment", "a sliding window is aligned bottom-right; with seqlen_q != seqlen_kv "
                        "combine it with causal='bottom_right'")
    elif o.window is not None:
        mask_kind, window = MaskKind.SLIDING_WINDOW, o.window
    else:
        mask_kind, window = o.causal, Window()
    if mask_kind is MaskKind.SLIDING_WINDOW and window == Window():
        mask_kind = MaskKind.NONE  # (-1, -1): unbounded on both sides
    return mask_kind, window


def _check_dropout_counters(o: AttentionOptions, full: tuple[int, int, int, int]) -> None:
    """Dropout numbers each (batch * heads_q + head, i, j) by a 64-bit Philox counter from
    `dropout_offset`, its (batch, head) index in 32 bits: all of them must fit."""
    if o.dropout_p == 0:
        return
    batch, heads_q, seqlen_q, seqlen_kv = full
    pairs = batch * heads_q * seqlen_q * seqlen_kv
    if batch * heads_q > INT32_MAX or o.dropout_offset + pairs - 1 > INT64_MAX:
        raise _fail("dropout-offset", f"dropout numbers the {pairs} (batch, head, query, key) positions with 64-bit "
                    f"counters from dropout_offset={o.dropout_offset}, and batch * heads_q with 32 bits: they do "
                    "not fit; use a smaller dropout_offset, or split the batch")


def _backward_tensors(out, lse, grad_out) -> tuple:
    for name, t in (("out", out), ("lse", lse), ("grad_out", grad_out)):
        if not isinstance(t, torch.Tensor):
            raise InvalidProblemError(f"the backward needs {name} as a tensor")
    return check_plain(out, "out"), check_plain(lse, "lse"), check_plain(grad_out, "grad_out")


def _dtype(q) -> DType:
    try:
        dtype = DType.from_torch(q.dtype)
    except UnsupportedError:
        dtype = None
    if dtype not in DTYPES + FP8_DTYPES:
        raise UnsupportedError(f"[dtype] q is {q.dtype}; attention takes "
                               f"{', '.join(str(d.torch) for d in DTYPES + FP8_DTYPES)} (fp8: forward only)")
    return dtype


def _heads_and_dims(q, k, v) -> tuple[int, int, int, int]:
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if k.shape[-1] != d_qk:
        raise _fail("head-dim-match", f"q's head dim is {d_qk} but k's is {k.shape[-1]}; they must agree")
    for name, d in (("q/k", d_qk), ("v", d_v)):
        if d not in HEAD_DIMS:
            raise UnsupportedError(f"[head-dim] the {name} head dim {d} is not supported; use one of {HEAD_DIMS} "
                                   "(pad the head dim up to the next one)")
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if v.shape[1] != heads_kv:
        raise _fail("heads-match", f"k has {heads_kv} heads but v has {v.shape[1]}; they must agree")
    if heads_q % heads_kv:
        raise _fail("heads-group", f"q has {heads_q} heads, not a multiple of the {heads_kv} key/value heads "
                    f"(GQA needs heads_q = g * heads_kv; MQA: heads_kv = 1)")
    return d_qk, d_v, heads_q, heads_kv


def check_operands(q, k, v, *, options: AttentionOptions = AttentionOptions(), mask=None, bias=None,
                   alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
                   direction: Direction = Direction.FORWARD, out=None, lse=None, grad_out=None,
                   bias_grad: bool = False, scale_q=None, scale_k=None, scale_v=None) -> AttentionOperands:
    if not isinstance(options, AttentionOptions):
        raise InvalidArgumentError(f"options must be an AttentionOptions, got {type(options).__name__}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise _fail("varlen", "give both cu_seqlens_q and cu_seqlens_k (the key offsets may equal the query ones)")
    _check_qkv(q, k, v, varlen)
    dtype = _dtype(q)
    given = {"mask": mask, "bias": bias, "alibi_slopes": alibi_slopes, "sinks": sinks}
    _check_types(given)
    scales = _fp8_scales(q, dtype, {"scale_q": scale_q, "scale_k": scale_k, "scale_v": scale_v})
    if dtype in FP8_DTYPES:
        _check_fp8_features(options, mask, bias, alibi_slopes, varlen, direction, (q.shape[-1], v.shape[-1]))
    d_qk, d_v, heads_q, heads_kv = _heads_and_dims(q, k, v)
    batch, seqlen_q, seqlen_kv, seqlens, cu_q, cu_k = _sequences(q, k, v, cu_seqlens_q, cu_seqlens_k, varlen)
    # Negated views are resolved only now: the lengths are known to be within the kernels' reach.
    q, k, v = check_plain(q, "q"), check_plain(k, "k"), check_plain(v, "v")
    full = (batch, heads_q, seqlen_q, seqlen_kv)
    user_mask, mask_view, bias_view, slopes, sinks32 = _features(q, full, varlen, _optional_tensors(given))
    o = options
    scale = 1.0 / math.sqrt(d_qk) if o.scale is None else float(o.scale)
    mask_kind, window = _position_mask(o, seqlen_q, seqlen_kv, varlen)
    _check_dropout_counters(o, full)
    if direction is Direction.BACKWARD:
        out, lse, grad_out = _backward_tensors(out, lse, grad_out)
    variant = AttentionVariant(
        band=mask_kind is not MaskKind.NONE, user_mask=user_mask, bias=bias is not None,
        alibi=alibi_slopes is not None, softcap=o.softcap is not None, sinks=sinks is not None,
        dropout=o.dropout_p > 0, varlen=varlen, bias_grad=bias_grad and direction is Direction.BACKWARD,
        aligned=_aligned(q, k, v, out, grad_out),
    )
    problem = AttentionProblem(
        batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_kv=seqlen_kv,
        head_dim_qk=d_qk, head_dim_v=d_v, dtype=dtype, direction=direction, layout=_layout(q, varlen),
        mask=mask_kind, window=window, variant=variant,
        needs_lse=o.needs_lse and direction is Direction.FORWARD,
        deterministic=o.deterministic and direction is Direction.BACKWARD, seqlens=seqlens,
    )
    return AttentionOperands(
        problem=problem, q=q, k=k, v=v, bias=bias_view, mask=mask_view, alibi_slopes=slopes, sinks=sinks32,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, scale=scale, softcap=float(o.softcap or 0.0),
        dropout_p=o.dropout_p, dropout_seed=o.dropout_seed, dropout_offset=o.dropout_offset,
        out=out, lse=lse, grad_out=grad_out, **scales,
    )
