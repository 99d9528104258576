"""The core knows no op: ops register themselves (core.op.register), and nothing under
tiledispatch/core/ names one, imports one, or imports the heuristics (which sit above it)."""

from __future__ import annotations

import ast
import pickle
import re
from dataclasses import replace
from pathlib import Path

import pytest

import tiledispatch
from tiledispatch.core import op as core_op
from tiledispatch.core.errors import UnsupportedError
from tiledispatch.core.op import OpKind, all_ops, get_op, register

CORE = Path(tiledispatch.__file__).parent / "core"
OP_WORDS = {"gemm", "gemv", "conv", "convolution", "attention", "sdpa"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes: prose, not code, may give an op as an example."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _words(text: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", text.lower()))


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings, found = _docstrings(tree), []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                                                   else [])
            for name in names:
                parts = set(name.split("."))
                if parts & ({"ops", "heuristics"} | OP_WORDS):
                    found.append(f"{where} imports {name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if _words(node.value) & OP_WORDS or re.search(r"\b(ops|heuristics)\.", node.value):
                found.append(f"{where} string {node.value!r}")
        elif isinstance(node, ast.Name) and _words(node.id) & OP_WORDS:
            found.append(f"{where} name {node.id}")
        elif isinstance(node, ast.Attribute) and _words(node.attr) & OP_WORDS:
            found.append(f"{where} attribute .{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _words(node.name) & OP_WORDS:
            found.append(f"{where} defines {node.name}")
    return found


def test_core_names_no_op_and_imports_no_heuristics():
    sources = sorted(CORE.glob("*.py"))
    assert len(sources) > 10
    assert [v for path in sources for v in _violations(path)] == []


def test_the_guard_sees_what_it_refuses(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""A gemm in prose is fine."""\nfrom ..heuristics import autotune\n'
                   'import importlib\nm = importlib.import_module(f"tiledispatch.ops.{x}")\nk = OpKind.GEMM\n'
                   'name = "conv"\n')
    assert len(_violations(bad)) == 4


def test_ops_register_themselves_in_package_order():
    assert [d.kind.value for d in all_ops()] == ["gemm", "conv", "attention"]
    assert list(OpKind) == [d.kind for d in all_ops()]
    for definition in all_ops():
        name = definition.kind.value
        assert get_op(name) is get_op(name.upper()) is get_op(definition.kind) is definition
        assert getattr(OpKind, name.upper()) is definition.kind is OpKind(name)
        assert definition.problem_type.op is definition.kind


def test_a_kind_is_one_object_across_pickling_and_immutable():
    kind = get_op("gemm").kind
    assert pickle.loads(pickle.dumps(kind)) is kind
    with pytest.raises(AttributeError):
        kind.value = "conv"
    with pytest.raises(ValueError, match="op's name"):
        OpKind("Not A Name")


def test_unknown_ops_are_refused_naming_the_registered_ones():
    with pytest.raises(UnsupportedError, match="unknown op kind 'matmul'; use one of: gemm, conv, attention"):
        get_op("matmul")
    with pytest.raises(UnsupportedError):
        OpKind.parse("GEMM", exact=True)  # a registry file spells the name exactly
    with pytest.raises(AttributeError):
        OpKind.MATMUL  # noqa: B018
    with pytest.raises(UnsupportedError):
        get_op(OpKind("matmul"))  # a kind nobody registered


def test_a_second_definition_of_a_registered_op_is_refused():
    gemm = get_op("gemm")
    assert register(gemm) is gemm  # the same definition again: a no-op
    with pytest.raises(ValueError, match="registered already"):
        register(replace(gemm, family_of=lambda config: "other"))
    assert get_op("gemm") is gemm
    with pytest.raises(TypeError):
        register("gemm")
    assert core_op._OPS["gemm"] is gemm
