"""Size guard (issue 39): no module over 500 lines, no function outside kernels/ over 80 lines.

The allowlists below are empty: every module and function is within its limit. An entry (an
offender with its size) is a debt someone chose to record; the test fails when code not listed
crosses a limit, when a listed offender grows past its recorded size, and when a listed offender
is gone or back within the limit (then delete its entry), so the lists only shrink. Functions are named `path::Class.method`, nested ones
`path::outer.inner`; a size is `end_lineno - lineno + 1` of the `def` (decorators not counted).
Kernel files (tiledispatch/ops/*/kernels/) are exempt from the function limit: a Triton or Gluon
kernel is one function by construction. They still count as modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tiledispatch"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

MODULES_OVER: dict[str, int] = {}
FUNCTIONS_OVER: dict[str, int] = {}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _is_kernel_file(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).parts
    return len(parts) >= 3 and parts[0] == "ops" and "kernels" in parts[2:-1]


def module_sizes() -> dict[str, int]:
    return {_relative(p): len(p.read_text().splitlines()) for p in _sources()}


def _functions(node: ast.AST, prefix: str):
    """(qualified name, lines) of every function under `node`, nested ones and methods included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def function_sizes() -> dict[str, int]:
    sizes = {}
    for path in _sources():
        if _is_kernel_file(path):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, lines in _functions(tree, ""):
            sizes[f"{_relative(path)}::{name}"] = max(lines, sizes.get(f"{_relative(path)}::{name}", 0))
    return sizes


def _violations(sizes: dict[str, int], limit: int, allowed: dict[str, int], what: str) -> list[str]:
    problems = []
    for name, size in sorted(sizes.items()):
        if size <= limit:
            continue
        if name not in allowed:
            problems.append(f"{what} {name} has {size} lines (limit {limit}): split it")
        elif size > allowed[name]:
            problems.append(f"{what} {name} grew to {size} lines (allowlisted at {allowed[name]}, limit {limit})")
    for name, recorded in sorted(allowed.items()):
        if sizes.get(name, 0) <= limit:
            problems.append(f"{what} {name} (allowlisted at {recorded}) is gone or within {limit} lines: "
                            "delete its allowlist entry")
    return problems


def test_kernel_files_are_recognised():
    kernels = [_relative(p) for p in _sources() if _is_kernel_file(p)]
    assert "tiledispatch/ops/conv/kernels/direct.py" in kernels
    assert not any("/kernels/" not in k for k in kernels)


def test_modules_within_limit_or_allowlisted():
    problems = _violations(module_sizes(), MAX_MODULE_LINES, MODULES_OVER, "module")
    assert not problems, "\n".join(problems)


def test_functions_within_limit_or_allowlisted():
    problems = _violations(function_sizes(), MAX_FUNCTION_LINES, FUNCTIONS_OVER, "function")
    assert not problems, "\n".join(problems)


def test_guard_catches_an_unlisted_or_grown_offender():
    sizes = {"a.py::f": 81, "b.py::g": 95, "c.py::h": 10}
    problems = _violations(sizes, 80, {"b.py::g": 90, "c.py::h": 85}, "function")
    assert any("a.py::f has 81" in p for p in problems)
    assert any("b.py::g grew to 95" in p for p in problems)
    assert any("c.py::h" in p and "delete" in p for p in problems)
    assert len(problems) == 3
