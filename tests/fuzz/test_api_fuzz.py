"""A seeded fuzz test of the public API: gemm, conv (three directions) and attention.

Each case id is an op and a number; the number seeds the case's own random.Random, so a
failing case reruns alone (`pytest tests/fuzz -k 'gemm-17]'`) with the same call. About
half of the cases are valid calls over random ranks, shapes, dtypes, memory layouts,
views and options, which must return the float64 PyTorch reference's result (and leave
their inputs untouched, and fill a given `out`); the others make one argument bad, and
must raise a TiledispatchError, TypeError or ValueError whose message names that argument
(or, where the mutated value is legal, return the right result). A valid call refused as
unsupported (UnsupportedError, NoKernelError) is a stated limitation: conftest.py counts them
over the session and fails it past a small share. The device is the GPU where there is one
(bf16 added, and half the cases replayed through the fast path), else the CPU under Triton's
interpreter.
"""

from __future__ import annotations

import os
import random
import traceback

import pytest
import torch

from . import attention_cases, conv_cases, gemm_cases
from .cases import ALLOWED_ERRORS, DEVICE, LIMITATIONS, Case, Expect, compare, names_argument
from . import tensors as T

MUTATED_SHARE = 0.45
# TILEDISPATCH_FUZZ_SCALE=4 runs four times the cases (the first ones are CI's, unchanged).
SCALE = float(os.environ.get("TILEDISPATCH_FUZZ_SCALE", "1"))
CASES = {  # op -> (count, the case maker)
    "gemm": (round(110 * SCALE), gemm_cases.make_case),
    "conv": (round(70 * SCALE), conv_cases.forward_case),
    "conv_backward_data": (round(45 * SCALE), conv_cases.backward_data_case),
    "conv_backward_weight": (round(45 * SCALE), conv_cases.backward_weight_case),
    "attention": (round(80 * SCALE), attention_cases.make_case),
}


def _seeded(op: str, number: int) -> tuple[random.Random, torch.Generator, bool]:
    """The case's own generators, and whether it is a mutated call."""
    rng = random.Random(f"{op}:{number}")
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    return rng, gen, rng.random() < MUTATED_SHARE


def _make(op: str, number: int) -> Case:
    rng, gen, mutate = _seeded(op, number)
    return CASES[op][1](f"{op}-{number}", rng, gen, mutate)


IDS = [(op, number) for op, (count, _) in CASES.items() for number in range(count)]


def _notes(case: Case) -> str:
    return "".join(f" [{note}]" for note in case.notes)


def _check_refusal(case: Case, error: BaseException, record_property) -> None:
    detail = f"{case.ident}: {case.summary}{_notes(case)}\n{type(error).__name__}: {error}"
    if not isinstance(error, ALLOWED_ERRORS):
        tb = "".join(traceback.format_exception(error, limit=-4))
        pytest.fail(f"crash, not a TiledispatchError/TypeError/ValueError: {detail}\n{tb}", pytrace=False)
    if case.valid or case.expect is Expect.WORKS:
        if isinstance(error, LIMITATIONS):  # counted over the session (conftest.py)
            record_property("fuzz_limitation", f"{case.ident}: {type(error).__name__}: {error}")
            return
        pytest.fail(f"a valid call was refused: {detail}", pytrace=False)
    if not names_argument(str(error), case.argument):
        pytest.fail(f"the error does not name the argument {case.argument!r}: {detail}", pytrace=False)


def _check_result(case: Case, outputs: dict, expected: dict, before: dict) -> None:
    if case.expect is Expect.RAISES:
        pytest.fail(f"{case.ident}: accepted a bad {case.argument!r} without an error: {case.summary}",
                    pytrace=False)
    problems = []
    result = outputs.get("result")
    if isinstance(result, torch.Tensor) and (result.dtype != case.result_dtype or result.device.type != DEVICE):
        problems.append(f"the result is {result.dtype} on {result.device}, not {case.result_dtype} on {DEVICE}")
    for name, ref in expected.items():
        got = outputs[name]
        if not isinstance(got, torch.Tensor):
            problems.append(f"{name} is a {type(got).__name__}, not a tensor")
            continue
        error = compare(got, ref, case.floor_of(name))
        if not error.passed(case.tolerance[name]):
            problems.append(f"{name}: {error.describe(case.tolerance[name])} (shape {tuple(got.shape)} vs "
                            f"{tuple(ref.shape)})")
    if case.out is not None:
        result = outputs["result"]
        same = isinstance(result, torch.Tensor) and result.shape == case.out.shape and torch.equal(
            result.nan_to_num(), case.out.nan_to_num())
        if not same:
            problems.append("the returned tensor is not the given out's values")
        error = compare(case.out, expected["result"].reshape(case.out.shape), case.floor)
        if not error.passed(case.tolerance["result"]):
            problems.append(f"out: {error.describe(case.tolerance['result'])}")
    for name, snap in before.items():
        if not T.unchanged(snap, case.reads[name]):
            problems.append(f"input {name} was written")
    if problems:
        listed = "\n  ".join(problems)
        pytest.fail(f"silent wrong result in {case.ident}: {case.summary}{_notes(case)}\n  {listed}", pytrace=False)


@pytest.mark.parametrize("op, number", IDS, ids=[f"{op}-{number}" for op, number in IDS])
def test_fuzz(op, number, record_property):
    case = _make(op, number)
    if case.warmup is not None:
        try:
            case.warmup()
        except Exception:  # noqa: BLE001 - the twins only bind a plan; the call itself is judged below
            pass
    expected, before = None, {}
    if case.expect is not Expect.RAISES:  # before the call: an in-place call overwrites its inputs
        expected = case.reference()
        before = {name: T.snapshot(t) for name, t in case.reads.items()}
    try:
        outputs = case.run()
    except Exception as error:  # noqa: BLE001 - the kind of every exception is what is checked
        _check_refusal(case, error, record_property)
        return
    if case.valid or case.expect is Expect.WORKS:
        record_property("fuzz_valid", case.ident)
    _check_result(case, outputs, expected, before)


def test_enough_cases():
    assert len(IDS) >= 300 * min(SCALE, 1)
    kinds = {op: sum(not _seeded(op, n)[2] for n in range(count)) for op, (count, _) in CASES.items()}
    assert all(0 < valid < CASES[op][0] for op, valid in kinds.items()), kinds
