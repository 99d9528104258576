"""The operands autotune and sweeps time a conv on: fresh tensors of exactly the problem, with no
`out`, as a user's call has none. A given `out` costs the vendor's call a copy of its result (a
pass over the output that kernels writing in place do not pay), which ranked cuDNN below itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiledispatch.bench.problemsets.files import load_problems
from tiledispatch.ops.conv import vendor
from tiledispatch.ops.conv.inputs import tuning_operands
from tiledispatch.ops.conv.plan import output_tensor

SWEEP = Path(__file__).resolve().parents[3] / "benchmarks/results/h200/selection/problems/sweep_conv_forward.json"


def small(problem) -> bool:
    return problem.bytes() < 4 << 20  # fresh CPU draws of the large ones cost seconds


@pytest.fixture(scope="module")
def problems():
    return [p for p in load_problems(SWEEP) if small(p)][:12]


def test_fresh_operands_reproduce_each_swept_problem_without_an_out(problems):
    assert len(problems) >= 8
    for problem in problems:
        operands = tuning_operands(problem, torch.device("cpu"), seed=1)
        assert operands is not None and operands.problem == problem
        assert operands.out is None


def test_the_vendor_call_on_them_takes_its_result_rather_than_copying_it(problems, monkeypatch):
    problem = next(p for p in problems if not p.epilogue.residual)
    operands = tuning_operands(problem, torch.device("cpu"), seed=2)
    out = output_tensor(operands)
    copies = []
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, *a, **k: copies.append(self))
    vendor.run(operands, out)
    assert copies == [] and out.shape == operands.output_shape() and torch.isfinite(out.float()).all()
