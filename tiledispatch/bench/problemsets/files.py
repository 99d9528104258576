"""Problem lists as JSON files: what a sweep reads when its problems are not a named set.

Two forms load: ``{"op": "gemm", "problems": [...]}``, and a bare list of problems, each a
problem's canonical JSON object (`bench.table.canonical_json`), with an ``"op"`` key of its
own or recognised by its fields (each op's problem has fields no other op's has).
`save_problems` writes the first form for one op, the second (each object with its op) for
several.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable

from ...core.errors import InvalidProblemError
from ...core.jsonio import JsonFileError, read_json
from ...core.op import get_op
from ...core.serialize import from_jsonable, to_jsonable

OPS = ("gemm", "conv", "attention")


def save_problems(problems: Iterable[Any], path: str | os.PathLike) -> Path:
    """Writes `problems` to `path` as JSON (one problem a line) and returns the path."""
    problems = list(problems)
    for i, p in enumerate(problems):
        if not dataclasses.is_dataclass(p) or not hasattr(p, "op"):
            raise InvalidProblemError(f"problems[{i}] is a {type(p).__name__}, not a problem (GemmProblem, "
                                      "ConvProblem or AttentionProblem)")
    ops = list(dict.fromkeys(p.op.value for p in problems))
    lines = [json.dumps(to_jsonable(p) if len(ops) == 1 else {"op": p.op.value, **to_jsonable(p)},
                        sort_keys=True, separators=(",", ":")) for p in problems]
    body = "[\n" + ",\n".join(lines) + "\n]" if lines else "[]"
    text = f'{{"op":{json.dumps(ops[0])},"problems":{body}}}\n' if len(ops) == 1 else body + "\n"
    path = Path(path)
    path.write_text(text)
    return path


def _op_of(item: dict, where: str) -> str:
    """The op a problem object belongs to: its "op" key, else the op whose problem has exactly its fields."""
    if "op" in item:
        return item["op"]
    keys = set(item)
    matches = [op for op in OPS if {f.name for f in dataclasses.fields(get_op(op).problem_type)} >= keys
               and _required(op) <= keys]
    if len(matches) != 1:
        raise InvalidProblemError(f"{where}: cannot tell which op's problem has the fields {sorted(keys)}; give "
                                  'each object an "op" key, or write {"op": ..., "problems": [...]}')
    return matches[0]


def _required(op: str) -> set[str]:
    return {f.name for f in dataclasses.fields(get_op(op).problem_type)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def _problem(op: Any, item: Any, where: str) -> Any:
    if op not in OPS:
        raise InvalidProblemError(f"{where}: op {op!r} is not one of {', '.join(OPS)}")
    if not isinstance(item, dict):
        raise InvalidProblemError(f"{where} must be a JSON object (a problem), got {type(item).__name__}")
    fields = {k: v for k, v in item.items() if k != "op"}
    try:
        return from_jsonable(get_op(op).problem_type, fields, where)
    except (ValueError, TypeError) as e:
        raise InvalidProblemError(f"{where} is not a valid {op} problem: {e}") from None


def load_problems(path: str | os.PathLike) -> tuple[Any, ...]:
    """The problems of a JSON file in either form (see the module docstring), in file order."""
    try:
        data = read_json(path)
    except JsonFileError as e:
        raise InvalidProblemError(f"problem file {path}: {e}") from None
    if isinstance(data, dict):
        if set(data) != {"op", "problems"} or not isinstance(data["problems"], list):
            raise InvalidProblemError(f'problem file {path}: an object must be {{"op": ..., "problems": [...]}}, '
                                      f"got the keys {sorted(data)}")
        if data["op"] not in OPS:
            raise InvalidProblemError(f"problem file {path}: op {data['op']!r} is not one of {', '.join(OPS)}")
        return tuple(_problem(data["op"], item, f"{path}: problems[{i}]") for i, item in enumerate(data["problems"]))
    if not isinstance(data, list):
        raise InvalidProblemError(f"problem file {path}: expected a list of problems or "
                                  f'{{"op": ..., "problems": [...]}}, got {type(data).__name__}')
    problems = []
    for i, item in enumerate(data):
        where = f"{path}: [{i}]"
        if not isinstance(item, dict):
            raise InvalidProblemError(f"{where} must be a JSON object (a problem), got {type(item).__name__}")
        problems.append(_problem(_op_of(item, where), item, where))
    return tuple(problems)
