"""The `rules` dispatcher's picks over every committed suite, computed on the CPU: a snapshot to diff.

A refactor that must not change behaviour (issue 39) is checked by recomputing the picks and
comparing them with a snapshot taken before it (tests/data/picks_sm90.json, picks_sm80.json):
for every case of benchmarks/suites/, posed as its benchmark poses it,

  - gemm.json: every case in bf16, fp16 and fp8e4m3, A row-major and B column-major with the
    fp8 scales (benchmarks/gemm.py's problem_of), and its graph replays' pick (`replay_pick`);
  - conv.json, conv_probe.json, conv_depthwise_*.json: every case forward, bwd_data and
    bwd_weight in bf16 and fp16, fresh channels-last tensors with no `out` (benchmarks/conv.py);
  - attention.json: every case whose operands are plain Q/K/V tensors (prefill and decode;
    paged and varlen cases need page tables and offsets no benchmark poses) in bf16 and fp16:
    the forward, the forward that keeps the LSE and the backward (benchmarks/attention.py),

each problem described by the op's own check_operands on shape-only (meta) tensors, so the
alignment and layout are the library's own reading of them. Each entry records the pick of a
`rules` dispatcher over the op's default rule set on the named arch (the vendor candidate
included, as in the default dispatcher), the pick among the Triton kernels alone, and the
first TOP ranked candidates with their scores to 6 significant digits.

    python benchmarks/picks.py --arch sm_90 --out tests/data/picks_sm90.json
    python benchmarks/picks.py --arch sm_90 --check tests/data/picks_sm90.json   (exit 1 on a difference)
    python benchmarks/picks.py --arch sm_90 --check FILE --ops conv              (one op's entries)

A pick or an order that differs is a difference; a score is one past a relative 1e-6.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import torch

import tiledispatch  # noqa: F401  (first: it picks the backend)
from tiledispatch import arch as arch_facts
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.errors import NoKernelError
from tiledispatch.core.registry import Registry

SUITES = Path(__file__).parent / "suites"
TOP = 3
SCORE_DIGITS = 6
SCORE_RTOL = 1e-6
GEMM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8e4m3": torch.float8_e4m3fn}
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CONV_SUITES = ("conv.json", "conv_probe.json", "conv_depthwise_*.json")
CONV_DIRECTIONS = ("forward", "bwd_data", "bwd_weight")
ATTENTION_MODES = ("prefill", "decode")  # plain Q/K/V tensors; paged and varlen need more than shapes
OPS = ("gemm", "conv", "attention")


@dataclass(frozen=True)
class Posed:
    """One problem to rank: its key in the snapshot and the problem the benchmark poses."""

    op: str
    suite: str
    case: str
    direction: str
    dtype: str
    problem: object

    @property
    def key(self) -> str:
        return "/".join((self.op, self.suite, self.case, self.direction, self.dtype))


def _cases(name: str) -> list[dict]:
    return json.loads((SUITES / name).read_text())["cases"]


# -- posing ------------------------------------------------------------------------------


def gemm_problems() -> Iterator[Posed]:
    """benchmarks/gemm.py's problems: A [batch,] M x K row-major, B K x N column-major (an
    nn.Linear weight), fp8 with tensor scales; checked on meta tensors."""
    from tiledispatch.ops.gemm import check_operands

    for case in _cases("gemm.json"):
        for dtype, torch_dtype in GEMM_DTYPES.items():
            lead = (case["batch"],) if case["batch"] > 1 else ()
            a = torch.empty(*lead, case["M"], case["K"], device="meta", dtype=torch_dtype)
            b = torch.empty(*lead, case["N"], case["K"], device="meta", dtype=torch_dtype).transpose(-1, -2)
            scales = {}
            if dtype.startswith("fp8"):
                scales = {"scale_a": torch.empty((), device="meta"), "scale_b": torch.empty((), device="meta")}
            problem = check_operands(a, b, **scales).problem
            yield Posed("gemm", "gemm", case["name"], "forward", dtype, problem)


def conv_problems() -> Iterator[Posed]:
    """benchmarks/conv.py's problems: fresh dense channels-last x, w and dy, no `out`."""
    files = sorted({p for pattern in CONV_SUITES for p in SUITES.glob(pattern)})
    for path in files:
        for case in _cases(path.name):
            for direction in CONV_DIRECTIONS:
                for dtype in HALF_DTYPES:
                    yield Posed("conv", path.stem, case["name"], direction, dtype, conv_problem(case, direction, dtype))


