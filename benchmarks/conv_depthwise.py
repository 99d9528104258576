"""Depthwise convolution: every direct (or toeplitz) candidate of a rule set against cuDNN and a copy, in turns.

For the four depthwise cases of benchmarks/suites/conv.json (or --cases from --suite files; bf16,
channels-last) and each direction, every direct-family kernel of the `full` rule set that supports
the problem (the sliding-window kernels all; the per-tap kernels the best --per-tap by the rules,
0 for all), or with --family toeplitz every toeplitz kernel, is compiled up front in parallel,
checked against fp32 cuDNN (relative error), then timed as CUDA-graph replays in turns with cuDNN's own call
(bench.timing.interleaved_medians), so each ratio compares the same moments of the GPU's
clock. The best few are timed again in FINAL_ROUNDS turns with cuDNN and with a
kernel copy of the bytes the convolution must move (half read, half written; bench/copy.py):
the copy is what "the bandwidth limit" means for a transfer of that size, launch and
tail included, where the 4.25 TB/s of a large copy is out of reach. Each row also holds
the `rules` model's time and rank, to calibrate ranking.py.

    python benchmarks/conv_depthwise.py --out DIR [--cases a,b] [--directions forward,...] [--per-tap 12]
    python benchmarks/conv_depthwise.py --out DIR --family toeplitz [--suite S.json] [--rule-set default]
    python benchmarks/conv_depthwise.py --dry-run          # no GPU: lists the candidates and the model's times

Writes DIR/conv_depthwise.csv (one row per case, direction and kernel; cuDNN and the copy included).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tiledispatch  # noqa: E402,F401  (first: it picks the backend)
from tiledispatch import arch as arch_facts  # noqa: E402
from tiledispatch.core.dispatcher import Dispatcher  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.ops.conv import Direction, ToeplitzConfig  # noqa: E402

CASES = ("depthwise_mbv2_3x3", "depthwise_5x5", "convnext_dw7x7", "conv1d_depthwise_k4_mamba")
SCREEN_ROUNDS = 3  # per candidate, each in turn with cuDNN
FINAL_ROUNDS = 7
FINALISTS = 3
TOLERANCE = 2e-2  # bf16, as benchmarks/conv.py
FIELDS = ["case", "direction", "kernel", "window", "rows", "band", "run", "split_k", "tile", "ms", "tbps", "ratio_vs_cudnn",
          "cudnn_ms_same_turns", "copy_fraction", "rel_error", "final", "model_us", "model_rank", "status"]


def candidates(dispatcher: Dispatcher, p, per_tap: int, family: str = "direct"):
    """The kernels of `family` that take p, best modelled first, each with the model's time and
    rank; of the direct family every window kernel and the best `per_tap` per-tap kernels (0: all)."""
    ranked = [c for c in dispatcher.explain(p).ranked if c.spec.family == family]
    out, taps = [], 0
    for rank, c in enumerate(ranked):
        per_tap_kernel = family == "direct" and c.spec.config.window == 0
        taps += per_tap_kernel
        if not per_tap_kernel or not per_tap or taps <= per_tap:
            out.append((c.spec, c.score.terms.get("modelled_us"), rank))
    return out


def describe(spec) -> dict:
    c = spec.config
    if isinstance(c, ToeplitzConfig):
        return {"rows": c.rows, "split_k": c.split_k, "tile": f"{c.block_m}x{c.block_c}w{c.num_warps}"}
    return {"window": c.window, "rows": c.rows, "band": c.band, "run": c.run, "split_k": c.split_k,
            "tile": f"{c.block_p}x{c.block_c}w{c.num_warps}"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("conv_depthwise_out"))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--directions", default=",".join(d.value for d in Direction))
    parser.add_argument("--rule-set", default="full")
    parser.add_argument("--family", default="direct", choices=("direct", "toeplitz"))
    parser.add_argument("--suite", type=Path, action="append", default=[],
                        help="more suites whose cases --cases may name (besides benchmarks/suites/conv.json)")
    parser.add_argument("--per-tap", type=int, default=12, help="per-tap kernels timed per case, by the rules (0: all)")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=200.0, help="stop screening new candidates after this")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: list the candidates and the model's times")
    args = parser.parse_args()
    started = time.perf_counter()

    from conv import problem_of  # benchmarks/conv.py

    suite = {}
    for path in [ROOT / "benchmarks/suites/conv.json", *args.suite]:
        suite |= {c["name"]: c for c in json.loads(path.read_text())["cases"]}
    if args.dry_run:
        arch = arch_facts.load("sm_90")
    else:
        from tiledispatch.core.runtime import current_arch
        arch = current_arch()
    dispatcher = Dispatcher(Registry.from_rule_set("conv", args.rule_set, arch), arch)
    work = []
    for name, direction in itertools.product(args.cases.split(","), args.directions.split(",")):
        p = problem_of(suite[name], Direction(direction), "bf16")
        p = replace(p, specialization=p.dense_specialization())
        work.append((name, p, candidates(dispatcher, p, args.per_tap, args.family)))
        print(f"{name} {direction}: {len(work[-1][2])} {args.family} candidates", flush=True)
        if args.dry_run:
            for spec, model_us, rank in work[-1][2]:
                print(f"   {rank:4d} {model_us:9.1f} us  {spec.name}")
    if args.dry_run:
        return 0
    return run(args, dispatcher, work, started)


def run(args, dispatcher, work, started) -> int:
    import torch

    from conv import precompile

    args.out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    precompile(dispatcher, [{"problem": p, "triton": [s for s, _, _ in cands]} for _, p, cands in work], args.jobs)
    print(f"compiled in {time.perf_counter() - t:.0f} s", flush=True)
    path = args.out / "conv_depthwise.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for name, p, cands in work:
            writer.writerows(run_case(args, dispatcher, name, p, cands, started))
            f.flush()
            torch.cuda.empty_cache()
    print(f"done in {time.perf_counter() - started:.0f} s; {path}")
    return 0


def run_case(args, dispatcher, name, p, cands, started) -> list[dict]:
    """Screens the candidates in turns with cuDNN, then times the finalists, cuDNN and the copy in turns."""
    from conv import copy_fn, cudnn_fn, make_sets, reference, rel_error, sampler
    from tiledispatch.bench.timing import interleaved_medians

    direction = p.direction.value
    sets = make_sets(p)
    ref = reference(p, sets[0])
    vendor = cudnn_fn(p)
    vendor_sampler = sampler(vendor, sets)
    moved = p.bytes()
    case_rows, fns = [], {}
    for spec, model_us, rank in cands:
        row = {"case": name, "direction": direction, "kernel": spec.name, **describe(spec), "model_us": model_us,
               "model_rank": rank}
        if time.perf_counter() - started > args.budget_s:
            case_rows.append({**row, "status": "skipped-for-time"})
            continue
        fn = lambda s, spec=spec: dispatcher.run(s["ops"], kernel=spec)  # noqa: E731
        try:
            err = rel_error(fn(sets[0]), ref)
        except Exception as e:  # does not build or launch: reported, not fatal
            case_rows.append({**row, "status": f"failed: {str(e)[:200]}"})
            continue
        if not err <= TOLERANCE:
            case_rows.append({**row, "rel_error": f"{err:.2e}", "status": "wrong-result"})
            print(f"WRONG RESULT {name} {direction} {spec.name}: {err:.2e}", flush=True)
            continue
        medians = interleaved_medians({"cudnn": vendor_sampler, "k": sampler(fn, sets)}, SCREEN_ROUNDS)
        fns[spec.name] = fn
        case_rows.append({**row, "ms": medians["k"], "cudnn_ms_same_turns": medians["cudnn"],
                          "rel_error": f"{err:.2e}", "status": "ok"})
    timed = sorted((r for r in case_rows if r.get("ms")), key=lambda r: r["ms"] / r["cudnn_ms_same_turns"])
    finalists = {r["kernel"]: sampler(fns[r["kernel"]], sets) for r in timed[:FINALISTS]}
    copy, copies = copy_fn(moved, len(sets))
    copy = sampler(copy, copies)
    final = interleaved_medians({"cudnn": vendor_sampler, "copy": copy, **finalists}, FINAL_ROUNDS)
    for r in case_rows:
        if r["kernel"] in final:
            r.update(ms=final[r["kernel"]], cudnn_ms_same_turns=final["cudnn"], final=True)
    vendor_error = rel_error(vendor(sets[0]), ref)
    case_rows.append({"case": name, "direction": direction, "kernel": "cudnn", "ms": final["cudnn"],
                      "cudnn_ms_same_turns": final["cudnn"], "rel_error": f"{vendor_error:.2e}", "final": True,
                      "status": "ok"})
    case_rows.append({"case": name, "direction": direction, "kernel": "copy", "ms": final["copy"],
                      "cudnn_ms_same_turns": final["cudnn"], "final": True, "status": "ok"})
    for r in case_rows:
        if r.get("ms"):
            r["tbps"] = round(moved / r["ms"] / 1e9, 3)
            r["ratio_vs_cudnn"] = round(r["cudnn_ms_same_turns"] / r["ms"], 3)
            r["copy_fraction"] = round(final["copy"] / r["ms"], 3) if r.get("final") else None
            r["ms"] = round(r["ms"], 5)
            r["cudnn_ms_same_turns"] = round(r["cudnn_ms_same_turns"], 5)
    best = sorted((r for r in case_rows if r.get("ms") and r["kernel"].startswith("conv_")),
                  key=lambda r: -r["ratio_vs_cudnn"])
    print(f"\n{name} {direction}: cuDNN {final['cudnn']:.4f} ms ({moved / final['cudnn'] / 1e9:.2f} TB/s), copy "
          f"{final['copy']:.4f} ms ({moved / final['copy'] / 1e9:.2f} TB/s); {len(timed)} timed", flush=True)
    for r in best[:8]:
        print(f"   {r['ms']:.4f} ms {r['tbps']:5.2f} TB/s x{r['ratio_vs_cudnn']:.2f} vs cuDNN  model "
              f"{r['model_us']:.1f} us (#{r['model_rank']})  {r['kernel']}", flush=True)
    return case_rows


if __name__ == "__main__":
    sys.exit(main())
