"""Sliding-window depthwise kernels under register caps, timed in turns with a copy of the same bytes.

The window kernels' cap (ops/conv/rules.py, window_register_cap) was chosen from this run: for the
forward and backward-data of ConvNeXt's 7x7, the 5x5 case and MobileNet's 3x3 (bf16), the
default dispatcher's pick and the `full` set's best-ranked window tiles are each compiled with
no cap (ptxas's own allocation), 168 and 128 registers, checked against fp32 cuDNN, and timed
as CUDA-graph replays in turns (benchmarks/conv.py's samplers). `--cases` times other
case:direction pairs, e.g. the backward-weight windows (rules.weight_window_register_cap), and
`--dtypes` other dtypes.

    python benchmarks/studies/conv_window_cap.py [--top 2] [--caps 0,168,128] [--cases convnext_dw7x7:bwd_weight,...]
                                         [--dtypes bf16,fp16]
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite runners
import conv as bench  # noqa: E402  (benchmarks/conv.py: its problems, inputs, samplers and copy)

from tiledispatch.bench.timing import interleaved_medians  # noqa: E402
from tiledispatch.core.dispatcher import Dispatcher  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.core.runtime import current_arch  # noqa: E402
from tiledispatch.ops.conv import Direction  # noqa: E402

plan = importlib.import_module("tiledispatch.ops.conv.plan")  # the module (the package exports a function `plan`)
CASES = (("convnext_dw7x7", Direction.FORWARD), ("convnext_dw7x7", Direction.BWD_DATA),
         ("depthwise_5x5", Direction.FORWARD), ("depthwise_5x5", Direction.BWD_DATA),
         ("depthwise_mbv2_3x3", Direction.FORWARD))


def with_cap(main, cap: int | None):
    """`main` (plan._main_unit) with every window kernel's cap forced to `cap` (None: ptxas's own)."""
    def unit(config, specialization):
        found = main(config, specialization)
        return replace(found, max_registers=cap) if getattr(config, "window", 0) else found
    return unit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=2, help="window tiles of the full set beside the default pick")
    parser.add_argument("--caps", default="0,168,128", help="register caps; 0: none")
    parser.add_argument("--cases", default=",".join(f"{name}:{d.value}" for name, d in CASES),
                        help="comma-separated case:direction pairs of the suite")
    parser.add_argument("--dtypes", default="bf16", help="comma-separated: bf16, fp16")
    args = parser.parse_args()
    arch = current_arch()
    default = Dispatcher(Registry.from_rule_set("conv", "default", arch), arch)
    full = Dispatcher(Registry.from_rule_set("conv", "full", arch), arch)
    cases = {c["name"]: c for c in json.loads(bench.SUITE.read_text())["cases"]}
    original = plan._main_unit
    pairs = [pair.split(":") for pair in args.cases.split(",")]
    for (name, direction), dtype in itertools.product(pairs, args.dtypes.split(",")):
        direction = Direction(direction)
        p = bench.problem_of(cases[name], direction, dtype)
        p = replace(p, specialization=p.dense_specialization())
        sets = bench.make_sets(p)
        ref = bench.reference(p, sets[0])
        pick = default.select(sets[0]["ops"].problem)
        ranked = [c.spec for c in full.explain(sets[0]["ops"].problem).ranked
                  if c.spec.family == "direct" and c.spec.config.window]
        specs = ([pick] if pick.family == "direct" else []) + [s for s in ranked if s.name != pick.name][:args.top]
        samplers = {"cudnn": bench.sampler(bench.cudnn_fn(p), sets)}
        for cap in (int(c) or None for c in args.caps.split(",")):
            plan._main_unit = with_cap(original, cap)
            plan.kernel_units.cache_clear()  # units are cached per config, and the cap is not in it
            capped = Dispatcher(Registry.from_rule_set("conv", "full", arch), arch)  # launchers of its own
            for spec in specs:
                fn = bench.call(capped, spec)
                error = bench.rel_error(fn(sets[0]), ref)
                if error <= bench.TOLERANCE[dtype]:
                    samplers[f"{spec.name.split('_direct_')[-1]} cap {cap or '-'}"] = bench.sampler(fn, sets)
                else:
                    print(f"WRONG {spec.name} cap {cap}: relative error {error:.2e}", flush=True)
        plan._main_unit = original
        plan.kernel_units.cache_clear()
        copy, copies = bench.copy_fn(p.bytes(), len(sets))
        samplers["copy"] = bench.sampler(copy, copies)
        medians = interleaved_medians(samplers, 15)
        print(f"{name} {direction.value} {dtype} (default pick {pick.name})", flush=True)
        for label, ms in sorted(medians.items(), key=lambda kv: kv[1]):
            print(f"    {label:<44} {ms * 1e3:8.2f} us  copy fraction {medians['copy'] / ms:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
