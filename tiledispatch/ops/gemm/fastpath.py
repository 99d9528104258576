"""The fast path of `gemm()` on a GPU: a call signature seen before skips all checks.

The first call with a given signature (shapes, strides, dtypes, device, 16-byte
alignment of each pointer, epilogue) runs every check, selects the kernel, loads its
launchers and lays out the launch arguments once. Every later call with the same
signature only swaps the new tensors into their slots and launches: everything the
checks looked at is part of the signature, except aliasing, which is re-checked whenever
the pointers differ from the last call's. A call the signature cannot stand for takes the
checked path every time: a negated view (`x.conj().imag`), whose memory holds values of the
other sign and which the checks copy, an argument of an unexpected type (the checks say what
is wrong with it) and an unhashable one.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...core.dispatcher import stream_getter
from ...core.dtypes import DType
from ...core.errors import BuildError
from ...core.hostcost import ByCapture, for_eager
from ...core.launch import Plan
from ...core.replay import PLAIN_TENSORS, Binding, BoundPlan, tensor_meta
from ...core.switches import TF32
from . import vendor
from .config import VendorConfig
from .operands import GemmOperands, check_no_alias
from .problem import Activation
from .ranking import replay_pick

log = logging.getLogger("tiledispatch.gemm")

ROLES = ("a", "b", "bias", "residual", "out", "scale_a", "scale_b")  # the order of `BoundGemm.__call__`


_NOT_A_TENSOR = object()  # an optional operand the fast path cannot key: the checked path says why


def _optional(t):
    if t is None:
        return None
    return tensor_meta(t) if type(t) in PLAIN_TENSORS and not t.is_neg() else _NOT_A_TENSOR


def _keyable(activation, out_dtype) -> bool:
    """Whether the options are of the types the checks accept (and hashable): others take the checked path."""
    return ((activation is None or type(activation) is str or isinstance(activation, Activation))
            and (out_dtype is None or type(out_dtype) in (str, torch.dtype) or isinstance(out_dtype, DType)))


def call_key(a, b, bias, activation, residual, out, out_dtype, allow_tf32, scale_a, scale_b, kernel) -> tuple | None:
    """The signature of a call, or None where only the checked path can handle it.

    It fixes the problem's `Alignment`, which the bound kernel is compiled for: each
    operand's level follows from its base's 16-byte bit, its strides, shape and dtype, the
    allocated output's from the shapes and `out_dtype`, the sizes' from the shapes.
    Written flat, without helper calls for a and b: it runs on every call, and a plain
    call's whole host budget is a few microseconds.
    """
    if type(a) not in PLAIN_TENSORS or type(b) not in PLAIN_TENSORS or not a.is_cuda:
        return None  # the interpreter reads whole tensors, not just their pointers
    if a.is_neg() or b.is_neg():  # (a real dtype has no conjugate bit, and the checks refuse complex ones)
        return None
    if (kernel is not None and type(kernel) is not str) or type(allow_tf32) is not bool:
        return None
    if (activation is not None or out_dtype is not None) and not _keyable(activation, out_dtype):
        return None
    optional = None
    if bias is not None or residual is not None or scale_a is not None or scale_b is not None:
        optional = (_optional(bias), _optional(residual), _optional(out), _optional(scale_a), _optional(scale_b))
        if _NOT_A_TENSOR in optional:
            return None
    elif out is not None:  # the common keyword, keyed inline: a tuple of its own, unlike any 5-tuple above
        if type(out) not in PLAIN_TENSORS or out.is_neg():
            return None
        optional = (out.shape, out.stride(), out.dtype, out.get_device(), not out.data_ptr() & 15)
    return ("gemm", a.shape, a.stride(), a.dtype, a.get_device(), not a.data_ptr() & 15,  # "gemm": memos are per dispatcher
            b.shape, b.stride(), b.dtype, b.get_device(), not b.data_ptr() & 15,
            activation, out_dtype, allow_tf32, kernel, optional)


def _batched(tensor: torch.Tensor) -> torch.Tensor:
    """What the vendor stage, planned with 3-D operands, reads of a call's tensor."""
    return tensor.unsqueeze(0) if tensor.dim() == 2 else tensor


def _made(plan: Plan, roles: list) -> tuple:
    """Every tensor the plan's launches read that is not the call's: gemm plans copy nothing on the host
    (realigned operands are filled by a copy stage), so each is scratch to make anew per call."""
    from triton.tools.tensor_descriptor import TensorDescriptor  # imported by then: the plan made its launches

    known = {id(t) for t in roles if t is not None}
    made = []
    for launch in plan.launches:
        for value in launch.args:
            tensor = value.base if isinstance(value, TensorDescriptor) else value
            if isinstance(tensor, torch.Tensor) and id(tensor) not in known:
                made.append(tensor)
    return tuple(made)


