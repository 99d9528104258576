"""`tiledispatch conv` and `tiledispatch explain conv`: JSON out, validation, JSON errors (exit 3: bad input)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tiledispatch.cli.main import app

from .helpers import ON_GPU


def invoke(*args: str, code: int = 0) -> dict:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return json.loads(result.stdout)


@pytest.mark.parametrize("args", [
    ("2", "8", "8", "2", "7", "6", "3", "3", "--pad", "1"),
    ("2", "4", "6", "2", "9", "3", "--stride", "2", "--direction", "bwd_data"),
    ("1", "4", "4", "4", "4", "5", "4", "3", "3", "3", "--pad", "1", "--direction", "bwd_weight"),
    ("2", "6", "4", "2", "6", "6", "3", "3", "--bias", "--activation", "gelu", "--residual", "--layout", "contiguous"),
], ids=["2d", "1d-bwd-data", "3d-bwd-weight", "epilogue-contiguous"])
def test_conv_runs_and_validates(args):
    doc = invoke("conv", *args, "--validate", "--rule-set", "tests", "--repeats", "3")
    assert doc["status"] == "ok" and doc["validation"]["passed"] and doc["validation"]["unwritten"] == 0
    assert doc["device"] == ("cuda" if ON_GPU else "cpu-interpreter")
    assert doc["kernel"]["name"].startswith("conv_") and doc["execution"]["time_ms"] > 0
    assert doc["problem"]["op"] == "conv" and doc["problem"]["flops"] > 0


def test_contiguous_layout_is_said_in_the_problem():
    doc = invoke("conv", "1", "4", "4", "1", "5", "5", "3", "3", "--layout", "contiguous", "--rule-set", "tiny",
                 "--repeats", "1")
    assert "converted" in doc["problem"]["layout"]


def test_forced_kernel_and_explain_agree():
    explained = invoke("explain", "conv", "2", "8", "8", "2", "7", "7", "3", "3", "--pad", "1", "--rule-set",
                       "tiny", "--limit", "0")
    assert explained["selected"] == explained["ranking"][0]["kernel"]
    assert explained["accepted"] == len(explained["ranking"]) and explained["refused_count"] > 0
    assert all("refused" in c for c in explained["refused"])
    ran = invoke("conv", "2", "8", "8", "2", "7", "7", "3", "3", "--pad", "1", "--rule-set", "tiny", "--repeats", "1")
    assert ran["kernel"]["name"] == explained["selected"]
    last = explained["ranking"][-1]["kernel"]
    forced = invoke("conv", "2", "8", "8", "2", "7", "7", "3", "3", "--pad", "1", "--rule-set", "tiny",
                    "--kernel", last, "--validate", "--repeats", "1")
    assert forced["kernel"]["name"] == last and forced["kernel"]["forced"] and forced["validation"]["passed"]


@pytest.mark.parametrize("args, error_type, words", [
    (("2", "8", "8", "3", "7", "7", "3", "3"), "InvalidProblemError", ["divisible by groups=3"]),
    (("2", "8", "8", "2", "7", "7", "3"), "InvalidProblemError", ["6 (1-D), 8 (2-D) or 10 (3-D)"]),
    (("2", "8", "8", "2", "2", "2", "3", "3"), "InvalidProblemError", ["output would be"]),
    (("2", "8", "8", "2", "7", "7", "3", "3", "--stride", "a"), "InvalidProblemError", ["--stride", "integer"]),
    (("2", "8", "8", "2", "7", "7", "3", "3", "--direction", "up"), "UnsupportedError", ["unknown direction"]),
    (("2", "8", "8", "2", "7", "7", "3", "3", "--dtype", "fp8"), "UnsupportedError", ["fp16, bf16, fp32"]),
    (("2", "8", "8", "2", "7", "7", "3", "3", "--direction", "bwd_data", "--bias"), "InvalidProblemError",
     ["forward conv only"]),
    (("2", "8", "8", "2", "7", "7", "3", "3", "--kernel", "nope"), "UnknownKernelError", ["no kernel named"]),
])
def test_bad_input_is_a_json_error(args, error_type, words):
    doc = invoke("conv", *args, "--rule-set", "tiny", code=3)
    assert doc["status"] == "error" and doc["error"]["type"] == error_type, doc
    for word in words:
        assert word in doc["error"]["message"], (word, doc)


def test_explain_bad_input_is_a_json_error():
    doc = invoke("explain", "conv", "2", "8", "8", "3", "7", "7", "3", "3", code=3)
    assert doc["error"]["type"] == "InvalidProblemError"
