"""The command line under hostile input: issue 38's reproducers, each a JSON error with its
documented exit code (cli/common.py's ExitCode), never a traceback, a hang or a silent
acceptance."""

from __future__ import annotations

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

from tiledispatch.cli import limits
from tiledispatch.cli.common import ExitCode
from tiledispatch.cli.main import app
from tiledispatch.core.cache import KernelCache
from tiledispatch.core.comparison import Comparison
from tiledispatch.core.errors import UnsupportedError

from ..conftest import on_gpu

pytestmark = pytest.mark.skipif(on_gpu(), reason="runs the interpreter's small problems in process")

FAST = ("--rule-set", "tiny", "--repeats", "1")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("TILEDISPATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEDISPATCH_DEBUG", raising=False)


def strict_json(text: str):
    """One JSON document, strict: NaN and Infinity are not JSON."""
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name} in {text[:200]!r}")
    return json.loads(text, parse_constant=refuse)


def run(*args: str, code: int, **kwargs):
    result = CliRunner().invoke(app, list(args), **kwargs)
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result


def error(*args: str, code: int = ExitCode.BAD_INPUT, words=()) -> dict:
    doc = strict_json(run(*args, code=code).stdout)
    assert doc["status"] == "error" and doc["exit_code"] == code, doc
    for word in words:
        assert word in doc["error"]["message"], (word, doc)
    return doc["error"]


# --- 1. registry files: bounded, regular files only --------------------------------------


