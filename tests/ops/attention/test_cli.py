"""`tiledispatch attention` and `tiledispatch explain attention`: JSON like `gemm`, errors as JSON."""

import json

from typer.testing import CliRunner

from tiledispatch.cli.main import app


def invoke(*args, code=0):
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return json.loads(result.stdout)


def test_attention_forward_and_backward_validated():
    doc = invoke("attention", "1", "4", "2", "19", "27", "32", "--causal", "--align", "bottom-right", "--backward",
                 "--validate", "--rule-set", "tiny")
    assert doc["status"] == "ok" and doc["validation"]["passed"]
    assert set(doc["validation"]) == {"out", "lse", "dq", "dk", "dv", "passed"}
    assert doc["problem"]["mask"] == "causal-br" and doc["problem"]["heads_kv"] == 2
    assert doc["kernel"]["family"] == "fwd" and doc["kernel"]["backward"]["family"].startswith("bwd")
    assert doc["execution"]["measures"] == "forward+backward" and doc["execution"]["time_ms"] > 0


def test_attention_window_softcap_bshd():
    doc = invoke("attention", "2", "2", "2", "16", "16", "64", "--window", "4,0", "--softcap", "20",
                 "--layout", "bshd", "--validate", "--rule-set", "tiny", "--dtype", "fp32")
    assert doc["status"] == "ok" and doc["problem"]["window"] == [4, 0] and doc["problem"]["layout"] == "bshd"


def test_explain_attention():
    doc = invoke("explain", "attention", "2", "8", "2", "512", "512", "128", "--causal",
                 "--rule-set", "tests", "--limit", "3")
    assert doc["problem"]["mask"] == "causal"  # top-left
    # a Triton d128 kernel, or on a GPU with cuDNN the sdpa-cudnn candidate
    assert doc["problem"]["op"] == "attention" and doc["selected"].startswith(
        ("attention_fwd_fp16_d128x128", "attention_fwd_fp16_sdpa-cudnn"))
    assert len(doc["ranking"]) == 3
    back = invoke("explain", "attention", "2", "8", "2", "512", "512", "128", "--backward", "--rule-set", "tests")
    assert back["selected"].startswith("attention_bwd")


def test_attention_forces_the_backward_kernel():
    shape = ("1", "2", "2", "16", "16", "32", "--rule-set", "tiny", "--dtype", "fp32")
    ranked = [c["kernel"] for c in invoke("explain", "attention", *shape, "--backward", "--limit", "0")["ranking"]]
    assert len(ranked) > 1
    doc = invoke("attention", *shape, "--backward", "--backward-kernel", ranked[1], "--validate")
    assert doc["validation"]["passed"]
    assert doc["kernel"]["backward"]["name"] == ranked[1] and doc["kernel"]["backward"]["forced"] is True
    doc = invoke("attention", *shape, "--backward-kernel", ranked[1], code=3)
    assert "add --backward" in doc["error"]["message"]


def test_bad_input_is_a_json_error():
    doc = invoke("attention", "1", "3", "2", "8", "8", "32", "--rule-set", "tiny", code=3)
    assert doc["status"] == "error" and "heads-group" in doc["error"]["message"]
    doc = invoke("attention", "1", "2", "2", "8", "8", "32", "--causal", "--align", "sideways", code=3)
    assert "top-left" in doc["error"]["message"]
    doc = invoke("explain", "attention", "1", "2", "2", "8", "8", "32", "--align", "bottom-right", code=3)
    assert "add --causal" in doc["error"]["message"]
    doc = invoke("explain", "attention", "1", "2", "2", "8", "8", "48", code=3)
    assert "head-dim" in doc["error"]["message"]
