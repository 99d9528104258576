"""The guard each op's test_families.py runs over its shared modules: no switch over families.

A switch is `isinstance(x, <...>Config)` (or, with `any_isinstance`, any isinstance call) or a
comparison with a `.family` operand (`config.family is Family.X`, `... in (...)`, `==`): the
op's shared code asks its FamilyTable instead.
"""

from __future__ import annotations

import ast
from pathlib import Path


def family_switches(path: Path, any_isinstance: bool = False) -> list[str]:
    """Each switch in the module at `path`, as `name:line: source`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            if any_isinstance or "Config" in ast.unparse(node.args[1]):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Compare) and any(
                isinstance(o, ast.Attribute) and o.attr == "family" for o in (node.left, *node.comparators)):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found
