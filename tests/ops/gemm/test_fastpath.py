"""The gemm fast path (ops/gemm/fastpath.py): a bound plan replayed on new tensors of the same signature.

A call is bound on one set of inputs and replayed twice on fresh ones (other values, NaN-poisoned
out), each compared with the float64 reference: the first candidate of each family the interpreter
runs (split-K workspaces and realigned copies among them), with and without the caller's out, and
the vendor stage's 3-D view of 2-D operands. Public calls bind only GPU tensors; here `bind` is
driven directly.
"""

from __future__ import annotations

import os

import pytest

import torch

from tiledispatch import Dispatcher, Registry
from tiledispatch.core.dtypes import DType
from tiledispatch.core.kernel import PythonLauncher
from tiledispatch.core.op import get_op
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import Epilogue, GemmProblem, GemmTypes, VendorConfig, check_operands, fastpath
from tiledispatch.ops.gemm.inputs import make_inputs
from tiledispatch.ops.gemm.reference import compare

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
ARCH = current_arch()
FP32 = GemmTypes(DType.FP32, DType.FP32, DType.FP32)
FP16 = GemmTypes(DType.FP16, DType.FP16, DType.FP16)
CASES = {  # m, n, k, batch, types, epilogue
    "plain": (33, 40, 48, 1, FP32, Epilogue()),
    "epilogue-batched": (24, 32, 40, 2, FP32, Epilogue(bias=True, residual=True)),
    "deep-k": (16, 16, 256, 1, FP32, Epilogue()),
    "unaligned-rows": (20, 24, 37, 1, FP16, Epilogue()),  # 74-byte rows: the realign family's
}


def _problem(case: str) -> GemmProblem:
    m, n, k, batch, types, epilogue = CASES[case]
    shape = GemmProblem(m, n, k, batch, types, epilogue=epilogue)
    (a, b), kwargs = _inputs(shape, 0)
    return check_operands(a, b, **kwargs).problem


def _inputs(p: GemmProblem, seed: int, own_out: bool = True):
    made = make_inputs(p, seed=seed)
    kwargs = made.kwargs() | ({} if own_out else {"out": None})
    return (made.a, made.b), kwargs


def _kernels() -> list[tuple[str, str]]:
    dispatcher = Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)
    out = []
    for case in CASES:
        first: dict[str, str] = {}
        for candidate in dispatcher.explain(_problem(case)).ranked:
            name = candidate.spec.name
            split = "_k1_" not in name  # split-K's workspace and its reduce stage
            first.setdefault((candidate.spec.family, "realign" in name, split), name)
        out += [(case, name) for name in sorted(first.values())]
    return out


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("gemm", "tests", ARCH), ARCH)


def _replay_and_check(bound, p: GemmProblem, own_out: bool) -> None:
    for seed in (1, 2):  # twice: the second call finds the first's buffers and pointers
        (a, b), kwargs = _inputs(p, seed, own_out)
        result = bound(a, b, kwargs["bias"], kwargs["residual"], kwargs["out"], kwargs["scale_a"], kwargs["scale_b"])
        if own_out:
            assert result is kwargs["out"]
        (a, b), kwargs = _inputs(p, seed)
        cmp = compare(result.reshape(p.batch, p.m, p.n), check_operands(a, b, **kwargs))
        assert cmp.passed, cmp.to_dict()


@pytest.mark.skipif(ON_GPU, reason="the GPU's own calls bind through the public function (test_gpu.py)")
@pytest.mark.parametrize(("case", "kernel"), _kernels(), ids=lambda v: v.split("_")[-1] if "_" in v else v)
@pytest.mark.parametrize("own_out", [True, False], ids=["out", "allocated"])
def test_a_bound_call_replays_on_new_tensors(dispatcher, case, kernel, own_out):
    p = _problem(case)
    (a, b), kwargs = _inputs(p, 0, own_out)
    bound = fastpath.bind(dispatcher, check_operands(a, b, **kwargs), kernel, result_2d=a.dim() == 2)
    assert isinstance(bound, fastpath.BoundGemm)
    _replay_and_check(bound, p, own_out)


@pytest.mark.parametrize("case", ["plain", "epilogue-batched"])
def test_the_vendor_stage_replays_on_new_tensors(case):
    """The vendor's Python stage reads the 3-D view it was planned with, rebuilt from each call's
    tensor; bound by hand (the interpreter's registry has no vendor), on PyTorch's CPU matmul."""
    p = _problem(case)
    config = VendorConfig(p.types, p.layout, p.epilogue)
    definition = get_op("gemm")
    (a, b), kwargs = _inputs(p, 0)
    ops = check_operands(a, b, **kwargs)
    launchers = {unit.stage: PythonLauncher(unit) for unit in definition.kernel_units(config, p.alignment, ARCH)}
    bound = fastpath.BoundGemm(ops, definition.plan(config, ops), launchers, result_2d=a.dim() == 2)
    _replay_and_check(bound, p, own_out=True)


def test_a_model_s_parameters_have_a_signature():
    """A Linear's weight and bias are nn.Parameters: a signature stands for them as for tensors
    (a model whose calls all took the checked path ran several times slower than PyTorch)."""
    from tiledispatch.core.replay import tensor_meta

    bias = torch.nn.Parameter(torch.randn(8))
    assert fastpath._optional(bias) == tensor_meta(bias)
    assert fastpath._optional(bias.detach()._neg_view()) is fastpath._NOT_A_TENSOR