class BoundGemm:
    """A checked, selected and planned call, replayable on new tensors of the same signature."""

    def __init__(self, operands: GemmOperands, plan: Plan, launchers: dict, result_2d: bool) -> None:
        p = operands.problem
        roles = [getattr(operands, role) for role in ROLES]
        roles[ROLES.index("out")] = plan.output
        binding = Binding(roles, scratch=_made(plan, roles), view=_batched)
        self._run = BoundPlan(plan, launchers, binding, operands.device).seal().run
        shape = (p.m, p.n) if result_2d else (p.batch, p.m, p.n)  # a 2-D result needs no view of a 3-D one
        # The result is made by empty_like of one element expanded to its shape (a contiguous tensor, as
        # the expanded one is not dense): half the host time of torch.empty's keyword parsing (H200
        # host, 16x16: benchmarks/results/h200/gemm_host_profile_no_out.txt).
        self._like = torch.empty((), dtype=p.types.c.torch, device=operands.device).expand(shape)
        self._scale_a, self._scale_b = operands.scale_a, operands.scale_b
        self._stream = stream_getter(operands.device)
        self._unaliased: tuple | None = None  # the pointers of the last call whose out passed the alias check
        self.vendor = all(launch.stage == "vendor" for launch in plan.launches)  # PyTorch's product alone

    def __call__(self, a, b, bias, residual, out, scale_a, scale_b):
        if out is None:
            result = torch.empty_like(self._like)
        else:
            # Same pointers as a call that passed, and the same shapes (the signature): same answer.
            pointers = (out.data_ptr(), a.data_ptr(), b.data_ptr(), None if bias is None else bias.data_ptr(),
                        None if residual is None else residual.data_ptr(),
                        None if scale_a is None else scale_a.data_ptr(),
                        None if scale_b is None else scale_b.data_ptr())
            if pointers != self._unaliased:
                check_no_alias(out, a, b, bias, residual, scale_a, scale_b)
                self._unaliased = pointers
            result = out
        self._run((a, b, bias, residual, result, self._scale_a if scale_a is None else scale_a,
                    self._scale_b if scale_b is None else scale_b), self._stream())
        return result


class DirectMatmul:
    """The vendor candidate on a plain call, or a 2-D one with a bias alone: PyTorch's matmul (or
    addmm, the bias in cuBLASLt's epilogue) on the caller's own tensors.

    Nothing is planned or laid out: the call costs what torch.mm costs, plus the signature (the
    vendor stage of a plan took 60 us of host time a 4x2048x2048 call with a bias on the H200's
    host against 22 for F.linear, and copied its result once more: results/h200/eager_floor.txt).
    """

    vendor = True

    def __init__(self, result_2d: bool, bias: bool = False, tf32: bool | None = None) -> None:
        self._matmul = torch.mm if result_2d else torch.matmul
        self._bias = bias
        self._tf32 = tf32  # an fp32 call's own TF32 choice (vendor.tf32_switch)
        self._unaliased: tuple | None = None

    def __call__(self, a, b, bias, residual, out, scale_a, scale_b):
        if self._tf32 is not None:
            with TF32(torch.backends.cuda.matmul, self._tf32):
                return self._call(a, b, bias, out)
        return self._call(a, b, bias, out)

    def _call(self, a, b, bias, out):
        if out is None:
            return torch.addmm(bias, a, b) if self._bias else self._matmul(a, b)
        pointers = (out.data_ptr(), a.data_ptr(), b.data_ptr(), None if bias is None else bias.data_ptr())
        if pointers != self._unaliased:
            check_no_alias(out, a, b, bias)
            self._unaliased = pointers
        return torch.addmm(bias, a, b, out=out) if self._bias else self._matmul(a, b, out=out)


def bind(dispatcher, operands: GemmOperands, kernel: Any, result_2d: bool) -> BoundGemm | DirectMatmul | ByCapture:
    """Selects (or resolves), loads and plans once: a `BoundGemm` to replay, a `DirectMatmul`
    for a plain call bound to the vendor, or both kinds in a `ByCapture` where graph replays
    run another kernel than eager calls."""
    spec, launchers = dispatcher.prepare(operands, kernel=kernel)
    replayed = spec if kernel is not None else replay_pick(dispatcher, operands.problem, spec)
    if kernel is None:  # an eager call runs the vendor unless the pick saves its host time (core.hostcost)
        cheaper = for_eager(dispatcher, operands.problem, spec)
        if cheaper is not spec:
            spec, launchers = dispatcher.prepare(operands, kernel=cheaper)
    eager = _bound(spec, launchers, operands, result_2d)
    if replayed.name == spec.name:
        return eager
    try:
        graphed = _bound(*dispatcher.prepare(operands, kernel=replayed), operands, result_2d)
        if isinstance(replayed.config, VendorConfig) and not torch.cuda.is_current_stream_capturing():
            vendor.warm_up(operands.problem.types, operands.device)
        return ByCapture(eager, graphed)
    except BuildError:
        log.warning("kernel %s failed to build; graph captures run %s too", replayed.name, spec.name, exc_info=True)
        return eager


def _bound(spec, launchers: dict, operands: GemmOperands, result_2d: bool) -> BoundGemm | DirectMatmul:
    # A wide problem goes through the vendor's own run, which copies what cuBLAS cannot address.
    if isinstance(spec.config, VendorConfig) and not operands.problem.wide_offsets:
        if vendor.is_plain(operands):
            return DirectMatmul(result_2d, tf32=vendor.tf32_switch(operands.problem.types))
        if vendor.adds_bias_alone(operands, result_2d):
            return DirectMatmul(result_2d, bias=True)
    return BoundGemm(operands, spec.definition.plan(spec.config, operands), launchers, result_2d)
