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
from typing import Callable

import torch

from ...core.dispatcher import stream_getter
from ...core.launch import Plan
from ...core.replay import PLAIN_TENSORS, Binding, BoundPlan, Unbindable, tensor_meta
from . import vendor
from .config import VendorConfig
from .operands import AttentionOperands, AttentionOptions, sinks_fp32, view_bias, view_mask, view_slopes
from .plan import ZEROED_ARGS, AttentionGrads, AttentionResult, kernel_units
from .problem import Direction, MaskKind

# The per-call tensors, in the order `BoundAttention.__call__` takes them; each is the
# AttentionOperands field of that name (bias, mask, alibi_slopes and sinks as derived there).
ROLES = ("q", "k", "v", "bias", "mask", "alibi_slopes", "sinks", "out", "lse", "grad_out", "scale_q", "scale_k",
         "scale_v")
_NUMBER_TYPES = (float, int, type(None))


class _Checked:
    """The memo's answer for a signature whose plan cannot be replayed: run the checked path."""

    def __repr__(self) -> str:
        return "CHECKED"


CHECKED = _Checked()


# -- signatures -----------------------------------------------------------------------------
def _replayable(t) -> bool:
    """A plain tensor whose memory holds its values: a negated or conjugated view's does not, and
    the checks resolve it into a copy that a replay, binding the caller's tensor, would not make."""
    return type(t) in PLAIN_TENSORS and not (t.is_neg() or t.is_conj())


def _metas(tensors: tuple) -> tuple | None:
    """Each tensor's meta, or None where one is not a plain tensor (`_replayable`)."""
    out = []
    for t in tensors:
        if not _replayable(t):
            return None
        out.append(tensor_meta(t))
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
            out.append(tensor_meta(t))
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


def plain_key(q, k, v, optional: tuple, causal, window, scale, softcap, deterministic, kernel,
              backward_kernel=None) -> tuple | None:
    """The signature of a plain call written as the caller wrote it, before any option is read:
    the tensors' metas, whether autograd records the call, and the raw options with their types
    (one reading of equal raw options gives equal options). None where the call is not plain, or
    not keyable: then `attention()` reads every option, as a first sight does. Plain: no dropout,
    LSE, varlen or fp8 scales (the caller checks those it passes alone), and a recorded call has
    none of bias, mask, ALiBi and sinks (cuDNN's own op takes it or the checked path does)."""
    metas, extra = _metas((q, k, v)), _optional_metas(optional)
    if metas is None or extra is None:
        return None
    recorded = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if extra is not _NO_OPTIONAL and (recorded or torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in optional)):
        return None
    raw = (causal, window, scale, softcap, deterministic, kernel, backward_kernel)  # each checked on first sight
    key = ("attention-plain", recorded, metas, extra, (q is k, q is v, k is v), raw, tuple(map(type, raw)),
           tuple(map(type, window)) if type(window) is tuple else None)
    try:
        hash(key)
    except TypeError:  # a list or another unhashable option: the full reading takes it
        return None
    return key


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
_SCALARS = ("seed", "rng_offset")  # filled per call: the dropout seed and offset are not in the signature


def _binding(operands: AttentionOperands, plan: Plan, units: dict) -> Binding:
    """The plan's roles, its outputs and the arguments the kernels expect as zeros (ZEROED_ARGS)."""
    names = {stage: tuple(name for name, _ in unit.signature) for stage, unit in units.items()}
    zeroed = tuple(value for launch in plan.launches for name, value in zip(names[launch.stage], launch.args,
                                                                           strict=True)
                   if name in ZEROED_ARGS and isinstance(value, torch.Tensor))
    outputs = tuple(getattr(plan.output, f.name) for f in dataclasses.fields(plan.output))
    return Binding([getattr(operands, role) for role in ROLES], scratch=(*outputs, *zeroed), zeroed=zeroed,
                   names=names, scalars=_SCALARS)


class BoundAttention:
    """A checked, selected and planned Triton call, replayable on new tensors of its signature."""

    def __init__(self, operands: AttentionOperands, plan: Plan, launchers: dict, units: dict) -> None:
        bound = BoundPlan(plan, launchers, _binding(operands, plan, units), operands.device)
        result = plan.output
        self._result_type = type(result)
        self._result = tuple(None if t is None else bound.buffer_of(t)
                             for t in (getattr(result, f.name) for f in dataclasses.fields(result)))
        self._run = bound.seal().run
        p = operands.problem
        self._full = (p.batch, p.heads_q, p.seqlen_q, p.seqlen_kv)
        self._optional = any(getattr(operands, r) is not None for r in ("bias", "mask", "alibi_slopes", "sinks"))
        # fp8: a scale the caller leaves out is 1, as the checks made it
        self._unit_scale = torch.ones(1, dtype=torch.float32, device=operands.device) \
            if operands.scale_q is not None else None
        self._stream = stream_getter(operands.device)

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
        buffers = self._run(values, self._stream(), (seed, offset))
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
        vendor.forward(self._family, q, k, v, result, *self._args, mask)
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
    except Unbindable:
        return CHECKED