def conv_problem(case: dict, direction: str, dtype: str):
    """One conv problem, read by check_operands from meta tensors laid out as make_inputs lays them."""
    from tiledispatch.ops.conv import ConvProblem, ConvTypes, Direction, check_operands
    from tiledispatch.ops.conv.operands import channels_last_empty

    d = Direction.parse(direction)
    p = ConvProblem(d, case["N"], case["C"], case["K"], case["G"], tuple(case["input"]), tuple(case["filter"]),
                    case["stride"], tuple(case["pad"]), case["dilation"], ConvTypes.parse(dtype))
    x_shape, w_shape, y_shape = (p.n, p.c, *p.input_size), (p.k, p.c_per_group, *p.filter_size), (
        p.n, p.k, *p.output_size)

    def empty(shape, wanted: bool):
        return channels_last_empty(shape, HALF_DTYPES[dtype], "meta") if wanted else None

    sizes = ({"input_size": x_shape} if d is Direction.BWD_DATA else
             {"weight_size": w_shape} if d is Direction.BWD_WEIGHT else {})
    problem = check_operands(d, x=empty(x_shape, d is not Direction.BWD_DATA),
                             w=empty(w_shape, d is not Direction.BWD_WEIGHT), dy=empty(y_shape, d is not Direction.FORWARD),
                             stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups, **sizes).problem
    # benchmarks/conv.py ranks the problem it describes directly; the two must be one.
    posed = replace(p, specialization=p.dense_specialization())
    if problem != posed:
        raise AssertionError(f"{case['name']} {direction} {dtype}: check_operands reads {problem} where "
                             f"benchmarks/conv.py poses {posed}")
    return problem


