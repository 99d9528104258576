"""Grouped k-fold splits: by problem (or a coarser group), never by row.

A problem's fold is a hash of its id, so one problem lands in the same fold on every machine,
in every set and every sweep, and all its rows (one per kernel) fall on one side of a split.
`group_of` is coarser: problems that differ only in token count or batch (one model layer
at several sizes) share a group, so that a validation fold holds layers the model never saw.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Sequence

from ...core.errors import InvalidArgumentError
from ...core.serialize import to_jsonable
from ..table import problem_from_row

GROUP_COLUMN = "group_id"


def _check_folds(folds: int, fold: int | None = None) -> None:
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise InvalidArgumentError(f"folds must be an integer >= 2, got {folds!r}")
    if fold is not None and (isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < folds):
        raise InvalidArgumentError(f"fold must be an integer in [0, {folds - 1}] for {folds} folds, got {fold!r}")


def fold_of(problem_id: str, folds: int) -> int:
    """The fold (0 .. folds - 1) of a problem id (or group id): a stable hash, the same everywhere."""
    _check_folds(folds)
    if not isinstance(problem_id, str) or not problem_id:
        raise InvalidArgumentError(f"problem_id must be a non-empty string, got {problem_id!r}")
    digest = hashlib.sha256(f"fold:{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % folds


def _erased(problem: Any) -> dict:
    """`problem`'s fields with its token count or batch (and what follows from it) left out."""
    op = getattr(getattr(problem, "op", None), "value", None)
    if op not in ("gemm", "conv", "attention") or not dataclasses.is_dataclass(problem):
        raise InvalidArgumentError(f"group_of takes a gemm, conv or attention problem, got {type(problem).__name__}")
    fields = {f.name: to_jsonable(getattr(problem, f.name)) for f in dataclasses.fields(problem)}
    fields.pop("wide_offsets", None)
    if op == "gemm":
        # Tokens are M, or K where A is the transposed activations (dW^T = X^T dY). The operands'
        # alignment follows from the sizes (a row of 1 token has no row stride), so it goes too.
        tokens = "k" if problem.layout.a.value == "c" else "m"
        del fields[tokens]
        for name in (tokens, "a", "b", "c"):
            del fields["alignment"][name]
    elif op == "conv":
        del fields["n"]
    else:
        for name in ("batch", "seqlen_q", "seqlen_kv", "seqlens", "layout"):
            del fields[name]
        del fields["variant"]["varlen"]  # packed sequences group with their fixed-length twins
        fields["phase"] = "decode" if problem.seqlen_q == 1 else "prefill"
    return {"op": op, **fields}


def group_of(problem: Any) -> str:
    """A coarser id than `problem_id`: one for every token count (GEMM), batch (conv) or batch and
    sequence length (attention, decode apart from prefill) of one layer."""
    text = json.dumps(_erased(problem), sort_keys=True, separators=(",", ":"))
    return "g" + hashlib.sha1(text.encode()).hexdigest()[:15]


def with_groups(frame):
    """`frame` (rows with ``op`` and ``problem`` columns) with a ``group_id`` column of `group_of`."""
    pairs = frame[["op", "problem"]].drop_duplicates()
    groups = {(op, text): group_of(problem_from_row(op, text)) for op, text in pairs.itertuples(index=False)}
    out = frame.copy()
    out[GROUP_COLUMN] = [groups[(op, text)] for op, text in zip(frame["op"], frame["problem"])]
    return out


def split(frame_or_ids, folds: int, fold: int, *, column: str = "problem_id"):
    """(train, validation) for fold `fold` of `folds`: validation holds every row whose `column`
    (a problem id, or ``group_id`` from `with_groups`) hashes to `fold`, training the rest.

    Takes a pandas DataFrame (returns two DataFrames) or a sequence of ids (returns two lists).
    """
    _check_folds(folds, fold)
    if hasattr(frame_or_ids, "columns"):
        if column not in frame_or_ids.columns:
            raise InvalidArgumentError(f"the frame has no {column!r} column; its columns are "
                                       f"{list(frame_or_ids.columns)} (add group ids with with_groups)")
        ids = frame_or_ids[column]
        folds_of = {i: fold_of(i, folds) for i in ids.unique()}
        mask = ids.map(folds_of) == fold
        return frame_or_ids[~mask], frame_or_ids[mask]
    ids: Sequence[str] = list(frame_or_ids)
    validation = [i for i in ids if fold_of(i, folds) == fold]
    return [i for i in ids if fold_of(i, folds) != fold], validation
