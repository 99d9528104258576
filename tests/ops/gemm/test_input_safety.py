"""GEMM input that once gave a wrong answer, a raw exception or a crash (issue 38): negated
views, an output overlapping what the kernel reads, inputs that require grad, another op's
kernel, arguments of the wrong type, and element offsets past a 32-bit index.

Each runs on the CPU interpreter and, in a GPU process, through the fast path too (a call
with a signature seen before replays its bound launch): the tests that run a kernel call it
twice, or after a plain call of the same signature.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import tiledispatch
from tiledispatch import Dispatcher, Registry
from tiledispatch.arch import load as load_arch
from tiledispatch.core.errors import InvalidArgumentError, InvalidProblemError, NoKernelError, UnsupportedError
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import check_operands, supports
from tiledispatch.ops.gemm.rules import WIDE_OFFSETS

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
ARCH = current_arch()
FP16 = torch.float16


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def t(*shape, dtype=FP16, device=DEVICE):
    return torch.randn(shape).to(device, dtype)


def raises(error: type, fragment: str):
    return pytest.raises(error, match=re.escape(fragment))


def reference(a, b, bias=None, residual=None) -> torch.Tensor:
    """a @ b (+ bias) (+ residual) in float64, from the values the tensors stand for."""
    got = a.resolve_neg().double() @ b.resolve_neg().double()
    if bias is not None:
        got = got + bias.resolve_neg().double()
    return got if residual is None else got + residual.resolve_neg().double()


def close(got: torch.Tensor, want: torch.Tensor, dtype=FP16) -> None:
    tol = 1e-2 if dtype == FP16 else 1e-4
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


# -- 1. negated views ------------------------------------------------------------------------
def test_imag_of_conjugate_is_read_with_its_sign(dispatcher):
    a = torch.randn(6, 8, dtype=torch.complex64, device=DEVICE).conj().imag  # a view with the neg bit
    b = t(8, 4, dtype=torch.float32)
    assert a.is_neg()
    for _ in range(2):  # the second call replays on a GPU
        close(tiledispatch.gemm(a, b, dispatcher=dispatcher), reference(a, b), torch.float32)


def test_negated_view_after_a_plain_call_of_the_same_signature(dispatcher):
    """A bound call replayed for a neg-bit tensor would read its memory as the values."""
    x, b, bias, residual = t(16, 8), t(8, 16), t(16), t(16, 16)
    close(tiledispatch.gemm(x, b, bias=bias, residual=residual, dispatcher=dispatcher), reference(x, b, bias, residual))
    for args in ((torch._neg_view(x), b, bias, residual), (x, torch._neg_view(b), bias, residual),
                 (x, b, torch._neg_view(bias), residual), (x, b, bias, torch._neg_view(residual))):
        got = tiledispatch.gemm(args[0], args[1], bias=args[2], residual=args[3], dispatcher=dispatcher)
        close(got, reference(*args))


def test_negated_view_as_out_is_refused(dispatcher):
    a, b = t(16, 8), t(8, 16)
    tiledispatch.gemm(a, b, out=t(16, 16), dispatcher=dispatcher)  # a plain out of the same signature first
    out = torch._neg_view(t(16, 16))
    before = out.clone()
    with raises(InvalidProblemError, "out is a negated view"):
        tiledispatch.gemm(a, b, out=out, dispatcher=dispatcher)
    assert torch.equal(out, before)


def test_negated_scale_is_resolved():
    a8, b8 = t(16, 32, device="cpu").to(torch.float8_e4m3fn), t(32, 16, device="cpu").to(torch.float8_e4m3fn)
    scale = torch._neg_view(torch.tensor(0.5))
    operands = check_operands(a8, b8, scale_a=scale)
    assert not operands.scale_a.is_neg() and operands.scale_a.item() == -0.5


# -- 2. out overlapping what the kernel reads ----------------------------------------------------
def test_residual_overlapping_a_batched_out_is_refused(dispatcher):
    """The issue's reproducer: residual o[0] is broadcast over the batch while out's batch 0 is written."""
    o = t(3, 16, 16)
    before = o.clone()
    with raises(InvalidProblemError, "out overlaps residual"):
        tiledispatch.gemm(t(3, 16, 8), t(3, 8, 16), residual=o[0], out=o, dispatcher=dispatcher)
    assert torch.equal(o, before)


def _overlapping_residual(case: str):
    if case == "shifted-rows":
        buf = t(48, 16, device="cpu")
        return buf[:32], buf[16:]
    if case == "transposed":
        o = t(32, 32, device="cpu")
        return o, o.t()
    if case == "numpy-views":  # two storages over one buffer
        array = np.random.randn(48, 16).astype(np.float16)
        out, residual = torch.from_numpy(array[:32]), torch.from_numpy(array[16:])
        assert out.untyped_storage().data_ptr() != residual.untyped_storage().data_ptr()
        return out, residual
    o = t(2, 32, 16, device="cpu")  # the batch of out it does not match
    return o, o[1:]


@pytest.mark.parametrize("case", ["shifted-rows", "transposed", "numpy-views", "other-batch"])
def test_residual_overlapping_out_is_refused(case):
    out, residual = _overlapping_residual(case)
    a = t(*out.shape[:-1], 8, device="cpu")
    with raises(InvalidProblemError, "out overlaps residual in memory"):
        check_operands(a, t(8, out.shape[-1], device="cpu"), residual=residual, out=out)


@pytest.mark.parametrize("role", ["a", "b", "bias"])
def test_numpy_views_of_one_buffer_overlapping_an_input_are_refused(role):
    array = np.random.randn(64, 16).astype(np.float16)
    out = torch.from_numpy(array[:16])
    read = {"a": torch.from_numpy(array[8:24]), "b": torch.from_numpy(array[15:31]),
            "bias": torch.from_numpy(array[15])}[role]
    args = {"a": t(16, 16, device="cpu"), "b": t(16, 16, device="cpu"), "bias": None, role: read}
    with raises(InvalidProblemError, f"out overlaps {role} in memory"):
        check_operands(args["a"], args["b"], bias=args["bias"], out=out)


def test_scale_inside_out_is_refused():
    out = torch.empty(16, 16, dtype=torch.bfloat16)
    scale = out.view(torch.float32)[3, 3]  # one float32 over two of out's elements
    a8, b8 = t(16, 32, device="cpu").to(torch.float8_e4m3fn), t(32, 16, device="cpu").to(torch.float8_e4m3fn)
    with raises(InvalidProblemError, "out overlaps scale_a"):
        check_operands(a8, b8, scale_a=scale, out=out)


def test_disjoint_slices_of_one_storage_are_accepted(dispatcher):
    buf = t(96, 16)
    out, residual, a = buf[:32], buf[32:64], buf[64:96, :8]
    b = t(8, 16)
    want = reference(a, b, residual=residual)
    for _ in range(2):
        tiledispatch.gemm(a, b, residual=residual, out=out, dispatcher=dispatcher)
        close(out, want)


def test_residual_that_is_out_adds_in_place(dispatcher):
    a, b, out = t(2, 16, 8), t(8, 16), t(2, 16, 16)
    for _ in range(2):
        want = reference(a, b, residual=out)
        tiledispatch.gemm(a, b, residual=out, out=out, dispatcher=dispatcher)
        close(out, want)
    flat = t(16, 16, device="cpu")  # a 2-D out and its (1, M, N) view are one tensor
    check_operands(t(16, 8, device="cpu"), t(8, 16, device="cpu"), residual=flat.unsqueeze(0), out=flat)


# -- 3. gradients ---------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ["a", "b", "bias", "residual", "out"])
def test_out_is_refused_where_autograd_records(dispatcher, role):
    args = {"a": t(16, 8), "b": t(8, 16), "bias": t(16), "residual": t(16, 16), "out": t(16, 16)}
    args[role].requires_grad_()
    a, b = args.pop("a"), args.pop("b")
    with raises(UnsupportedError, f"out= cannot take part in autograd, and {role} requires grad"):
        tiledispatch.gemm(a, b, dispatcher=dispatcher, **args)
    with torch.no_grad():
        got = tiledispatch.gemm(a, b, dispatcher=dispatcher, **args)
        close(got, reference(a, b, args["bias"], args["residual"]))
    if role != "out":  # without out, the call is recorded (gradients: tests/ops/gemm/test_autograd.py)
        args.pop("out")
        assert tiledispatch.gemm(a, b, dispatcher=dispatcher, **args).grad_fn is not None


# -- 4. forced kernels and dispatchers ----------------------------------------------------------------
@pytest.fixture(scope="module")
def every_op() -> Dispatcher:
    registry = Registry.from_rule_set("gemm", "tiny", ARCH)
    for op in ("conv", "attention"):
        registry = registry.merge(Registry.from_rule_set(op, "tests", ARCH))
    return Dispatcher(registry, ARCH)


@pytest.mark.parametrize("op", ["conv", "attention"])
def test_kernel_of_another_op_is_refused(every_op, op):
    name = next(s.name for s in every_op.registry if s.op.value == op)
    with raises(UnsupportedError, f"kernel {name} is a {op} kernel; gemm takes gemm kernels, see "
                                  "`tiledispatch registry list --op gemm`"):
        tiledispatch.gemm(t(16, 8), t(8, 16), kernel=name, dispatcher=every_op)
    with raises(UnsupportedError, f"is a {op} kernel"):  # a KernelSpec too
        tiledispatch.gemm(t(16, 8), t(8, 16), kernel=every_op.registry.get(name), dispatcher=every_op)


@pytest.mark.parametrize("kernel", [123, 1.5, ["gemm"], b"gemm"])
def test_kernel_of_the_wrong_type(dispatcher, kernel):
    with raises(InvalidArgumentError, "kernel must be a kernel name (a str"):
        tiledispatch.gemm(t(16, 8), t(8, 16), kernel=kernel, dispatcher=dispatcher)


@pytest.mark.parametrize("value", ["foo", 0, Registry()])
def test_dispatcher_of_the_wrong_type(value):
    with raises(InvalidArgumentError, "dispatcher must be a tiledispatch.Dispatcher"):
        tiledispatch.gemm(t(16, 8), t(8, 16), dispatcher=value)


# -- 5. argument types ----------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "fragment"), [
    (dict(allow_tf32="no"), InvalidArgumentError, "allow_tf32 must be True or False, got 'no'"),
    (dict(allow_tf32=1), InvalidArgumentError, "allow_tf32 must be True or False, got 1"),
    (dict(activation=["relu"]), InvalidArgumentError, "activation must be None or one of"),
    (dict(activation=2), InvalidArgumentError, "activation must be None or one of"),
    (dict(out_dtype=["fp32"]), InvalidArgumentError, "out_dtype must be None, a torch.dtype"),
    (dict(out_dtype=32), InvalidArgumentError, "out_dtype must be None, a torch.dtype"),
    (dict(out_dtype=np.float32), InvalidArgumentError, "out_dtype must be None, a torch.dtype"),
    (dict(out_dtype=torch.int32), UnsupportedError, "tensor dtype torch.int32 is not supported"),
    (dict(out=t(16, 16, dtype=torch.float32), out_dtype=torch.int32), UnsupportedError,
     "tensor dtype torch.int32 is not supported"),
])
def test_options_of_the_wrong_type(dispatcher, kwargs, error, fragment):
    """On a GPU `activation` and `out_dtype` are part of the fast path's call key: a list there
    would raise TypeError (unhashable) rather than say what is wrong."""
    a, b = t(16, 8, dtype=torch.float32), t(8, 16, dtype=torch.float32)
    with raises(error, fragment):
        tiledispatch.gemm(a, b, dispatcher=dispatcher, **kwargs)


def test_numpy_bool_is_a_bool(dispatcher):
    a, b = t(16, 8, dtype=torch.float32), t(8, 16, dtype=torch.float32)
    close(tiledispatch.gemm(a, b, allow_tf32=np.bool_(False), dispatcher=dispatcher), reference(a, b), torch.float32)


def _fp8():
    return t(16, 32, device="cpu").to(torch.float8_e4m3fn), t(32, 16, device="cpu").to(torch.float8_e4m3fn)


@pytest.mark.parametrize(("scale", "fragment"), [
    ("0.5", "scale_a must be a number or a float32 tensor, got '0.5'"),
    (True, "scale_a must be a number or a float32 tensor, got True"),
    (1j, "scale_a must be a number or a float32 tensor, got 1j"),
    (float("nan"), "scale_a must be finite"),
    (10**400, "scale_a must be a finite real number"),
    (1e300, "scale_a must be at most 3.40"),  # no float32 holds it
])
def test_bad_scale_values(scale, fragment):
    with raises(InvalidArgumentError, fragment):
        check_operands(*_fp8(), scale_a=scale)


@pytest.mark.parametrize("scale", [0.5, 2, np.float32(0.5), np.int64(2), torch.tensor(0.5), torch.tensor([0.5])])
def test_scale_numbers_and_one_element_tensors(scale):
    operands = check_operands(*_fp8(), scale_a=scale, scale_b=scale)
    want = float(scale)
    assert operands.scale_a.shape == () and operands.scale_a.dtype == torch.float32
    assert operands.scale_a.item() == want and operands.scale_b.item() == want


@pytest.mark.parametrize(("make", "fragment"), [
    (lambda: t(16, 8, dtype=torch.float32, device="cpu").to_sparse(), "a is a sparse_coo tensor"),
    (lambda: t(16, 8, dtype=torch.float32, device="cpu").to_sparse_csr(), "a is a sparse_csr tensor"),
    (lambda: torch.nested.nested_tensor([t(16, 8, dtype=torch.float32, device="cpu")] * 2), "a is a nested tensor"),
])
def test_tensors_without_strides(make, fragment):
    with raises(InvalidProblemError, fragment):
        check_operands(make(), t(8, 16, dtype=torch.float32, device="cpu"))


def test_tensor_without_memory_of_its_own():
    b = t(8, 16, dtype=torch.float32, device="cpu")
    with raises(InvalidProblemError, "a has no memory of its own (a torch.vmap/torch.func or fake tensor)"):
        torch.vmap(lambda x: tiledispatch.gemm(x, b))(t(3, 16, 8, dtype=torch.float32, device="cpu"))


def test_zero_dim_tensor_is_named_as_such():
    with raises(InvalidProblemError, "bias must have shape (16,) (one value per output column), got () (a 0-d"):
        check_operands(t(16, 8, device="cpu"), t(8, 16, device="cpu"), bias=torch.tensor(1.0, dtype=FP16))


# -- 6. element offsets past a 32-bit index (meta tensors: no memory) ---------------------------------
def meta(shape, strides=None, dtype=FP16):
    if strides is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, strides, dtype=dtype, device="meta")


@pytest.mark.parametrize(("a", "b", "out"), [
    (meta((2, 8), (2**31, 1)), meta((8, 4)), None),  # a's second row at 2**31
    (meta((2, 8)), meta((8, 4), (1, 2**30)), None),  # b column-major, its last element at 3 * 2**30 + 7
    (meta((3, 4, 8), (2**30, 8, 1)), meta((8, 4)), None),  # the batch stride
    (meta((2**16, 1)), meta((1, 2**16)), None),  # the output we allocate: 2**32 elements
    (meta((2, 8)), meta((8, 4)), meta((2, 4), (2**31, 1))),  # the caller's out
])
def test_wide_offsets_are_refused_by_every_triton_kernel(dispatcher, a, b, out):
    problem = check_operands(a, b, out=out).problem
    assert problem.wide_offsets and problem.key() != check_operands(meta((2, 8)), meta((8, 4))).problem.key()
    triton = Dispatcher(dispatcher.registry.filter(lambda s: s.family != "vendor"), ARCH)  # the interpreter's
    assert len(triton.registry) and all(supports(s.config, problem) == WIDE_OFFSETS for s in triton.registry)
    with raises(NoKernelError, "element offsets past 2**31 need 64-bit indexing"):
        triton.select(problem)


def test_wide_offsets_go_to_the_vendor_on_a_gpu_arch():
    sm90 = load_arch("sm_90")
    gpu = Dispatcher(Registry.from_rule_set("gemm", "tiny", sm90), sm90)
    problem = check_operands(meta((2, 8), (2**31, 1)), meta((8, 4))).problem
    assert gpu.select(problem).family == "vendor"
    assert gpu.select(check_operands(meta((2, 8)), meta((8, 4))).problem).family != "vendor"


def test_broadcast_tensor_is_judged_by_its_largest_offset():
    """2**31 elements, all at offsets below 8: a stride-0 dim adds nothing, however long."""
    a = meta((1, 8)).expand(2**28, 8)
    problem = check_operands(a, meta((8, 1)), out=meta((2**28, 1))).problem
    assert not problem.wide_offsets
    batched = check_operands(meta((1, 4, 8)).expand(2**20, 4, 8), meta((8, 4))).problem
    assert batched.batch == 2**20 and not batched.wide_offsets


def test_largest_offset_just_below_the_limit_is_not_wide():
    below = check_operands(meta((2, 8), (2**31 - 8, 1)), meta((8, 4))).problem  # last element at 2**31 - 1
    at = check_operands(meta((2, 8), (2**31 - 7, 1)), meta((8, 4))).problem
    assert not below.wide_offsets and at.wide_offsets
