"""The `tiledispatch` command: JSON out, JSON errors with exit code 3 (bad input), every sub-command."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tiledispatch import arch
from tiledispatch.core.cache import CacheEntry, KernelCache
from tiledispatch.core.registry import Registry
from tiledispatch.cli.main import app

from ..conftest import on_gpu

# These pin what the CPU interpreter is (its arch name, kernel names ending in _interp, its
# registry counts); on a GPU the same commands run through tests/ops/*/test_gpu.py instead.
pytestmark = pytest.mark.skipif(on_gpu(), reason="the CLI tests pin the interpreter's arch, names and counts")

SMALL = "gemm_fp16_rrr_tiled_16x32x32_w2_s1_g1_k1_none_interp"  # in the tiny rule set
BUILD_ONE = "gemm_fp16_rcr_tiled_32x32x32_w4_s2_g4_k1_none_sm90"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    os.chmod(tmp_path, 0o700)
    root = tmp_path / "cache"
    monkeypatch.setenv("TILEDISPATCH_CACHE_DIR", str(root))
    return root


def invoke(*args: str, code: int = 0):
    """Runs the command; returns its stdout parsed as JSON, after checking the exit code."""
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return json.loads(result.stdout)


def invoke_error(*args: str, error_type: str | None = None) -> dict:
    doc = invoke(*args, code=3)  # ExitCode.BAD_INPUT
    assert doc["status"] == "error" and doc["exit_code"] == 3
    assert set(doc["error"]) == {"type", "message"} and doc["error"]["message"]
    if error_type is not None:
        assert doc["error"]["type"] == error_type, doc
    return doc["error"]


# --- gemm ------------------------------------------------------------------------------


def test_gemm_in_a_real_subprocess(tmp_path):
    os.chmod(tmp_path, 0o700)
    exe = shutil.which("tiledispatch") or str(Path(sys.executable).with_name("tiledispatch"))
    env = {**os.environ, "TRITON_INTERPRET": "1", "TILEDISPATCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([exe, "gemm", "96", "80", "72", "--dtype", "fp16", "--validate"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "ok"
    assert doc["device"] == "cpu-interpreter" and doc["arch"] == "interpreter"
    assert (doc["problem"]["m"], doc["problem"]["n"], doc["problem"]["k"]) == (96, 80, 72)
    assert doc["problem"]["dtype"] == "fp16" and doc["problem"]["flops"] == 2 * 96 * 80 * 72
    assert doc["validation"]["passed"] is True and doc["validation"]["unwritten"] == 0
    assert doc["validation"]["relative_error"] <= doc["validation"]["tolerance"]
    assert doc["kernel"]["name"].endswith("_interp") and doc["kernel"]["forced"] is False
    assert doc["execution"]["method"] == "wall-clock" and doc["execution"]["time_ms"] > 0


def test_gemm_selected_kernel_matches_explain():
    doc = invoke("gemm", "64", "48", "32", "--rule-set", "tiny", "--validate")
    explained = invoke("explain", "gemm", "64", "48", "32", "--rule-set", "tiny")
    assert doc["kernel"]["name"] == explained["selected"]
    assert doc["kernel"]["rule_set"] == "tiny" and doc["kernel"]["strategy"] == "rules"
    assert doc["validation"]["passed"]


def test_gemm_forced_kernel():
    doc = invoke("gemm", "40", "24", "48", "--rule-set", "tiny", "--kernel", SMALL, "--validate")
    assert doc["status"] == "ok"
    assert doc["kernel"]["name"] == SMALL and doc["kernel"]["forced"] is True
    assert doc["validation"]["passed"]


def test_gemm_layout_rcr():
    doc = invoke("gemm", "40", "24", "48", "--layout", "rcr", "--rule-set", "tiny", "--validate")
    assert doc["problem"]["layout"] == "rcr"
    layout = doc["kernel"]["name"].split("_")[2]
    assert layout in ("rcr", "sss")
    assert doc["validation"]["passed"]


def test_gemm_with_a_full_epilogue():
    doc = invoke("gemm", "40", "24", "48", "--bias", "--activation", "gelu", "--residual",
                 "--rule-set", "tiny", "--validate")
    assert doc["problem"]["epilogue"] == "bias-gelu-res"
    assert doc["kernel"]["name"].endswith("_bias-gelu-res_interp")
    assert doc["validation"]["passed"]


def test_gemm_batched_fp32_strategy_first():
    doc = invoke("gemm", "17", "9", "33", "--batch", "3", "--dtype", "fp32", "--strategy", "first",
                 "--rule-set", "tiny", "--validate")
    assert doc["problem"]["batch"] == 3 and doc["problem"]["dtype"] == "fp32"
    assert doc["kernel"]["strategy"] == "first"
    first = next(s for s in Registry.from_rule_set("gemm", "tiny", arch.load("interpreter"))
                 if s.dtype == "fp32" and s.config.layout.name == "rrr" and s.config.epilogue.name == "none")
    assert doc["kernel"]["name"] == first.name
    assert doc["validation"]["passed"]


@pytest.mark.parametrize("args, error_type, words", [
    (["8", "8", "8", "--dtype", "int8"], "UnsupportedError", ["int8"]),
    (["8", "8", "8", "--layout", "xyz"], "UnsupportedError", ["xyz", "r/c/s"]),
    (["0", "8", "8"], "InvalidProblemError", ["M=0"]),
    (["8", "8", "8", "--batch", "0"], "InvalidProblemError", ["BATCH=0"]),
    (["8", "8", "8", "--activation", "tanh"], "UnsupportedError", ["tanh"]),
    (["8", "8", "8", "--strategy", "fastest"], "UnsupportedError", ["fastest", "rules"]),
    (["8", "8", "8", "--rule-set", "huge"], "UnsupportedError", ["huge", "tiny"]),
    (["8", "8", "8", "--rule-set", "tiny", "--kernel", "gemm_nope"], "UnknownKernelError", ["gemm_nope"]),
    (["8", "8", "8", "--rule-set", "tiny", "--layout", "rcr", "--kernel", SMALL], "UnsupportedError",
     ["cannot run this problem"]),
    (["8", "8", "8", "--rule-set", "tiny", "--dtype", "bf16"], "NoKernelError", ["bf16"]),
])
def test_gemm_bad_input_is_a_json_error(args, error_type, words):
    error = invoke_error("gemm", *args, error_type=error_type)
    for word in words:
        assert word in error["message"]


def test_explain_bad_input_is_a_json_error():
    invoke_error("explain", "gemm", "8", "8", "8", "--dtype", "int8", error_type="UnsupportedError")


# --- explain ---------------------------------------------------------------------------


def test_explain_gemm():
    doc = invoke("explain", "gemm", "100", "60", "40", "--layout", "rcr", "--rule-set", "tests", "--limit", "0")
    assert doc["problem"]["layout"] == "rcr" and doc["arch"] == "interpreter" and doc["strategy"] == "rules"
    ranking, refused = doc["ranking"], doc["refused"]
    assert len(ranking) == doc["accepted"] > 1 and len(refused) == doc["refused_count"] > 0
    assert doc["selected"] == ranking[0]["kernel"]
    scores = [c["score"] for c in ranking]
    assert scores == sorted(scores, reverse=True)
    assert all({"tile_m", "tile_n", "waves"} <= set(c["terms"]) for c in ranking)
    assert all(c["refused"] and "score" not in c for c in refused)
    total = len(Registry.from_rule_set("gemm", "tests", arch.load("interpreter")))
    assert doc["accepted"] + doc["refused_count"] == total
    # What a CUDA graph's replays of the call would run (ranking.replay_pick): one of the candidates.
    assert doc["graph_replay"] in {c["kernel"] for c in ranking}


def test_explain_gemm_sees_the_alignment_of_fresh_tensors():
    """Rows of 37 halves (74 bytes) take no TMA and no vector loads: explain says so, as the
    `gemm` command would find it, and ranks the realign variants (at this size their copies'
    launches outweigh them); rows of 40 halves need none."""
    odd = invoke("explain", "gemm", "40", "48", "37", "--layout", "rcr", "--rule-set", "tests", "--limit", "0")
    assert odd["problem"]["alignment"] == "al-002120"  # A, B below 16 bytes; C, M, N, K as they are
    assert any("realign" in c["kernel"] and c["terms"]["realign_us"] > 0 for c in odd["ranking"])
    even = invoke("explain", "gemm", "40", "48", "40", "--layout", "rcr", "--rule-set", "tests", "--limit", "0")
    assert even["problem"]["alignment"] == "al-112121" and not any("realign" in c["kernel"] for c in even["ranking"])


def test_explain_ranks_for_an_arch_it_is_asked_for():
    """--arch: what a GPU would pick, asked on any machine (explain runs nothing); the same ranking as
    a dispatcher for that arch gives, and an unknown arch named with the known ones."""
    from tiledispatch.core.dispatcher import Dispatcher
    from tiledispatch.ops.conv import Direction, check_operands

    doc = invoke("explain", "gemm", "1000", "4096", "4096", "--dtype", "bf16", "--layout", "rcr", "--arch", "sm_90",
                 "--limit", "0")
    assert doc["arch"] == "sm_90" and all(c["kernel"].endswith("_sm90") for c in doc["ranking"])
    conv = invoke("explain", "conv", "8", "64", "64", "1", "28", "28", "3", "3", "--dtype", "bf16", "--pad", "1",
                  "--arch", "sm_90", "--limit", "0")
    sm90 = arch.load("sm_90")
    x = torch.empty(8, 64, 28, 28, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
    w = torch.empty(64, 64, 3, 3, dtype=torch.bfloat16, device="meta").to(memory_format=torch.channels_last)
    problem = check_operands(Direction.FORWARD, x=x, w=w, padding=1).problem
    ranked = Dispatcher(Registry.from_rule_set("conv", "default", sm90), sm90).ranked(problem)
    assert [c["kernel"] for c in conv["ranking"]] == [c.spec.name for c in ranked]
    assert "sm_90" in invoke_error("explain", "gemm", "10", "10", "10", "--arch", "sm_999")["message"]


def test_explain_shows_the_pick_an_eager_call_runs_where_it_weighs_host_time():
    """core.hostcost: on a GPU arch, a conv pick of ours that saves less device time than an eager call's
    host time over cuDNN runs cuDNN eagerly (`eager`), one that saves more runs itself; a GEMM's
    eager call is weighed alike (`eager`, and `recorded` for a recorded call). The interpreter weighs nothing."""
    small = invoke("explain", "conv", "8", "48", "48", "2", "28", "28", "3", "3", "--dtype", "bf16", "--pad", "1",
                   "--arch", "sm_90", "--rule-set", "default", "--strategy", "rules", "--limit", "0")
    assert "_vendor_" not in small["selected"] and small["eager"] == "conv_fwd_bf16_vendor_none_sm90"
    # regnet's grouped 3x3: cuDNN runs it at a quarter of igemm's speed, a saving above the host time
    regnet = invoke("explain", "conv", "32", "336", "336", "14", "14", "14", "3", "3", "--dtype", "bf16", "--pad",
                    "1", "--arch", "sm_90", "--rule-set", "default", "--strategy", "rules", "--limit", "0")
    assert "_igemm_" in regnet["selected"] and regnet["eager"] == regnet["selected"]
    gemm = invoke("explain", "gemm", "4096", "4096", "4096", "--dtype", "bf16", "--layout", "rcr", "--arch",
                  "sm_90", "--rule-set", "default", "--strategy", "rules", "--limit", "0")
    assert gemm["eager"] == gemm["recorded"] and gemm["eager"] in {c["kernel"] for c in gemm["ranking"]}
    interpreter = invoke("explain", "conv", "2", "8", "8", "2", "7", "7", "3", "3", "--pad", "1", "--rule-set",
                         "tests", "--limit", "0")
    assert interpreter["eager"] == interpreter["selected"]


def test_explain_limit():
    doc = invoke("explain", "gemm", "64", "64", "64", "--rule-set", "tiny", "--limit", "2")
    assert len(doc["ranking"]) == 2 and len(doc["refused"]) == 2
    assert doc["accepted"] > 2 and doc["refused_count"] > 2


# --- registry --------------------------------------------------------------------------


def test_registry_list_counts():
    interp = Registry.from_rule_set("gemm", "tiny", arch.load("interpreter"))
    doc = invoke("registry", "list", "--rule-set", "tiny", "--limit", "5")
    assert doc["total"] == len(interp)
    assert doc["counts"]["by_op"] == {"gemm": len(interp)} and doc["counts"]["by_arch"] == {"interpreter": len(interp)}
    assert sum(doc["counts"]["by_dtype"].values()) == len(interp)
    assert doc["kernels"] == [s.name for s in interp][:5]

    sm90 = invoke("registry", "list", "--rule-set", "tiny", "--arch", "sm_90", "--limit", "0")
    assert sm90["total"] == len(sm90["kernels"]) == len(Registry.from_rule_set("gemm", "tiny", arch.load("sm_90")))
    assert "bf16" in sm90["counts"]["by_dtype"] and "bf16" not in doc["counts"]["by_dtype"]


def test_registry_list_filters():
    doc = invoke("registry", "list", "--rule-set", "tiny", "--dtype", "fp16", "--name-contains", "_rcr_", "--limit", "0")
    assert doc["total"] == len(doc["kernels"]) > 0
    assert doc["counts"]["by_dtype"] == {"fp16": doc["total"]}
    assert all("_fp16_rcr_" in name for name in doc["kernels"])
    assert invoke("registry", "list", "--rule-set", "tiny", "--family", "nope")["total"] == 0


def test_registry_list_bad_arch_and_op():
    invoke_error("registry", "list", "--arch", "sm_99", error_type="ArchError")
    invoke_error("registry", "list", "--op", "nope", error_type="UnsupportedError")


def test_registry_export_import_round_trip(tmp_path):
    f, g = tmp_path / "f.json", tmp_path / "g.json"
    exported = invoke("registry", "export", "-o", str(f), "--rule-set", "tiny", "--arch", "sm_90")
    assert exported["status"] == "ok" and exported["written"] == str(f)
    imported = invoke("registry", "import", str(f), "-o", str(g))
    assert imported["status"] == "ok" and imported["total"] == exported["total"] and imported["written"] == str(g)
    assert imported["counts"] == exported["counts"]
    f_doc, g_doc = json.loads(f.read_text()), json.loads(g.read_text())
    assert f_doc["kernels"] == g_doc["kernels"] and len(f_doc["kernels"]) == exported["total"]
    assert f_doc["total"] == g_doc["total"] and f_doc["counts"] == g_doc["counts"] and g_doc["arch"] == "sm_90"


def test_registry_import_without_output(tmp_path):
    f = tmp_path / "f.json"
    invoke("registry", "export", "-o", str(f), "--rule-set", "tiny", "--dtype", "fp32")
    doc = invoke("registry", "import", str(f))
    assert doc["status"] == "ok" and "written" not in doc and doc["counts"]["by_dtype"] == {"fp32": doc["total"]}


@pytest.mark.parametrize("content, words", [
    (None, ["not valid JSON", "truncated"]),  # the first half of a real export
    ('{"format": "other"}', ["not a valid tiledispatch registry", "format"]),
    ("", ["not valid JSON"]),
])
def test_registry_import_of_a_corrupt_file(tmp_path, content, words):
    f = tmp_path / "bad.json"
    if content is None:
        invoke("registry", "export", "-o", str(f), "--rule-set", "tiny")
        text = f.read_text()
        content = text[: len(text) // 2]
    f.write_text(content)
    error = invoke_error("registry", "import", str(f), error_type="RegistryFormatError")
    for word in words:
        assert word in error["message"]


def test_registry_import_of_a_missing_file_or_a_directory(tmp_path):
    assert "does not exist" in invoke_error("registry", "import", str(tmp_path / "nope.json"))["message"]
    assert "cannot read" in invoke_error("registry", "import", str(tmp_path))["message"]


def test_registry_export_to_an_unwritable_place(tmp_path):
    error = invoke_error("registry", "export", "--rule-set", "tiny", "-o", str(tmp_path / "no" / "dir" / "f.json"))
    assert "No such file or directory" in error["message"]


# --- cache -----------------------------------------------------------------------------


def fake_entry(root: Path, name: str) -> CacheEntry:
    def builder(staging: Path) -> dict:
        (staging / "kernel.cubin").write_bytes(b"\x7fELF" + name.encode() * 10)
        return {"stage": "main", "arch": "sm_90"}
    return KernelCache(root).get_or_build(KernelCache.make_key(name, "src", {"triton": "x"}), builder)


def test_cache_commands_on_an_empty_cache(cache_dir):
    info = invoke("cache", "info")
    assert info == {"root": str(cache_dir), "entries": 0, "invalid": 0, "bytes": info["bytes"]}
    assert invoke("cache", "ls") == []
    assert invoke("cache", "prune") == {"removed": 0}
    assert invoke("cache", "clear") == {"removed": 0}
    assert (cache_dir / "v1").is_dir()  # made private and in place


def test_cache_commands_on_a_populated_cache(cache_dir):
    good = fake_entry(cache_dir, "gemm_good")
    bad = fake_entry(cache_dir, "gemm_bad")
    old = fake_entry(cache_dir, "gemm_old")

    info = invoke("cache", "info")
    assert info["entries"] == 3 and info["invalid"] == 0 and info["bytes"] >= good.size_bytes * 3
    rows = {r["key"]: r for r in invoke("cache", "ls")}
    assert set(rows) == {good.key, bad.key, old.key}
    assert rows[good.key] == {"key": good.key, "bytes": good.size_bytes, "valid": True, "stage": "main", "arch": "sm_90"}

    (bad.path / "kernel.cubin").write_bytes(b"tampered")
    rows = {r["key"]: r for r in invoke("cache", "ls")}
    assert rows[bad.key]["valid"] is False and "checksum" in rows[bad.key]["reason"]
    assert invoke("cache", "info")["invalid"] == 1

    assert invoke("cache", "prune") == {"removed": 1}  # only the corrupted one
    assert {r["key"] for r in invoke("cache", "ls")} == {good.key, old.key}

    long_ago = time.time() - 10 * 86400
    os.utime(old.path / "manifest.json", (long_ago, long_ago))
    assert invoke("cache", "prune", "--older-than-days", "5") == {"removed": 1}
    assert [r["key"] for r in invoke("cache", "ls")] == [good.key]

    assert invoke("cache", "clear") == {"removed": 1}
    assert invoke("cache", "ls") == [] and invoke("cache", "info")["entries"] == 0


def test_cache_in_an_insecure_directory_is_a_json_error(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TILEDISPATCH_CACHE_DIR", str(shared))
    error = invoke_error("cache", "info", error_type="InsecureCacheError")
    assert "700" in error["message"] and "TILEDISPATCH_CACHE_DIR" in error["message"]  # says how to fix it


# --- arch and build --------------------------------------------------------------------


def test_arch_sm90():
    doc = invoke("arch", "sm_90")
    assert doc["name"] == "sm_90" and doc["sm_count"] == 132 and doc["compute_capability"] == [9, 0]
    assert invoke("arch", "90")["name"] == "sm_90"


def test_arch_of_this_machine_is_the_interpreter():
    assert invoke("arch")["name"] == "interpreter"


def test_arch_unknown():
    assert "sm_99" in invoke_error("arch", "sm_99", error_type="ArchError")["message"]


def test_build_for_the_interpreter_compiles_nothing(cache_dir):
    doc = invoke("build", "--arch", "interpreter")
    assert doc["status"] == "ok" and doc["built"] == 0 and "not compiled" in doc["note"]
    assert not cache_dir.exists() or invoke("cache", "ls") == []


def test_build_unknown_arch():
    invoke_error("build", "--arch", "sm_99", error_type="ArchError")


def test_build_one_kernel_for_sm90(cache_dir):
    doc = invoke("build", "--arch", "sm_90", "--rule-set", "tiny", "--name-contains", BUILD_ONE, "-j", "1")
    assert doc["status"] == "ok" and doc["arch"] == "sm_90" and doc["cache"] == str(cache_dir)
    assert doc["built"] == 1 and doc["failed"] == []
    rows = invoke("cache", "ls")
    assert rows and all(r["valid"] and r["arch"] == "sm_90" and r["key"].startswith(BUILD_ONE) for r in rows)
    assert len(rows) == 2  # one per alignment specialisation
