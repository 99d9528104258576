"""The fast path of `attention()` and of its backward: a call signature seen before skips
the checks, the selection and the plan.

The first call with a given signature (shape, strides, dtype, device and 16-byte base
alignment of every tensor, which of q, k, v, ... are one object, the options and the forced
kernel) runs every check, selects the kernel, loads its launchers and plans once. The plan's
launch arguments become templates with holes; a later call with the same signature fills in
its own tensors (or a tensor descriptor of them), fresh output buffers laid out as planned,
and its dropout seed and offset, and launches. Everything the checks, the selection and the
plan read is in the signature; what they do not read (the pointers, the seed) is filled in.

Varlen calls stay on the checked path: their cu_seqlens are read on the host. fp8 calls bind
their scale tensors too (a scale left out is a one kept by the bound call). `attention`
takes no `out=`, so no aliasing needs re-checking. Negated and conjugated views stay on the
checked path too: the checks resolve them into copies. A plan that makes tensors from the inputs
(the negated K of a negative scale on the TMA forward) is not replayed: its signature is
remembered as checked-only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ...core.dispatcher import stream_getter
from ...core.launch import Plan
from . import vendor
from .config import VendorConfig
from .operands import AttentionOperands, AttentionOptions, sinks_fp32, view_bias, view_mask, view_slopes
from .plan import ZEROED_ARGS, AttentionGrads, AttentionResult, kernel_units
from .problem import Direction, MaskKind

# The per-call tensors, in the order `BoundAttention.__call__` takes them; each is the
# AttentionOperands field of that name (bias, mask, alibi_slopes and sinks as derived there).
ROLES = ("q", "k", "v", "bias", "mask", "alibi_slopes", "sinks", "out", "lse", "grad_out", "scale_q", "scale_k",
         "scale_v")
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_NUMBER_TYPES = (float, int, type(None))


class _Checked:
    """The memo's answer for a signature whose plan cannot be replayed: run the checked path."""

    def __repr__(self) -> str:
        return "CHECKED"


CHECKED = _Checked()


class _NotReplayable(Exception):
    pass


# -- signatures -----------------------------------------------------------------------------
def _meta(t: torch.Tensor) -> tuple:
    """What the checks read of a tensor: shape, strides, dtype, device and the 16-byte bit of its base."""
    return (t.shape, t.stride(), t.dtype, t.device, not t.data_ptr() & 15)


def _replayable(t) -> bool:
    """A plain tensor whose memory holds its values: a negated or conjugated view's does not, and
    the checks resolve it into a copy that a replay, binding the caller's tensor, would not make."""
    return type(t) in _TENSOR_TYPES and not (t.is_neg() or t.is_conj())


def _metas(tensors: tuple) -> tuple | None:
    """Each tensor's meta, or None where one is not a plain tensor (`_replayable`)."""
    out = []
    for t in tensors:
        if not _replayable(t):
            return None
        out.append(_meta(t))
    return tuple(out)


_NO_OPTIONAL = (None, None, None, None)


def _optional_metas(optional: tuple) -> tuple | None:
    """The metas of (bias, mask, alibi_slopes, sinks), None for a missing one; None where one
    is not a plain tensor (`_replayable`)."""
    if optional[0] is None and optional[1] is None and optional[2] is None and optional[3] is None:
        return _NO_OPTIONAL
    out = []
    for t in optional:
        if t is None:
            out.append(None)
        elif _replayable(t):
            out.append(_meta(t))
        else:
            return None
    return tuple(out)


def _identities(tensors: tuple) -> tuple[int, ...]:
    """Which tensors are one object (k is v...): the plan binds arguments by identity."""
    ids = [id(t) for t in tensors]
    return tuple(ids.index(i) for i in ids)


def _scalars(options: AttentionOptions, kernel) -> tuple | None:
    """The options the checks read (not the dropout seed and offset: filled in per call)."""
    if type(options.scale) not in _NUMBER_TYPES or type(options.softcap) not in _NUMBER_TYPES:
        return None  # a tensor or numpy scalar: hashed by identity, it would never hit
    if kernel is not None and type(kernel) is not str:
        return None
    return (options.causal, options.window, options.scale, options.softcap, options.dropout_p, kernel)


def forward_key(q, k, v, optional: tuple, options: AttentionOptions, kernel, scales: tuple = (None,) * 3
                ) -> tuple | None:
    """The forward's signature, or None where only the checked path can take the call.
    `optional` is (bias, mask, alibi_slopes, sinks) and `scales` fp8's (scale_q, scale_k,
    scale_v); varlen calls never get here."""
    scalars = _scalars(options, kernel)
    metas = _metas((q, k, v))
    extra = _optional_metas(optional)
    if scalars is None or metas is None or extra is None:
        return None
    if scales[0] is None and scales[1] is None and scales[2] is None:
        return (Direction.FORWARD, scalars, options.needs_lse, metas, extra, (q is k, q is v, k is v))
    scale_metas = _optional_metas((*scales, None))
    if scale_metas is None:
        return None
    return (Direction.FORWARD, scalars, options.needs_lse, metas, extra, (q is k, q is v, k is v), scale_metas)