def attention_problems() -> Iterator[Posed]:
    """benchmarks/attention.py's problems: BHSD Q/K/V, the forward alone, the forward that keeps
    the LSE (a training step's), and the backward."""
    from tiledispatch.ops.attention import AttentionOptions, Direction, Window, check_operands, parse_causal

    for case in _cases("attention.json"):
        if case["mode"] not in ATTENTION_MODES:
            continue
        window = tuple(case["window"]) if "window" in case else None
        options = AttentionOptions(causal=parse_causal(case.get("causal", False)), softcap=case.get("softcap"),
                                   window=None if window is None else Window(*window))
        b, hq, hkv, sq, skv, d = (case[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D"))
        for dtype, torch_dtype in HALF_DTYPES.items():
            q = torch.empty(b, hq, sq, d, device="meta", dtype=torch_dtype)
            k = torch.empty(b, hkv, skv, d, device="meta", dtype=torch_dtype)
            v = torch.empty(b, hkv, skv, d, device="meta", dtype=torch_dtype)
            grad = torch.empty(b, hq, sq, d, device="meta", dtype=torch_dtype)
            forward = check_operands(q, k, v, options=options).problem
            backward = check_operands(q, k, v, options=options, direction=Direction.BACKWARD, out=q, lse=q,
                                      grad_out=grad).problem
            for direction, problem in (("fwd", forward), ("fwd-lse", replace(forward, needs_lse=True)),
                                       ("bwd", backward)):
                yield Posed("attention", "attention", case["name"], direction, dtype, problem)


POSERS: dict[str, Callable[[], Iterator[Posed]]] = {
    "gemm": gemm_problems, "conv": conv_problems, "attention": attention_problems}


# -- ranking -----------------------------------------------------------------------------


def _score(value: float) -> float:
    """`value` to SCORE_DIGITS significant digits (infinities and zero as they are)."""
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.{SCORE_DIGITS - 1}e}")


def is_vendor(spec) -> bool:
    """A library call rather than a Triton kernel: the vendor family, attention's SDPA backends."""
    return spec.family == "vendor" or spec.family.startswith("sdpa")


def entry(posed: Posed, dispatcher: Dispatcher) -> dict:
    """The snapshot's record of one problem. The Triton pick is the first Triton kernel of the
    ranking: what a dispatcher of the Triton kernels alone selects (the ranking sorts stably)."""
    ranked = dispatcher.ranked(posed.problem)
    if not ranked:  # no kernel of the arch takes it (fp8 before sm_89): the dispatcher refuses it
        try:
            dispatcher.select(posed.problem)
        except NoKernelError as e:
            return {"pick": None, "error": type(e).__name__, "accepted": 0}
        raise AssertionError(f"{posed.key}: no candidate accepts the problem, yet select picks one")
    record = {
        "pick": dispatcher.select(posed.problem).name,
        "triton_pick": next((c.spec.name for c in ranked if not is_vendor(c.spec)), None),
        "accepted": len(ranked),
        "top": [c.spec.name for c in ranked[:TOP]],
        "scores": [_score(c.score.value) for c in ranked[:TOP]],
    }
    if posed.op == "gemm":
        from tiledispatch.ops.gemm.ranking import replay_pick

        record["replay_pick"] = replay_pick(dispatcher, posed.problem).name
    return record


def compute(arch_name: str, ops: tuple[str, ...] = OPS, keep: Callable[[Posed], bool] | None = None) -> dict:
    """The snapshot of `ops` on `arch_name`: {key: record}, for every posed problem `keep` takes.

    Each op is ranked by a `rules` dispatcher over its default rule set, the vendor candidate
    included, as the default dispatcher ranks it.
    """
    arch = arch_facts.load(arch_name)
    out = {}
    for op in ops:
        # lazy, as the default dispatcher's: each problem ranks its own class of the rule set
        dispatcher = Dispatcher(Registry.from_rule_sets([op], "default", arch), arch, strategy="rules")
        for posed in POSERS[op]():
            if keep is None or keep(posed):
                out[posed.key] = entry(posed, dispatcher)
    return out


def snapshot(arch_name: str, entries: dict) -> dict:
    return {"arch": arch_name, "top": TOP, "score_digits": SCORE_DIGITS, "entries": entries}


# -- comparing ---------------------------------------------------------------------------


def same_score(old: float, new: float) -> bool:
    """Equal to the stored digits, give or take one unit of the last (a rounding on either side of
    a boundary), or within SCORE_RTOL."""
    if old == new or math.isclose(old, new, rel_tol=SCORE_RTOL):
        return True
    if not (math.isfinite(old) and math.isfinite(new)) or old == 0:
        return False
    last_digit = 10.0 ** (math.floor(math.log10(abs(old))) - (SCORE_DIGITS - 1))
    return abs(old - new) <= last_digit * (1 + 1e-9)


def differences(expected: dict, got: dict) -> list[str]:
    """Every difference between two {key: record} maps: entries missing or new, picks, orders, counts
    of accepted candidates exactly, scores by `same_score`."""
    out = [f"{key}: in the snapshot, not posed now" for key in sorted(expected.keys() - got.keys())]
    out += [f"{key}: posed now, not in the snapshot" for key in sorted(got.keys() - expected.keys())]
    for key in sorted(expected.keys() & got.keys()):
        old, new = expected[key], got[key]
        for name in sorted(old.keys() | new.keys()):
            a, b = old.get(name), new.get(name)
            if name == "scores" and a is not None and b is not None and len(a) == len(b):
                if all(same_score(x, y) for x, y in zip(a, b)):
                    continue
            elif a == b:
                continue
            out.append(f"{key}: {name} {a} -> {b}")
    return out


def restrict(entries: dict, ops: tuple[str, ...]) -> dict:
    return {k: v for k, v in entries.items() if k.split("/", 1)[0] in ops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default=None, help="default: the snapshot's with --check, else sm_90")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated ops (default: all)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--out", type=Path, help="write the snapshot here")
    action.add_argument("--check", type=Path, help="compare with this snapshot; exit 1 on a difference")
    args = parser.parse_args()
    ops = tuple(args.ops.split(","))
    if set(ops) - set(OPS):
        parser.error(f"--ops: unknown {sorted(set(ops) - set(OPS))}; known: {', '.join(OPS)}")
    saved = json.loads(args.check.read_text()) if args.check else None
    arch = args.arch or (saved["arch"] if saved else "sm_90")
    if saved and saved["arch"] != arch:
        parser.error(f"{args.check} is a snapshot of {saved['arch']}, not {arch}")
    got = compute(arch, ops)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(snapshot(arch, got), indent=1, sort_keys=True) + "\n")
        counts = {op: len(restrict(got, (op,))) for op in ops}
        print(f"{len(got)} entries on {arch} {counts} -> {args.out}")
        return 0
    expected = restrict(saved["entries"], ops)
    found = differences(expected, got)
    print("\n".join(found + [f"{len(found)} difference(s) over {len(expected)} entries on {arch}"]))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