def test_registry_import_of_deeply_nested_json(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    err = error("registry", "import", str(deep), words=[str(deep), "nests deeper"])
    assert err["type"] == "RegistryFormatError"


@pytest.mark.parametrize("make, words", [
    (lambda d: Path("/dev/zero"), ["not a regular file"]),
    (lambda d: d, ["not a regular file"]),
    (lambda d: (d / "big.json", os.truncate(_touch(d / "big.json"), (64 << 20) + 1))[0], ["bytes"]),
    (lambda d: (d / "bin.json", (d / "bin.json").write_bytes(bytes(range(256)) * 4))[0], ["UTF-8"]),
    (lambda d: (d / "loop", os.symlink(d / "loop2", d / "loop"), os.symlink(d / "loop", d / "loop2"))[0],
     ["cannot read"]),
], ids=["dev-zero", "directory", "huge", "binary", "symlink-loop"])
def test_registry_import_of_unusable_files(tmp_path, make, words):
    path = make(tmp_path)
    err = error("registry", "import", str(path), words=[str(path), *words])
    assert err["type"] == "RegistryFormatError"


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def _console_script() -> str:
    return shutil.which("tiledispatch") or str(Path(sys.executable).with_name("tiledispatch"))


def test_registry_import_of_a_fifo_returns_at_once(tmp_path):
    """A FIFO that nobody writes would block a plain open(); the subprocess's timeout detects a hang."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([_console_script(), "registry", "import", str(fifo)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == ExitCode.BAD_INPUT, proc
    doc = strict_json(proc.stdout)
    assert doc["error"]["type"] == "RegistryFormatError" and "not a regular file" in doc["error"]["message"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["export", "import"])
def test_registry_output_to_a_fifo_is_refused(tmp_path, command):
    """Writing to a FIFO waits for a reader. One is held open here (non-blocking), so that a
    regression fails this test (exit 0) instead of hanging it."""
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        source = tmp_path / "in.json"
        run("registry", "export", "--rule-set", "tiny", "--dtype", "fp32", "--name-contains", "_rrr_", "-o",
            str(source), code=0)
        args = ["export", "--rule-set", "tiny"] if command == "export" else ["import", str(source)]
        error("registry", *args, "-o", str(fifo), words=[str(fifo), "not a regular file"])
    finally:
        os.close(reader)


# --- 2. sizes past the memory: refused before anything is allocated ----------------------


@pytest.mark.parametrize("args", [
    ("gemm", "100000", "100000", "16"),
    ("attention", "1", "1", "1", "2147483648", "16", "32"),  # issue 38's two reproducers
    ("gemm", "20000", "20000", "16", "--validate"),
    ("attention", "1", "8", "8", "65536", "65536", "64", "--validate"),  # the reference's scores
    ("conv", "32", "64", "64", "1", "256", "256", "3", "3", "--pad", "1"),
], ids=lambda v: " ".join(v))
def test_problems_past_the_memory_are_refused_before_allocating(monkeypatch, args):
    monkeypatch.setattr(limits, "host_available", lambda: 1 << 30)  # as on a 1 GiB machine, on any machine
    drawn = []
    monkeypatch.setattr(torch, "randn", lambda *a, **k: drawn.append(a))  # nothing may be drawn
    err = error(*args, *FAST)
    assert not drawn
    assert err["type"] in ("UnsupportedError", "InvalidProblemError"), err


def test_the_memory_refusal_says_how_much():
    footprint = limits.gemm_footprint(_gemm_problem(20000, 20000, 16), validate=True)
    assert footprint.device == 2 * (20000 * 16 * 2 + 20000 * 20000)  # fp16 A, B, C
    assert footprint.host > 8 * 20000 * 20000  # the float64 reference copies
    with pytest.raises(UnsupportedError, match="GiB of host memory"):
        limits.check_fits(footprint, on_gpu=False) if limits.host_available() is None else \
            limits.check_fits(limits.Footprint(0, 10 * limits.host_available()), on_gpu=False)


def _gemm_problem(m, n, k):
    from tiledispatch.ops.gemm import GemmProblem
    return GemmProblem(m=m, n=n, k=k)


def test_explain_of_a_problem_no_machine_holds_is_refused():
    words = ["2**62"]
    error("explain", "gemm", "2147483647", "2147483647", "2147483647", "--batch", "2147483647", words=words)
    error("explain", "gemm", "16", "16", "16", "--batch", "99999999999999999999999", words=words)


@pytest.mark.parametrize("failure", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: you tried to "
                 "allocate 20000000000 bytes."),
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 20000000000 bytes"),
    MemoryError(),
], ids=["cuda-oom", "not-enough", "cant-allocate", "memory-error"])
def test_an_allocation_that_fails_anyway_is_a_json_error(monkeypatch, failure):
    def fail(*args, **kwargs):
        raise failure
    monkeypatch.setattr("tiledispatch.cli.gemm.make_inputs", fail)
    err = error("gemm", "16", "16", "16", *FAST, words=["not enough memory", "smaller sizes"])
    assert err["type"] == type(failure).__name__


# --- 3, 4, 5. out-of-range numbers ----------------------------------------------------------


@pytest.mark.parametrize("seed", [str(2**70), str(2**63), "-1", "x"])
def test_bad_seeds_are_usage_errors(seed):
    assert "--seed" in error("gemm", "16", "16", "16", "--seed", seed, code=ExitCode.USAGE)["message"]


def test_the_largest_seed_runs():
    doc = strict_json(run("gemm", "16", "16", "16", *FAST, "--seed", str(2**63 - 1), code=0).stdout)
    assert doc["status"] == "ok"
    # the attention draws its output gradient from the next seed, which wraps within range
    doc = strict_json(run("attention", "1", "1", "1", "8", "8", "32", *FAST, "--dtype", "fp32", "--backward",
                          "--seed", str(2**63 - 1), code=0).stdout)
    assert doc["status"] == "ok"


def _populate() -> KernelCache:
    cache = KernelCache()

    def builder(staging: Path) -> dict:
        (staging / "kernel.cubin").write_bytes(b"\x7fELF" * 8)
        return {"stage": "main", "arch": "sm_90"}
    cache.get_or_build(KernelCache.make_key("gemm_kept", "src", {"triton": "x"}), builder)
    return cache


@pytest.mark.parametrize("days", ["nan", "-1", "inf", "-inf", "-0.5", "x"])
def test_cache_prune_refuses_days_that_would_delete_everything(days):
    cache = _populate()
    long_ago = time.time() - 1000 * 86400
    for entry in cache.entries():
        os.utime(entry.path / "manifest.json", (long_ago, long_ago))
    error("cache", "prune", "--older-than-days", days, code=ExitCode.USAGE, words=["--older-than-days"])
    assert len(list(cache.entries())) == 1  # nothing removed


@pytest.mark.parametrize("args, option", [
    (("explain", "gemm", "16", "16", "16", "--limit", "-1"), "--limit"),
    (("explain", "conv", "1", "4", "4", "1", "5", "5", "3", "3", "--limit", "-1"), "--limit"),
    (("explain", "attention", "1", "1", "1", "8", "8", "32", "--limit", "-1"), "--limit"),
    (("registry", "list", "--limit", "-1"), "--limit"),
    (("build", "--arch", "sm_90", "--limit", "-1"), "--limit"),
    (("build", "--arch", "sm_90", "-j", "0"), "--jobs"),
    (("build", "--arch", "sm_90", "-j", "-3"), "--jobs"),
    (("gemm", "16", "16", "16", "--repeats", "0"), "--repeats"),
    (("gemm", "-1", "16", "16"), "-1"),
], ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_negative_counts_are_usage_errors(args, option):
    assert option in error(*args, code=ExitCode.USAGE)["message"]


@pytest.mark.parametrize("args, words", [
    (("gemm", *FAST, "--", "-1", "16", "16"), ["M=-1"]),  # after --, -1 is a number
    (("gemm", "0", "16", "16", *FAST), ["M=0"]),
    (("gemm", "16", "16", "16", "--batch", "-2", *FAST), ["BATCH=-2"]),
    (("attention", "1", "2", "2", "8", "8", "32", "--dv", "0", *FAST), ["head_dim_v=0"]),  # not silently D
    (("attention", *FAST, "--", "1", "-2", "2", "8", "8", "32"), ["heads_q=-2"]),
    (("conv", "1", "4", "4", "1", "0", "5", "3", "3", *FAST), ["input_size"]),
    (("attention", "1", "1", "1", "8", "8", "32", "--window", "99999999999999999999,0", *FAST),
     ["--window", "at most"]),
])
def test_zero_and_negative_sizes_are_bad_input(args, words):
    error(*args, words=words)


# --- 6. exit codes, usage errors as JSON, internal errors as JSON -----------------------------


@pytest.mark.parametrize("args", [
    ("gemm", "16", "16", "16", "--bogus"),
    ("gemm", "16", "16"),
    ("gemm", "16", "16", "x"),
    ("gemm", "16", "16", "16", "--repeats", "1.5"),
    ("nope",),
    ("cache", "nope"),
    (),
    ("registry",),
], ids=lambda v: " ".join(v) or "no-args")
def test_usage_errors_are_json_with_exit_2(args):
    err = error(*args, code=ExitCode.USAGE)
    assert err["message"] and "--help" in err["hint"]


@pytest.mark.parametrize("args", [("--help",), ("gemm", "--help"), ("cache", "prune", "--help"),
                                  ("explain", "attention", "--help")])
def test_help_is_text_and_exit_0(args):
    result = run(*args, code=0)
    assert "Usage" in result.stdout and not result.stdout.lstrip().startswith("{")


def test_failed_validation_is_exit_1(monkeypatch):
    monkeypatch.setattr("tiledispatch.cli.gemm.compare",
                        lambda out, ops: Comparison(float("nan"), float("nan"), 1e-3, 5))
    doc = strict_json(run("gemm", "16", "16", "16", *FAST, "--validate", code=ExitCode.FAILED).stdout)
    assert doc["status"] == "failed" and doc["validation"]["passed"] is False
    assert doc["validation"]["relative_error"] == "nan"  # strict JSON: no NaN literal


def _raise(exc):
    def fail(*args, **kwargs):
        raise exc
    return fail


def test_an_unexpected_exception_is_a_json_internal_error(monkeypatch):
    monkeypatch.setattr("tiledispatch.cli.gemm.make_inputs", _raise(ZeroDivisionError("a bug")))
    err = error("gemm", "16", "16", "16", *FAST, code=ExitCode.INTERNAL, words=["a bug"])
    assert err["type"] == "ZeroDivisionError" and "report" in err["hint"] and "TILEDISPATCH_DEBUG" in err["hint"]


def test_a_missing_optional_package_names_the_extra_that_brings_it(monkeypatch):
    missing = ModuleNotFoundError("No module named 'pandas'", name="pandas")
    monkeypatch.setattr("tiledispatch.cli.gemm.make_inputs", _raise(missing))
    err = error("gemm", "16", "16", "16", *FAST, code=ExitCode.BAD_INPUT, words=["pandas", "not installed"])
    assert err["type"] == "ModuleNotFoundError" and err["hint"] == "pip install 'tiledispatch[selection]'"


def test_debug_env_re_raises_internal_errors(monkeypatch):
    monkeypatch.setattr("tiledispatch.cli.gemm.make_inputs", _raise(ZeroDivisionError("a bug")))
    monkeypatch.setenv("TILEDISPATCH_DEBUG", "1")
    result = CliRunner().invoke(app, ["gemm", "16", "16", "16", *FAST])
    assert isinstance(result.exception, ZeroDivisionError)


def test_ctrl_c_is_exit_130_quietly(monkeypatch):
    monkeypatch.setattr("tiledispatch.cli.gemm.make_inputs", _raise(KeyboardInterrupt()))
    result = run("gemm", "16", "16", "16", *FAST, code=ExitCode.INTERRUPTED)
    assert result.stdout == ""


def test_a_closed_stdout_is_exit_141_quietly(monkeypatch):
    def closed(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr("tiledispatch.cli.common.typer.echo", closed)
    run("arch", "sm_90", code=ExitCode.BROKEN_PIPE)  # not click's exit 1, which means "failed"
    run("arch", "sm_99", code=ExitCode.BROKEN_PIPE)  # the JSON error cannot be printed either


def test_the_console_script_prints_usage_errors_as_json(tmp_path):
    """main() runs the same JsonGroup as CliRunner (the FIFO test above sees its exit 3)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TILEDISPATCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([_console_script(), "gemm", "16", "16", "x"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == ExitCode.USAGE, proc
    assert strict_json(proc.stdout)["error"]["type"] == "BadParameter" and "Traceback" not in proc.stderr
    assert "╭" not in proc.stdout + proc.stderr  # click's text box


# --- 7. choice options: a bad value names its option -----------------------------------------


@pytest.mark.parametrize("args, option", [
    (("gemm", "8", "8", "8", "--dtype", "int8"), "--dtype"),
    (("gemm", "8", "8", "8", "--layout", "xyz"), "--layout"),
    (("gemm", "8", "8", "8", "--activation", "tanh"), "--activation"),
    (("gemm", "8", "8", "8", "--strategy", "fastest"), "--strategy"),
    (("gemm", "8", "8", "8", "--rule-set", "huge"), "--rule-set"),
    (("explain", "gemm", "8", "8", "8", "--dtype", ""), "--dtype"),
    (("conv", "1", "4", "4", "1", "5", "5", "3", "3", "--direction", "up"), "--direction"),
    (("conv", "1", "4", "4", "1", "5", "5", "3", "3", "--dtype", "fp8"), "--dtype"),
    (("conv", "1", "4", "4", "1", "5", "5", "3", "3", "--layout", "nhwc"), "--layout"),
    (("conv", "1", "4", "4", "1", "5", "5", "3", "3", "--activation", "tanh"), "--activation"),
    (("explain", "conv", "1", "4", "4", "1", "5", "5", "3", "3", "--strategy", "x"), "--strategy"),
    (("attention", "1", "1", "1", "8", "8", "32", "--dtype", "int8"), "--dtype"),
    (("attention", "1", "1", "1", "8", "8", "32", "--layout", "sbhd"), "--layout"),
    (("attention", "1", "1", "1", "8", "8", "32", "--causal", "--align", "middle"), "--align"),
    (("explain", "attention", "1", "1", "1", "8", "8", "32", "--rule-set", "x"), "--rule-set"),
    (("registry", "list", "--op", "matmul"), "--op"),
    (("registry", "list", "--arch", "sm_99"), "--arch"),
    (("registry", "list", "--dtype", "fp17"), "--dtype"),
    (("registry", "export", "--rule-set", "x"), "--rule-set"),
    (("build", "--arch", "interpreter", "--op", "x"), "--op"),
    (("build", "--arch", "9" * 5000), "--arch"),
    (("arch", "sm_99"), "arch"),
], ids=lambda v: " ".join(v)[:60] if isinstance(v, tuple) else v)
def test_a_bad_choice_names_its_option(args, option):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code in (ExitCode.USAGE, ExitCode.BAD_INPUT), result.output
    doc = strict_json(result.stdout)
    assert doc["status"] == "error" and doc["error"]["message"].startswith(option), doc