def backward_key(q, k, v, out, lse, grad_out, optional: tuple, options: AttentionOptions, kernel,
                 bias_grad: bool) -> tuple | None:
    """The backward's signature: the forward's options, the backward kernel, whether the bias
    needs its gradient, and the tensors (the saved ones and dO)."""
    scalars = _scalars(options, kernel)
    required = (q, k, v, out, lse, grad_out)
    metas = _metas(required)
    extra = _optional_metas(optional)
    if scalars is None or metas is None or extra is None:
        return None
    return (Direction.BACKWARD, scalars, options.deterministic, bias_grad, metas, extra, _identities(required))


def lookup(dispatcher, key: tuple, checked: Callable[[], AttentionOperands], kernel):
    """The bound call of `key`, bound on first sight from `checked()`'s operands; None where
    the signature is checked-only. A failing check raises and binds nothing."""
    found = dispatcher.memo(("attention", key), lambda: bind(dispatcher, checked(), kernel))
    return None if found is CHECKED else found


# -- bound calls ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Buffer:
    """An output or workspace the plan allocated: made again per call, in the same layout."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    zero: bool

    def make(self, device: torch.device) -> torch.Tensor:
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)
        return t.zero_() if self.zero else t


@dataclass(frozen=True)
class _Stage:
    """One launch: its launcher and grid, its arguments with holes, and what fills each hole."""

    launcher: Any
    grid: tuple[int, int, int]
    template: list
    tensors: tuple[tuple[int, int], ...]  # (argument, role)
    buffers: tuple[tuple[int, int], ...]  # (argument, buffer)
    descriptors: tuple[tuple[int, int, dict], ...]  # (argument, role of its base, its other fields)
    buffer_descriptors: tuple[tuple[int, int, dict], ...]  # (argument, buffer, fields): Gluon stages store by TMA
    seed: int | None  # the argument that takes the dropout seed, if any
    offset: int | None


def _descriptor(base: torch.Tensor, fields: dict) -> TensorDescriptor:
    """The planned descriptor on a new base of the same signature, without re-running the
    checks of TensorDescriptor.__post_init__ (they passed for this signature)."""
    descriptor = object.__new__(TensorDescriptor)
    descriptor.__dict__.update(fields)
    descriptor.base = base
    return descriptor


class BoundAttention:
    """A checked, selected and planned Triton call, replayable on new tensors of its signature."""

    def __init__(self, operands: AttentionOperands, plan: Plan, launchers: dict, units: dict) -> None:
        roles: dict[int, int] = {}
        for i, role in enumerate(ROLES):
            t = getattr(operands, role)
            if t is not None:
                roles.setdefault(id(t), i)
        self._buffer_ids: dict[int, int] = {}
        self._buffers: list[_Buffer] = []
        result = plan.output
        self._result_type = type(result)
        self._result = tuple(self._result_buffer(getattr(result, f.name), roles) for f in dataclasses.fields(result))
        self._stages = tuple(self._stage(launch, launchers[launch.stage], units[launch.stage], roles)
                             for launch in plan.launches)
        self._buffers = tuple(self._buffers)
        del self._buffer_ids  # ids of the planning tensors: meaningless once they are freed
        p = operands.problem
        self._full = (p.batch, p.heads_q, p.seqlen_q, p.seqlen_kv)
        self._optional = any(getattr(operands, r) is not None for r in ("bias", "mask", "alibi_slopes", "sinks"))
        self._device = operands.device
        # fp8: a scale the caller leaves out is 1, as the checks made it
        self._unit_scale = torch.ones(1, dtype=torch.float32, device=self._device) if operands.scale_q is not None \
            else None
        self._stream = stream_getter(self._device)

    def _buffer(self, t: torch.Tensor, zero: bool) -> int:
        index = self._buffer_ids.get(id(t))
        if index is None:
            index = self._buffer_ids[id(t)] = len(self._buffers)
            self._buffers.append(_Buffer(tuple(t.shape), tuple(t.stride()), t.dtype, zero))
        elif zero and not self._buffers[index].zero:
            self._buffers[index] = dataclasses.replace(self._buffers[index], zero=True)
        return index

    def _result_buffer(self, t: torch.Tensor | None, roles: dict) -> int | None:
        if t is None:
            return None
        if id(t) in roles:
            raise _NotReplayable("the plan hands an input back as a result")
        return self._buffer(t, zero=False)

    def _stage(self, launch, launcher, unit, roles: dict) -> _Stage:
        names = [name for name, _ in unit.signature]
        tensors, buffers, descriptors, buffer_descriptors, seed, offset = [], [], [], [], None, None
        template = list(launch.args)
        for j, (name, value) in enumerate(zip(names, launch.args, strict=True)):
            if isinstance(value, TensorDescriptor):
                fields = {f: v for f, v in vars(value).items() if f != "base"}
                role = roles.get(id(value.base))
                if role is not None:
                    descriptors.append((j, role, fields))
                elif id(value.base) in self._buffer_ids:
                    buffer_descriptors.append((j, self._buffer_ids[id(value.base)], fields))
                else:
                    raise _NotReplayable(f"{name} describes a tensor the plan made from the inputs")
            elif isinstance(value, torch.Tensor):
                role = roles.get(id(value))
                if role is not None:
                    tensors.append((j, role))
                elif id(value) in self._buffer_ids or name in ZEROED_ARGS:
                    buffers.append((j, self._buffer(value, zero=name in ZEROED_ARGS)))
                else:  # made from the inputs (a negated K): a replay could not make it
                    raise _NotReplayable(f"{name} is a tensor the plan made from the inputs")
            elif name == "seed":
                seed = j
            elif name == "rng_offset":
                offset = j
            else:
                continue
            template[j] = None  # a planning tensor kept here would pin its memory
        return _Stage(launcher, launch.grid, template, tuple(tensors), tuple(buffers), tuple(descriptors),
                      tuple(buffer_descriptors), seed, offset)

    def _views(self, bias, mask, alibi_slopes, sinks) -> tuple:
        full = self._full
        return (None if bias is None else view_bias(bias, full), None if mask is None else view_mask(mask, full),
                None if alibi_slopes is None else view_slopes(alibi_slopes, full[0], full[1]),
                None if sinks is None else sinks_fp32(sinks))

    def __call__(self, q, k, v, bias, mask, alibi_slopes, sinks, seed: int, offset: int, out=None, lse=None,
                 grad_out=None, scale_q=None, scale_k=None, scale_v=None):
        optional = self._views(bias, mask, alibi_slopes, sinks) if self._optional else (None, None, None, None)
        values = (q, k, v, *optional, out, lse, grad_out)
        if self._unit_scale is not None:
            one = self._unit_scale
            values += tuple(one if s is None else s for s in (scale_q, scale_k, scale_v))  # the kernel reads s[0]
        device = self._device
        buffers = [b.make(device) for b in self._buffers]
        stream = self._stream()
        for stage in self._stages:
            args = stage.template.copy()
            for j, role in stage.tensors:
                args[j] = values[role]
            for j, index in stage.buffers:
                args[j] = buffers[index]
            for j, role, fields in stage.descriptors:
                args[j] = _descriptor(values[role], fields)
            for j, index, fields in stage.buffer_descriptors:
                args[j] = _descriptor(buffers[index], fields)
            if stage.seed is not None:
                args[stage.seed] = seed
            if stage.offset is not None:
                args[stage.offset] = offset
            stage.launcher(stage.grid, args, stream)
        return self._result_type(*[None if i is None else buffers[i] for i in self._result])


class VendorForward:
    """The SDPA forward on a call seen before: `vendor.forward` on the caller's tensors, nothing planned."""

    def __init__(self, config: VendorConfig, operands: AttentionOperands) -> None:
        p = operands.problem
        self._args = (operands.scale, p.mask is not MaskKind.NONE, p.needs_lse)
        self._family = config.family

    def __call__(self, q, k, v, bias, mask, alibi_slopes, sinks, seed: int, offset: int, out=None, lse=None,
                 grad_out=None, scale_q=None, scale_k=None, scale_v=None) -> AttentionResult:
        result = AttentionResult(None, None)
        vendor.forward(self._family, q, k, v, result, *self._args)
        return result


