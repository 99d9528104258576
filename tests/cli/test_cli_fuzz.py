"""A seeded fuzz of the command line, in process (typer's CliRunner) for speed.

Each case is a valid command line (small problems, the tiny rule set, one timed run) or one
made invalid by a single mutation: a bad positional, a bad option value, an unknown option, a
missing or extra argument, a flag given a value, or a hostile registry file. Whatever the
case: the exit code is a documented one and never INTERNAL (a bug), stdout is one strict JSON
document (help aside), no traceback is printed, a valid case exits 0 and an invalid one never
does. The FIFO case runs in a subprocess with a timeout, so that a hang fails instead of
blocking the suite.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiledispatch import arch
from tiledispatch.cli.common import ExitCode
from tiledispatch.cli.main import app
from tiledispatch.core.registry import Registry

from ..conftest import on_gpu

pytestmark = pytest.mark.skipif(on_gpu(), reason="runs the interpreter's small problems in process")

SEED = 38
CASES = 200
VALID_SHARE = 0.3
FAST = ("--rule-set", "tiny", "--repeats", "1")


@dataclass(frozen=True)
class Line:
    """A command line: its command words, positionals and options (flag, value or None)."""

    words: tuple[str, ...]
    positionals: tuple[str, ...] = ()
    options: tuple[tuple[str, str | None], ...] = ()
    valid: bool = True
    help: bool = False
    why: str = "valid"

    def argv(self) -> list[str]:
        argv = [*self.words]
        for flag, value in self.options:
            argv += [flag] if value is None else [flag, value]
        # `--` keeps a positional such as -7 a number rather than an option
        return argv + (["--"] if any(p.startswith("-") for p in self.positionals) else []) + [*self.positionals]

    def set_option(self, flag: str, value: str | None) -> "Line":
        kept = tuple(o for o in self.options if o[0] != flag)
        return replace(self, options=(*kept, (flag, value)))


# --- valid lines ------------------------------------------------------------------------------


def _opts(rng: random.Random, *choices: tuple[str, list]) -> list[tuple[str, str | None]]:
    """Each (flag, values) pair with probability 1/2; a value None makes a flag."""
    picked = []
    for flag, values in choices:
        if rng.random() < 0.5:
            picked.append((flag, rng.choice(values)))
    return picked


def _fast(rng, explain: bool) -> list[tuple[str, str | None]]:
    if explain:
        return [("--rule-set", "tiny"), ("--limit", str(rng.randint(0, 4)))]
    return [("--rule-set", "tiny"), ("--repeats", "1"), ("--seed", str(rng.randint(0, 2**63 - 1)))]


def gemm_line(rng: random.Random, explain: bool) -> Line:
    sizes = tuple(str(rng.randint(1, 24)) for _ in range(3))
    layout = "".join(rng.choice("rcs") for _ in range(3))
    opts = [("--layout", layout), ("--dtype", rng.choice(["fp16", "fp32"]))]
    opts += _opts(rng, ("--batch", ["1", "2", "3"]), ("--bias", [None]), ("--activation", ["none", "relu", "gelu",
                  "silu"]), ("--residual", [None]), ("--strategy", ["rules", "first"]))
    if not explain:
        opts += _opts(rng, ("--validate", [None]))
    return Line(("explain", "gemm") if explain else ("gemm",), sizes, tuple(opts + _fast(rng, explain)))


def conv_line(rng: random.Random, explain: bool) -> Line:
    dims, g = rng.choice([1, 2]), rng.choice([1, 2])
    spatial = [rng.randint(3, 6) for _ in range(dims)]
    filt = [rng.randint(1, min(3, s)) for s in spatial]
    sizes = (rng.randint(1, 2), g * rng.choice([1, 2, 4]), g * rng.choice([1, 2, 4]), g, *spatial, *filt)
    direction = rng.choice(["forward", "bwd_data", "bwd_weight"])
    opts = [("--direction", direction), ("--dtype", rng.choice(["fp16", "fp32"])),
            ("--layout", rng.choice(["channels-last", "contiguous"]))]
    opts += _opts(rng, ("--stride", ["1", "2"]), ("--pad", ["0", "1"]), ("--strategy", ["rules", "first"]))
    if direction == "forward":
        opts += _opts(rng, ("--bias", [None]), ("--activation", ["relu", "silu"]), ("--residual", [None]))
    if not explain:
        opts += _opts(rng, ("--validate", [None]))
    words = ("explain", "conv") if explain else ("conv",)
    return Line(words, tuple(map(str, sizes)), tuple(opts + _fast(rng, explain)))


def attention_line(rng: random.Random, explain: bool) -> Line:
    hkv = rng.randint(1, 2)
    sizes = (rng.randint(1, 2), hkv * rng.randint(1, 2), hkv, rng.randint(1, 12), rng.randint(1, 12),
             rng.choice([32, 64]))
    opts = [("--dtype", rng.choice(["fp16", "fp32"])), ("--layout", rng.choice(["bhsd", "bshd"]))]
    opts += _opts(rng, ("--window", ["2,0", "3,1", "-1,2"]), ("--softcap", ["5", "30.5"]))
    if rng.random() < 0.5:  # a window is bottom-right aligned: so must its causal mask be
        windowed = any(flag == "--window" for flag, _ in opts)
        opts += [("--causal", None)] + ([("--align", "bottom-right")] if windowed else
                                        _opts(rng, ("--align", ["top-left", "bottom-right"])))
    if rng.random() < 0.15:
        opts.append(("--backward", None))
    if not explain:
        opts += _opts(rng, ("--validate", [None]))
    return Line(("explain", "attention") if explain else ("attention",), tuple(map(str, sizes)),
                tuple(opts + _fast(rng, explain)))


def registry_line(rng: random.Random, files: dict[str, Path]) -> Line:
    kind = rng.choice(["list", "export", "import"])
    if kind == "import":
        out = [("-o", str(files["dir"] / f"round_{rng.randrange(10**9)}.json"))] if rng.random() < 0.5 else []
        return Line(("registry", "import"), (str(files["valid"]),), tuple(out))
    opts = [("--rule-set", "tiny")] + _opts(
        rng, ("--op", ["gemm", "conv", "attention"]), ("--arch", ["sm_80", "sm90", "9.0", "interpreter"]),
        ("--dtype", ["fp16", "fp32", "fp16-fp32"]), ("--family", ["tiled", "nope"]), ("--name-contains", ["_rrr_"]))
    if kind == "list":
        return Line(("registry", "list"), (), tuple(opts + _opts(rng, ("--limit", ["0", "3"]))))
    return Line(("registry", "export"), (), tuple(opts + [("-o", str(files["dir"] / f"e{rng.randrange(10**9)}.json"))]))


def other_line(rng: random.Random) -> Line:
    kind = rng.choice(["cache", "arch", "build"])
    if kind == "cache":
        sub = rng.choice(["ls", "info", "clear", "prune"])
        opts = _opts(rng, ("--older-than-days", ["0", "2.5", "1e308"])) if sub == "prune" else []
        return Line(("cache", sub), (), tuple(opts))
    if kind == "arch":
        return Line(("arch",), tuple(rng.choice([[], ["sm_90"], ["90"], ["8.6"], ["SM_120"], ["interp"]])))
    return Line(("build",), (), (("--arch", "interpreter"), *_opts(rng, ("--op", ["gemm", "conv"]),
                                                                   ("-j", ["1", "4"]))))


def valid_line(rng: random.Random, files: dict[str, Path]) -> Line:
    maker = rng.choice(["gemm", "conv", "attention", "registry", "other"])
    explain = rng.random() < 0.4
    if maker == "gemm":
        return gemm_line(rng, explain)
    if maker == "conv":
        return conv_line(rng, explain)
    if maker == "attention":
        return attention_line(rng, explain)
    return registry_line(rng, files) if maker == "registry" else other_line(rng)


# --- mutations: each makes a line invalid -------------------------------------------------------

HUGE = str(2**70)
BAD_POSITIONAL = ["0", "-1", "-7", "abc", "1.5", "nan", "", "9" * 5000, HUGE]
BAD_CHOICE = ["bogus", "", "x" * 300, "fp16;ls", "\U0001f4a5"]
BAD_VALUES = {
    "--dtype": BAD_CHOICE + ["int8", "fp99"], "--layout": BAD_CHOICE + ["rrrr", "nhwc"],
    "--activation": BAD_CHOICE + ["tanh"], "--direction": BAD_CHOICE + ["up", "bwd"],
    "--strategy": BAD_CHOICE + ["fastest"], "--rule-set": BAD_CHOICE + ["huge"], "--op": BAD_CHOICE + ["matmul"],
    "--arch": BAD_CHOICE + ["sm_99", "9" * 5000, "sm_90x"], "--align": BAD_CHOICE + ["middle", "TOP-LEFT"],
    "--seed": ["-1", str(2**63), HUGE, "x", "1.5", "nan", ""], "--limit": ["-1", "-100", "x", "1.5", ""],
    "--repeats": ["0", "-1", str(10**6), "x"], "-j": ["0", "-3", "5000", "x"], "--batch": ["0", "-2", "x", HUGE],
    "--dv": ["0", "-1", "48", "x"], "--softcap": ["nan", "inf", "-inf", "-1", "0", "x"],
    "--window": ["1", "a,b", "1,2,3", "-5,0", "99999999999999999999,0", ""],
    "--stride": ["0", "-1", "a", "1,,2", "1,2,3,4", HUGE], "--pad": ["-1", "a", "1,,2", "1,2,3,4", HUGE],
    "--dilation": ["0", "-1", "a", HUGE], "--older-than-days": ["nan", "inf", "-inf", "-1", "x"],
    "--kernel": ["nope", "", "x" * 3000, "gemm_fp16"],
}
OPTIONS = {  # the options each command takes that BAD_VALUES can spoil
    "gemm": ["--dtype", "--layout", "--activation", "--strategy", "--rule-set", "--seed", "--repeats", "--batch",
             "--kernel"],
    "conv": ["--dtype", "--layout", "--activation", "--direction", "--strategy", "--rule-set", "--seed", "--repeats",
             "--stride", "--pad", "--dilation", "--kernel"],
    "attention": ["--dtype", "--layout", "--strategy", "--rule-set", "--seed", "--repeats", "--dv", "--softcap",
                  "--window", "--kernel", "--align"],
    "explain": ["--dtype", "--layout", "--strategy", "--rule-set", "--limit"],
    "registry": ["--op", "--rule-set", "--arch", "--dtype"],
    "list": ["--op", "--rule-set", "--arch", "--dtype", "--limit"],
    "build": ["--op", "--rule-set", "--arch", "--dtype", "-j", "--limit"],
    "prune": ["--older-than-days"],
}


def _options_of(line: Line) -> list[str]:
    if line.words[0] == "registry":
        return OPTIONS["list" if line.words[1] == "list" else "registry"] if line.words[1] != "import" else []
    if line.words[0] == "explain":
        return OPTIONS["explain"]
    return OPTIONS.get(line.words[-1], [])


def mutate(rng: random.Random, line: Line, files: dict[str, Path]) -> Line:
    """`line` made invalid in one way (a line with nothing to spoil gets an unknown option)."""
    kinds = ["unknown-option", "flag-with-value", "missing-value"]
    if line.positionals and line.words[0] != "registry":
        kinds += ["bad-positional"] * 3 + ["extra-positional"]
        kinds += ["drop-positional"] if line.words[0] != "arch" else []  # `arch` alone is this machine's
    if _options_of(line):
        kinds += ["bad-option"] * 4
    if line.words[:2] == ("registry", "import"):
        kinds += ["bad-file"] * 6
    if line.words[:2] == ("registry", "export"):
        kinds += ["bad-output"] * 2
    kind = rng.choice(kinds)
    bad = replace(line, valid=False, why=kind)
    if kind == "unknown-option":
        return replace(bad, options=(*line.options, (rng.choice(["--bogus", "-z", "--dtypo", "--bogus=1"]), None)))
    if kind == "flag-with-value":
        return replace(bad, options=(*line.options, (rng.choice(["--help=1", "--validate=yes", "--causal=1"]), None)))
    if kind == "missing-value":
        flag = rng.choice(_options_of(line) or ["--rule-set"]) if line.words[0] != "arch" else "--bogus"
        return replace(bad, options=(*line.options, (flag, None)))
    if kind == "bad-positional":
        i = rng.randrange(len(line.positionals))
        value = rng.choice(BAD_POSITIONAL if line.words[0] != "arch" else BAD_VALUES["--arch"])
        return replace(bad, positionals=line.positionals[:i] + (value,) + line.positionals[i + 1:], why=f"{kind} {i}")
    if kind == "drop-positional":
        i = rng.randrange(len(line.positionals))
        return replace(bad, positionals=line.positionals[:i] + line.positionals[i + 1:])
    if kind == "extra-positional":
        return replace(bad, positionals=(*line.positionals, "3"))
    if kind == "bad-option":
        flag = rng.choice(_options_of(line))
        return replace(bad.set_option(flag, rng.choice(BAD_VALUES[flag])), why=f"{kind} {flag}")
    if kind == "bad-file":
        name = rng.choice(sorted(k for k in files if k not in ("valid", "dir")))
        return replace(bad, positionals=(str(files[name]),), why=f"{kind} {name}")
    target = rng.choice([files["dir"], files["dir"] / "no" / "such" / "dir" / "f.json", Path("/dev/full")])
    return replace(bad.set_option("-o", str(target)), why=f"{kind} {target}")


def garbage_line(rng: random.Random) -> Line:
    words = rng.choice([("gemmm",), ("",), ("explain", "matmul"), ("registry", "lsit"), ("cache", "rm"),
                        ("--versoin",), ("-h",), ("\U0001f4a5",), ("explain",), ("registry",), ()])
    return Line(words, valid=False, why="garbage")


def help_line(rng: random.Random, files: dict[str, Path]) -> Line:
    line = valid_line(rng, files)
    return replace(line, options=(*line.options, ("--help", None)), help=True, why="help")


def generate(rng: random.Random, files: dict[str, Path], count: int) -> list[Line]:
    lines = []
    for _ in range(count):
        roll = rng.random()
        if roll < VALID_SHARE:
            lines.append(valid_line(rng, files))
        elif roll < VALID_SHARE + 0.05:
            lines.append(help_line(rng, files))
        elif roll < VALID_SHARE + 0.1:
            lines.append(garbage_line(rng))
        else:
            lines.append(mutate(rng, valid_line(rng, files), files))
    return lines


# --- hostile registry files ---------------------------------------------------------------------


def _spoiled(doc: dict) -> list[dict]:
    """Copies of a valid registry document, each broken in one way `Registry.from_json` must refuse."""
    def variant(edit) -> dict:
        copy = json.loads(json.dumps(doc))
        edit(copy)
        return copy

    def kernel(key, value):
        return lambda d: d["kernels"][1].__setitem__(key, value)

    edits = [
        lambda d: d.__setitem__("total", d["total"] + 1), lambda d: d.__setitem__("format", "x"),
        lambda d: d.__setitem__("format_version", "1"), lambda d: d.__setitem__("kernels", {}),
        lambda d: d["kernels"].__setitem__(0, None), lambda d: d["kernels"].__setitem__(2, [1, 2]),
        kernel("name", "nope"), kernel("priority", 1.5), kernel("priority", True), kernel("priority", "high"),
        kernel("arch", "sm_99"), kernel("arch", "90"), kernel("op", "nope"), kernel("config", "x"),
        lambda d: d["kernels"][1].pop("config"), lambda d: d["kernels"][1]["config"]["types"].__setitem__("a", "int8"),
        lambda d: (d["kernels"].append(d["kernels"][0]), d.__setitem__("total", d["total"] + 1)),
    ]
    return [variant(edit) for edit in edits]


def hostile_files(root: Path) -> dict[str, Path]:
    root.mkdir(mode=0o700)
    files = {"dir": root, "valid": root / "valid.json", "a-directory": root / "sub", "missing": root / "missing.json",
             "dev-zero": Path("/dev/zero"), "loop": root / "loop"}
    sm90 = Registry.from_rule_set("gemm", "tiny", arch.load("sm_90"))
    sm90.filter(lambda s: s.dtype == "fp32" and "_rrr_" in s.name).save(files["valid"])
    text = files["valid"].read_text()
    files["a-directory"].mkdir()
    os.symlink(root / "loop2", files["loop"])
    os.symlink(files["loop"], root / "loop2")
    contents = {"deep": "[" * 100_000, "deep-objects": '{"a":' * 50_000, "empty": "", "list": "[]", "null": "null",
                "string": '"x"', "nan": '{"format": NaN}', "big-number": "1e999", "truncated": text[: len(text) // 2],
                "bom": "\ufeff" + text}
    for name, content in contents.items():
        files[name] = root / f"{name}.json"
        files[name].write_text(content)
    files["garbage"] = root / "garbage.json"
    files["garbage"].write_bytes(random.Random(SEED).randbytes(4096))
    files["huge"] = root / "huge.json"
    files["huge"].write_bytes(b"")
    os.truncate(files["huge"], (64 << 20) + 1)  # sparse: refused by its size, never read
    for i, doc in enumerate(_spoiled(json.loads(text))):
        files[f"spoiled-{i}"] = root / f"spoiled_{i}.json"
        files[f"spoiled-{i}"].write_text(json.dumps(doc))
    return files


# --- the checks ---------------------------------------------------------------------------------


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def problems_of(line: Line, result) -> list[str]:
    """What is wrong with how the command handled `line`: nothing, for a robust command line."""
    found = []
    if "Traceback" in result.output:
        found.append("a traceback")
    documented = {int(c) for c in ExitCode} - {ExitCode.INTERNAL}
    if result.exit_code not in documented:
        found.append(f"exit code {result.exit_code} (documented, not internal: {sorted(documented)})")
    if line.help:
        if result.exit_code != 0 or "Usage" not in result.stdout:
            found.append("--help did not print help with exit 0")
        return found
    try:
        doc = strict_json(result.stdout)
    except ValueError as e:
        found.append(f"stdout is not one strict JSON document ({e})")
        doc = None
    if line.valid and result.exit_code != 0:
        found.append(f"a valid line exited {result.exit_code}")
    if not line.valid and result.exit_code not in (ExitCode.USAGE, ExitCode.BAD_INPUT):
        found.append(f"an invalid line exited {result.exit_code}")
    if result.exit_code in (ExitCode.USAGE, ExitCode.BAD_INPUT) and not (
            isinstance(doc, dict) and doc.get("status") == "error" and doc["error"].get("message")):
        found.append("an error without its JSON error document")
    return found


@pytest.fixture
def files(tmp_path, monkeypatch) -> dict[str, Path]:
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("TILEDISPATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEDISPATCH_DEBUG", raising=False)
    return hostile_files(tmp_path / "files")


def test_fuzzed_command_lines(files):
    lines = generate(random.Random(SEED), files, CASES)
    assert len(lines) >= 150 and sum(line.valid for line in lines) >= 30
    assert sum(not line.valid for line in lines) >= 100
    failures = []
    for line in lines:
        result = CliRunner().invoke(app, line.argv())
        for problem in problems_of(line, result):
            failures.append(f"{problem}: {' '.join(line.argv())[:300]} [{line.why}]\n    {result.output[-600:]}")
    assert not failures, f"{len(failures)} of {len(lines)} lines:\n" + "\n".join(failures)


def test_every_hostile_file_is_refused_by_registry_import(files):
    """Each file once, whatever the seed's draw picked."""
    for name, path in files.items():
        if name in ("valid", "dir"):
            continue
        line = Line(("registry", "import"), (str(path),), valid=False, why=name)
        result = CliRunner().invoke(app, line.argv())
        assert not problems_of(line, result), (name, result.output)
        assert strict_json(result.stdout)["error"]["type"] == "RegistryFormatError", (name, result.output)


def test_a_fifo_is_refused_without_waiting(tmp_path):
    """A FIFO with no writer would block a plain open(): run in a subprocess whose timeout fails a hang."""
    os.chmod(tmp_path, 0o700)
    fifo = tmp_path / "registry.json"
    os.mkfifo(fifo)
    env = {**os.environ, "TRITON_INTERPRET": "1", "TILEDISPATCH_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "tiledispatch", "registry", "import", str(fifo)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == ExitCode.BAD_INPUT, proc
    assert "Traceback" not in proc.stderr and "not a regular file" in strict_json(proc.stdout)["error"]["message"]
