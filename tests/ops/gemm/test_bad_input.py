"""Bad GEMM input: each mistake raises the tiledispatch error of its kind, with a message
that says what is wrong (checked by a fragment), before any kernel runs.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import tiledispatch
from tiledispatch import Dispatcher, Registry
from tiledispatch.core.errors import (
    InvalidProblemError, NoKernelError, TiledispatchError, UnknownKernelError, UnsupportedError,
)
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import GemmProblem, check_operands

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
ARCH = current_arch()
M, N, K = 8, 12, 16


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def t(*shape, dtype=torch.float16):
    return torch.randn(shape).to(DEVICE, dtype)


def raises(error: type, fragment: str):
    """pytest.raises for `error` whose message contains `fragment` (literally)."""
    assert issubclass(error, TiledispatchError)
    return pytest.raises(error, match=re.escape(fragment))


def gemm(*args, dispatcher=None, **kwargs):
    return tiledispatch.gemm(*args, dispatcher=dispatcher, **kwargs)


# -- shapes -----------------------------------------------------------------------------------
def test_inner_dims_mismatch():
    with raises(InvalidProblemError, "the inner dims must agree (a's K=16, b's K=15)"):
        gemm(t(M, K), t(K - 1, N))


def test_inner_dims_mismatch_batched():
    with raises(InvalidProblemError, "inner dims must agree"):
        gemm(t(2, M, K), t(2, N, K))


def test_batch_mismatch():
    with raises(InvalidProblemError, "batch sizes of a (3) and b (2) differ and neither is 1"):
        gemm(t(3, M, K), t(2, K, N))


@pytest.mark.parametrize("shape_a", [(K,), (2, 2, M, K)], ids=["1d", "4d"])
def test_wrong_rank(shape_a):
    with raises(InvalidProblemError, "a must be 2-D (rows x cols) or 3-D (batch x rows x cols)"):
        gemm(t(*shape_a), t(K, N))


@pytest.mark.parametrize(("shape_a", "shape_b"), [((0, K), (K, N)), ((M, K), (K, 0)), ((M, 0), (0, N)),
                                                  ((0, M, K), (K, N)), ((M, K), (0, K, N)), ((0, M, K), (1, K, N))],
                         ids=["m0", "n0", "k0", "batch0", "b-batch0", "batch0-vs-1"])
def test_zero_size_dims(shape_a, shape_b):
    # A batch of 0 against a 2-D operand (or a batch of 1) is empty, not a batch of 1 read out of bounds.
    with raises(InvalidProblemError, "zero-size dims are not a GEMM"):
        gemm(t(*shape_a), t(*shape_b))


@pytest.mark.parametrize(("kwargs", "fragment"), [
    (dict(m=0, n=4, k=4), "GEMM size M=0 must be a positive integer"),
    (dict(m=4, n=-3, k=4), "GEMM size N=-3 must be a positive integer"),
    (dict(m=4, n=4, k=0), "GEMM size K=0 must be a positive integer"),
    (dict(m=4, n=4, k=4, batch=0), "GEMM size BATCH=0 must be a positive integer"),
    (dict(m=4, n=4, k=4, batch=-1), "GEMM size BATCH=-1 must be a positive integer"),
    (dict(m=4.0, n=4, k=4), "GEMM size M=4.0 must be a positive integer"),
    (dict(m=True, n=4, k=4), "GEMM size M=True must be a positive integer"),
    (dict(m=4, n=2**31, k=4), "GEMM dims must stay below 2**31"),
])
def test_problem_sizes(kwargs, fragment):
    with raises(InvalidProblemError, fragment):
        GemmProblem(**kwargs)


def test_batch_over_grid_limit(dispatcher):
    """A Triton kernel's grid caps the batch; cuBLAS has no such cap, so on a GPU the vendor
    candidate takes the call (checked below) and only a Triton-only dispatcher refuses it."""
    a = t(1, 1, K).expand(65536, 1, K)  # no memory: a broadcast view
    b = t(K, 16)
    triton_only = Dispatcher(dispatcher.registry.filter(lambda spec: spec.family != "vendor"), ARCH)
    with raises(InvalidProblemError, "batch 65536 exceeds the grid limit 65535"):
        gemm(a, b, dispatcher=triton_only)
    if ON_GPU:
        got = gemm(a, b, dispatcher=Dispatcher(Registry.from_rule_set("gemm", "default", ARCH), ARCH))
        torch.testing.assert_close(got[-1].float(), (a[0].float() @ b.float()), rtol=2e-2, atol=2e-2)


# -- dtypes -----------------------------------------------------------------------------------
def test_mixed_dtypes():
    with raises(UnsupportedError, "a is fp16 and b is fp32: both must have one dtype"):
        gemm(t(M, K), t(K, N, dtype=torch.float32))


def test_fp8_with_fp16():
    with raises(UnsupportedError, "a is fp8e4m3 and b is fp16"):
        gemm(t(M, K).to(torch.float8_e4m3fn), t(K, N))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool, torch.complex64])
def test_unsupported_dtype(dtype):
    with raises(UnsupportedError, f"a: tensor dtype {dtype} is not supported"):
        gemm(torch.ones(M, K, dtype=dtype, device=DEVICE), torch.ones(K, N, dtype=dtype, device=DEVICE))


def test_float64():
    with raises(UnsupportedError, "fp64 GEMM is not supported; use torch.matmul"):
        gemm(t(M, K, dtype=torch.float64), t(K, N, dtype=torch.float64))


def test_int_b_with_fp16_a():
    with raises(UnsupportedError, "b: tensor dtype torch.int32 is not supported"):
        gemm(t(M, K), torch.ones(K, N, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize(("dtype", "out_dtype"), [(torch.float16, "bf16"), (torch.float32, torch.float16),
                                                  (torch.float16, "fp8e4m3")])
def test_unsupported_out_dtype(dtype, out_dtype):
    with raises(UnsupportedError, "is not supported for"):
        gemm(t(M, K, dtype=dtype), t(K, N, dtype=dtype), out_dtype=out_dtype)


def test_unknown_out_dtype_name():
    with raises(UnsupportedError, "unknown dtype 'fp12'"):
        gemm(t(M, K), t(K, N), out_dtype="fp12")


def test_tf32_with_fp16():
    with raises(InvalidProblemError, "allow_tf32 applies to fp32 inputs only, but a is fp16"):
        gemm(t(M, K), t(K, N), allow_tf32=True)


@pytest.mark.parametrize("which", ["scale_a", "scale_b"])
def test_scales_with_non_fp8(which):
    with raises(InvalidProblemError, "scale_a/scale_b are per-tensor scales of fp8 inputs; a is not fp8"):
        gemm(t(M, K), t(K, N), **{which: 0.5})


@pytest.mark.parametrize(("scale", "fragment"), [
    (torch.tensor(0.5, dtype=torch.float64), "scale_a must be one float32 value"),
    (torch.ones(2), "scale_a must be one float32 value"),
    ("half", "scale_a must be a number or a float32 tensor, got 'half'"),
])
def test_bad_fp8_scale(scale, fragment):
    if isinstance(scale, torch.Tensor):
        scale = scale.to(DEVICE)
    with raises(InvalidProblemError, fragment):
        gemm(t(M, 32).to(torch.float8_e4m3fn), t(32, N).to(torch.float8_e4m3fn), scale_a=scale)


@pytest.mark.skipif(ON_GPU, reason="bf16 runs on a GPU")
def test_bf16_on_interpreter_is_a_clear_error(dispatcher):
    a, b = t(M, K, dtype=torch.bfloat16), t(K, N, dtype=torch.bfloat16)
    # The interpreter has no bf16 tl.dot, so the arch filter drops every bf16 config...
    assert not any(spec.config.types.a.value == "bf16" for spec in dispatcher.registry)
    # ...and the public call says so, rather than listing why each fp16/fp32 kernel refused.
    for d in (None, dispatcher):
        with raises(UnsupportedError, "bf16 GEMM cannot run on Triton's CPU interpreter"):
            gemm(a, b, dispatcher=d)
    # The dispatcher on its own has no kernel for it either.
    with raises(NoKernelError, "'dtype': 'bf16'"):
        dispatcher.run(check_operands(a, b))


# -- epilogue operands ------------------------------------------------------------------------
@pytest.mark.parametrize("bias_shape", [(N + 1,), (M,), (1, N), (M, N)])
def test_bias_wrong_shape(bias_shape):
    with raises(InvalidProblemError, f"bias must have shape ({N},) (one value per output column)"):
        gemm(t(M, K), t(K, N), bias=t(*bias_shape))


def test_bias_wrong_dtype():
    with raises(InvalidProblemError, "bias is fp32; it must match the output dtype fp16"):
        gemm(t(M, K), t(K, N), bias=t(N, dtype=torch.float32))


def test_bias_dtype_follows_out_dtype():
    with raises(InvalidProblemError, "bias is fp16; it must match the output dtype fp32"):
        gemm(t(M, K), t(K, N), bias=t(N), out_dtype=torch.float32)


def test_bias_unsupported_dtype():
    with raises(UnsupportedError, "bias: tensor dtype torch.int64 is not supported"):
        gemm(t(M, K), t(K, N), bias=torch.zeros(N, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize(("shape_a", "res_shape"), [((M, K), (M, N + 1)), ((M, K), (N, M)), ((3, M, K), (2, M, N)),
                                                    ((M, K), (2, M, N)), ((M, K), (N,))],
                         ids=["cols", "transposed", "batch", "batch-of-2d", "1d"])
def test_residual_wrong_shape(shape_a, res_shape):
    fragment = "residual must have shape" if len(res_shape) > 1 else "residual must be 2-D"
    with raises(InvalidProblemError, fragment):
        gemm(t(*shape_a), t(K, N), residual=t(*res_shape))


def test_residual_wrong_dtype():
    with raises(InvalidProblemError, "residual is fp32; it must match the output dtype fp16"):
        gemm(t(M, K), t(K, N), residual=t(M, N, dtype=torch.float32))


def test_unknown_activation():
    with raises(UnsupportedError, "unknown activation 'tanh'; use one of: none, relu, gelu, silu"):
        gemm(t(M, K), t(K, N), activation="tanh")


# -- out --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape_a", "out_shape", "want"), [
    ((M, K), (M + 1, N), f"1x{M}x{N}"), ((M, K), (N, M), f"1x{M}x{N}"), ((3, M, K), (M, N), f"3x{M}x{N}"),
    ((3, M, K), (2, M, N), f"3x{M}x{N}"), ((M, K), (M * N,), None),
], ids=["rows", "transposed", "batch-2d", "batch", "1d"])
def test_out_wrong_shape(shape_a, out_shape, want):
    got = "x".join(map(str, out_shape))
    fragment = f"out must have shape {want}, got {got}" if want else "out must be 2-D (rows x cols) or 3-D"
    with raises(InvalidProblemError, fragment):
        gemm(t(*shape_a), t(K, N), out=t(*out_shape))


def test_out_wrong_dtype():
    with raises(UnsupportedError, "output dtype bf16 is not supported for fp16 inputs; use one of: fp16, fp32"):
        gemm(t(M, K), t(K, N), out=t(M, N, dtype=torch.bfloat16))


def test_out_unsupported_dtype():
    with raises(UnsupportedError, "out: tensor dtype torch.int32 is not supported"):
        gemm(t(M, K), t(K, N), out=torch.empty(M, N, dtype=torch.int32, device=DEVICE))


def test_out_disagrees_with_out_dtype():
    with raises(InvalidProblemError, "out is fp16 but out_dtype asks for fp32"):
        gemm(t(M, K), t(K, N), out=t(M, N), out_dtype=torch.float32)


@pytest.mark.parametrize("case", ["zero-stride", "batch-zero-stride", "overlapping-rows"])
def test_out_overlapping_itself(case):
    a = t(3, M, K) if case == "batch-zero-stride" else t(M, K)
    if case == "zero-stride":
        out = torch.empty(M, 1, dtype=torch.float16, device=DEVICE).expand(M, N)
    elif case == "batch-zero-stride":
        out = t(M, N).expand(3, M, N)
    else:  # row r starts inside row r-1
        out = torch.empty(M * N, dtype=torch.float16, device=DEVICE).as_strided((M, N), (N // 2, 1))
    with raises(InvalidProblemError, "overlaps itself, so several results would land in one element"):
        gemm(a, t(K, N), out=out)


@pytest.mark.parametrize("alias", ["a", "a-transposed", "b-view", "bias"])
def test_out_aliases_an_input(alias):
    x = t(16, 16)
    a, b, bias = t(16, 16), t(16, 16), None
    if alias == "a":
        a, out = x, x
    elif alias == "a-transposed":
        a, out = x, x.t()
    elif alias == "b-view":
        buf = t(24, 16)
        b, out = buf[:16], buf[8:]  # rows 8-15 of one buffer are both
    else:
        buf = t(17, 16)
        bias, out = buf[1], buf[1:]  # bias is out's first row
    name = {"a": "a", "a-transposed": "a", "b-view": "b", "bias": "bias"}[alias]
    before = out.clone()
    with raises(InvalidProblemError, f"out overlaps {name} in memory; pass a separate output tensor"):
        gemm(a, b, bias=bias, out=out)
    assert torch.equal(out, before)  # refused before anything ran


def test_disjoint_slices_of_one_buffer_are_accepted():
    """Aliasing is decided on memory: halves of one storage share none of it."""
    buf = t(32, 16)
    b, out = buf[:16], buf[16:]
    a = t(16, 16)
    want = a.double() @ b.double()
    gemm(a, b, out=out)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


# -- non-tensors and devices --------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "fragment"), [
    (dict(a=[[1.0, 2.0]], b="B"), "a must be a torch.Tensor, got list"),
    (dict(a="A", b="B"), "a must be a torch.Tensor, got str"),
    (dict(a=None, b="B"), "a must be a torch.Tensor, got NoneType"),
    (dict(b=None), "b must be a torch.Tensor, got NoneType"),
    (dict(b=3.0), "b must be a torch.Tensor, got float"),
    (dict(bias=[0.0] * N), "bias must be a torch.Tensor, got list"),
    (dict(residual=1.0), "residual must be a torch.Tensor, got float"),
    (dict(out=0), "out must be a torch.Tensor, got int"),
    (dict(b=np.ones((K, N), dtype=np.float16)), "b must be a torch.Tensor, got ndarray"),
])
def test_non_tensor_argument(kwargs, fragment):
    args = {"a": t(M, K), "b": t(K, N), **kwargs}
    with raises(InvalidProblemError, fragment):
        gemm(args.pop("a"), args.pop("b"), **args)


def test_different_devices():
    """The meta device stands in for a second device on a CPU-only machine."""
    with raises(InvalidProblemError, "b is on meta but a is on"):
        gemm(t(M, K), torch.empty(K, N, dtype=torch.float16, device="meta"))
    with raises(InvalidProblemError, "out is on meta but a is on"):
        gemm(t(M, K), t(K, N), out=torch.empty(M, N, dtype=torch.float16, device="meta"))


def test_device_the_backend_cannot_run():
    a = torch.empty(M, K, dtype=torch.float16, device="meta")
    b = torch.empty(K, N, dtype=torch.float16, device="meta")
    with raises(InvalidProblemError, "tensors are on meta"):
        gemm(a, b)


# -- forced kernels -----------------------------------------------------------------------------
def _name(dispatcher, dtype="fp16", layout="rrr", epilogue="none", split_k=1):
    return next(s.name for s in dispatcher.registry
                if s.config.types.name == dtype and s.config.layout.name == layout
                and s.config.epilogue.name == epilogue and s.config.split_k == split_k)


def test_forced_unknown_kernel_suggests_close_names(dispatcher):
    real = _name(dispatcher)
    typo = real.replace("_tiled_", "_tilde_")
    with raises(UnknownKernelError, f"no kernel named {typo!r} in the registry") as info:
        gemm(t(M, K), t(K, N), kernel=typo, dispatcher=dispatcher)
    assert f"did you mean {real}" in str(info.value)
    assert isinstance(info.value, KeyError)  # and str() is the plain message, not a quoted repr
    assert not str(info.value).startswith('"')


def test_forced_unknown_kernel_far_from_any(dispatcher):
    with raises(UnknownKernelError, "`tiledispatch registry list` shows them"):
        gemm(t(M, K), t(K, N), kernel="no_such_kernel", dispatcher=dispatcher)


def test_forced_kernel_for_another_arch(dispatcher):
    other = "sm80" if ARCH.tag != "sm80" else "sm90"
    name = _name(dispatcher).rsplit("_", 1)[0] + "_" + other
    with raises(UnknownKernelError, f"no kernel named {name!r}"):
        gemm(t(M, K), t(K, N), kernel=name, dispatcher=dispatcher)


@pytest.mark.parametrize(("kernel", "call", "fragment"), [
    (dict(dtype="fp32"), dict(), "built for fp32, the problem is fp16"),
    (dict(epilogue="bias"), dict(), "built for epilogue bias, the problem needs none"),
    (dict(), dict(bias=True), "built for epilogue none, the problem needs bias"),
    (dict(layout="rcr"), dict(), "built for layout rcr, the problem is rrr"),
    (dict(), dict(col_a=True), "built for layout rrr, the problem is crr"),
    (dict(split_k=3), dict(out_dtype=torch.float32), "built for fp16, the problem is fp16-fp32"),
])
def test_forced_kernel_that_does_not_support_the_problem(dispatcher, kernel, call, fragment):
    name = _name(dispatcher, **kernel)
    a = t(K, M).t() if call.get("col_a") else t(M, K)
    bias = t(N, dtype=call.get("out_dtype", torch.float16)) if call.get("bias") else None
    with raises(UnsupportedError, f"kernel {name} cannot run this problem: {fragment}"):
        gemm(a, t(K, N), bias=bias, out_dtype=call.get("out_dtype"), kernel=name, dispatcher=dispatcher)


def test_no_kernel_in_registry():
    arch = ARCH
    only_fp32 = Registry.from_rule_set("gemm", "tiny", arch).filter(lambda s: s.config.types.name == "fp32")
    d = Dispatcher(only_fp32, arch)
    with raises(NoKernelError, f"no kernel among {len(only_fp32)} for gemm on {arch.name} supports this problem"):
        gemm(t(M, K), t(K, N), dispatcher=d)
    with raises(NoKernelError, "the registry is empty"):
        gemm(t(M, K), t(K, N), dispatcher=Dispatcher(Registry(), arch))