class VendorBackward:
    """The cuDNN backward on a call seen before: `vendor.backward` on the saved tensors."""

    def __init__(self, config: VendorConfig, operands: AttentionOperands) -> None:
        self._args = (operands.scale, operands.problem.mask is not MaskKind.NONE)
        self._family = config.family

    def __call__(self, q, k, v, bias, mask, alibi_slopes, sinks, seed: int, offset: int, out=None, lse=None,
                 grad_out=None, scale_q=None, scale_k=None, scale_v=None) -> AttentionGrads:
        grads = AttentionGrads(None, None, None, None, None)
        vendor.backward(self._family, grads, grad_out, q, k, v, out, lse, *self._args)
        return grads


def bind(dispatcher, operands: AttentionOperands, kernel) -> BoundAttention | VendorForward | VendorBackward | _Checked:
    """Selects (or resolves the forced kernel), loads and plans once, for replay."""
    spec, launchers = dispatcher.prepare(operands, kernel=kernel)
    p = operands.problem
    if isinstance(spec.config, VendorConfig):
        return (VendorForward if p.direction is Direction.FORWARD else VendorBackward)(spec.config, operands)
    units = {unit.stage: unit for unit in kernel_units(spec.config, p.variant)}
    try:
        return BoundAttention(operands, spec.definition.plan(spec.config, operands), launchers, units)
    except _NotReplayable:
        return CHECKED
