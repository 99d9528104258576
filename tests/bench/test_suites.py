"""The public benchmark suites as a sweep's problem source (bench/problemsets/suites.py): every
committed suite's cases posed as real calls pose them, the GEMM ones equal to the suite
benchmark's own, refusals named, and `tiledispatch sweep --problems SUITE --cases` end to end
on the interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiledispatch.bench.problemsets import is_suite_file, suite_problems
from tiledispatch.bench.sweep import read_table
from tiledispatch.cli.main import app
from tiledispatch.core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from tiledispatch.ops.gemm import check_operands as gemm_operands

SUITES = Path(__file__).resolve().parents[2] / "benchmarks" / "suites"


@pytest.mark.parametrize("name,op,dtype", [("gemm", "gemm", "fp8e4m3"), ("conv", "conv", "fp16"),
                                           ("attention", "attention", "bf16"), ("conv_depthwise_shapes", "conv", "bf16")])
def test_every_case_of_each_suite_is_posed_or_refused_with_a_reason(name, op, dtype):
    """Each case in each direction of its op gives one problem of that op, or one refusal saying why."""
    path = SUITES / f"{name}.json"
    data = json.loads(path.read_text())
    directions = {"gemm": ("forward",), "conv": ("forward", "bwd_data", "bwd_weight"), "attention": ("fwd", "bwd")}
    for case in data["cases"]:
        for direction in directions[op]:
            problems, refused = suite_problems(path, op, dtype, direction, (case["name"],))
            assert len(problems) + len(refused) == 1, (case["name"], direction)
            assert all(p.op.value == op for p in problems)
            assert all(r.reason and r.what == f"{case['name']} {direction}" for r in refused)


def test_gemm_cases_are_the_suite_benchmarks_problems():
    """A row-major A and the transposed view of a row-major N x K B, as benchmarks/gemm.py poses them."""
    import torch

    data = json.loads((SUITES / "gemm.json").read_text())
    problems, _ = suite_problems(SUITES / "gemm.json", "gemm", "bf16")
    expected = []
    for case in data["cases"]:
        lead = (case["batch"],) if case["batch"] > 1 else ()
        a = torch.empty(*lead, case["M"], case["K"], device="meta", dtype=torch.bfloat16)
        b = torch.empty(*lead, case["N"], case["K"], device="meta", dtype=torch.bfloat16).transpose(-1, -2)
        expected.append(gemm_operands(a, b).problem)
    assert problems == tuple(dict.fromkeys(expected))


def test_conv_and_attention_cases_keep_their_geometry_and_modes():
    conv, _ = suite_problems(SUITES / "conv.json", "conv", "bf16", "bwd_weight", ("resnet50_3x3",))
    (p,) = conv
    assert (p.n, p.c, p.k, p.groups, p.input_size, p.filter_size, p.padding) == (32, 256, 256, 1, (14, 14), (3, 3),
                                                                                 (1, 1))
    assert p.direction.value == "bwd_weight" and p.specialization.channel_multiple > 1  # posed from real strides
    data = json.loads((SUITES / "attention.json").read_text())
    problems, refused = suite_problems(SUITES / "attention.json", "attention", "bf16", "backward")
    decode = [c["name"] for c in data["cases"] if c["mode"] == "decode"]
    paged = [c["name"] for c in data["cases"] if c["mode"] == "paged"]
    reasons = {r.what.split()[0]: r.reason for r in refused}
    assert all("forward only" in reasons[name] for name in decode) and all("paged" in reasons[name] for name in paged)
    assert len(problems) == len({(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Skv"], c["D"], c["causal"])
                                 for c in data["cases"] if c["mode"] == "prefill"})


def test_bad_suites_and_arguments_are_refused_by_name(tmp_path):
    suite = SUITES / "conv.json"
    with pytest.raises(InvalidArgumentError, match="pass --op conv"):
        suite_problems(suite, "gemm", "bf16")
    with pytest.raises(InvalidArgumentError, match="not_a_case"):
        suite_problems(suite, "conv", "bf16", cases=("not_a_case",))
    with pytest.raises(UnsupportedError, match="fp8e4m3"):
        suite_problems(suite, "conv", "fp8e4m3")
    with pytest.raises(InvalidArgumentError, match="direction"):
        suite_problems(suite, "conv", "bf16", "sideways")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"description": "", "dtypes": ["bf16"], "cases": [{"name": "x", "M": 8, "N": 8}]}))
    with pytest.raises(InvalidProblemError, match="one op"):
        suite_problems(broken, "gemm", "bf16")
    broken.write_text(json.dumps({"description": "", "dtypes": ["bf16"],
                                  "cases": [{"name": "x", "C": 8, "K": 8, "G": 1, "filter": [1, 1]}]}))
    with pytest.raises(InvalidProblemError, match="lacks"):
        suite_problems(broken, "conv", "bf16")
    assert is_suite_file(suite) and not is_suite_file(tmp_path / "missing.json")
    with pytest.raises(InvalidProblemError, match="missing.json"):
        suite_problems(tmp_path / "missing.json", "conv", "bf16")


def test_cli_sweeps_chosen_cases_of_a_suite(tmp_path):
    suite = tmp_path / "tiny_suite.json"
    suite.write_text(json.dumps({"description": "two small GEMMs", "dtypes": ["fp16"], "cases": [
        {"name": "small", "M": 33, "N": 24, "K": 40, "batch": 1},
        {"name": "other", "M": 5, "N": 48, "K": 24, "batch": 1}]}))
    result = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(suite), "--cases", "small",
                                      "--dtype", "fp16", "--rule-set", "tiny", "--top", "1",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["problem_set"] == "tiny_suite" and document["problems"] == 1 and document["rows"] == {"ok": 1}
    table = read_table(tmp_path / "out")
    assert json.loads(table.problem.iloc[0])["m"] == 33
    no_dtype = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(suite),
                                        "--out", str(tmp_path / "x")])
    assert no_dtype.exit_code != 0 and "--dtype" in json.loads(no_dtype.stdout)["error"]["message"]
    not_suite = tmp_path / "problems.json"
    not_suite.write_text("[]")
    stray = CliRunner().invoke(app, ["sweep", "--op", "gemm", "--problems", str(not_suite), "--cases", "small",
                                     "--dtype", "fp16", "--out", str(tmp_path / "y")])
    assert stray.exit_code != 0 and "--cases" in json.loads(stray.stdout)["error"]["message"]
