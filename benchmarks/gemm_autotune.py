"""The dispatcher's two strategies on the GEMM suite, side by side with cuBLAS: `rules` and `autotune`.

For every case and dtype of benchmarks/suites/gemm.json (A row-major, B column-major, as
benchmarks/gemm.py lays them out): the kernel `rules` picks with the vendor candidate in the
registry, the one `autotune` picks (its finalists timed once on fresh operands, the winner kept
in a tuning store under a fresh cache directory), and cuBLAS. Both picks are checked against an
fp32 reference; then the three are timed in turns from CUDA-graph replays over inputs rotated
beyond L2. Also the wall time each tuning took (its kernels compiled beforehand).

    python benchmarks/gemm_autotune.py --out benchmarks/results/h200 [--dtypes bf16,fp16] [--cases NAME,...]

Writes gemm_autotune.csv and gemm_autotune_summary.json. The oracle among our kernels, and the
`rules` pick among them alone, are benchmarks/gemm.py's: this script times no other candidate.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import tiledispatch  # noqa: F401  (first: it picks the backend)
import torch

from gemm import FINAL_ROUNDS, SUITE, call, make_sets, precompile, problem_of, reference, rel_error, vendor_fn
from tiledispatch.bench.timing import geomean, graph_sampler, interleaved_medians
from tiledispatch.core.dispatcher import Dispatcher, Strategy
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.heuristics import autotune

GPU_SECONDS_PER_KERNEL = 0.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--rule-set", default="default")
    parser.add_argument("--jobs", type=int, default=16)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suite = json.loads(SUITE.read_text())
    cases = [c for c in suite["cases"] if not args.cases or c["name"] in args.cases.split(",")]
    arch = current_arch()
    registry = Registry.from_rule_set("gemm", args.rule_set, arch)
    rules = Dispatcher(registry, arch)
    # A fresh tuning store: every case is tuned in this run, none read from an earlier one.
    tuned = Dispatcher(registry, arch, strategy=Strategy.AUTOTUNE, cache=rules.cache,
                       tuning=autotune.TuningStore(Path(tempfile.mkdtemp(prefix="tiledispatch-tuning-"))))

    work = []
    for case in cases:
        for dtype in args.dtypes.split(","):
            problem = problem_of(case, dtype)
            finalists = [c.spec for c in autotune.finalists(tuned.explain(problem).ranked)]
            work.append((case, dtype, problem, finalists))
    precompile(rules, [(p, f) for _, _, p, f in work], args.jobs)

    fields = ["case", "dtype", "m", "n", "k", "batch", "cublas_ms", "rules_kernel", "rules_ms", "autotune_kernel",
              "autotune_ms", "tuned", "tune_s", "ratio_rules", "ratio_autotune", "rel_error_rules",
              "rel_error_autotune", "finalists_ms"]
    entries = []
    with (args.out / "gemm_autotune.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for case, dtype, problem, _ in work:
            sets = make_sets(case, dtype)
            ref = reference(sets[0])
            rules_pick = rules.select(problem)
            start = time.perf_counter()
            autotune_pick = tuned.select(problem, device=sets[0]["a"].device)
            tune_s = time.perf_counter() - start
            record = tuned.explain(problem).tuned_ms
            errors = {name: rel_error(call(rules, name)(sets[0]), ref) for name in {rules_pick.name, autotune_pick.name}}
            tolerance = 2e-2 if dtype != "fp16" else 5e-3
            wrong = [name for name, err in errors.items() if not err <= tolerance]
            if wrong:
                print(f"WRONG RESULT {case['name']} {dtype}: {wrong} {errors}", flush=True)
                continue
            flops = problem.flops()
            finalists = {"rules": call(rules, rules_pick.name), "autotune": call(rules, autotune_pick.name)}
            try:
                vendor = vendor_fn(dtype)
                vendor(sets[0])
                finalists["cublas"] = vendor
            except RuntimeError:
                pass
            repeats = max(5, min(25, int(GPU_SECONDS_PER_KERNEL * 1e3 / max(flops / 500e9, 1e-3))))
            ms = interleaved_medians({name: graph_sampler(fn, sets, repeats) for name, fn in finalists.items()},
                                     FINAL_ROUNDS)
            vendor_ms = ms.get("cublas")
            entry = {"case": case["name"], "dtype": dtype, "m": problem.m, "n": problem.n, "k": problem.k,
                     "batch": problem.batch, "cublas_ms": vendor_ms, "rules_kernel": rules_pick.name,
                     "rules_ms": ms["rules"], "autotune_kernel": autotune_pick.name, "autotune_ms": ms["autotune"],
                     "tuned": record is not None, "tune_s": round(tune_s, 3),
                     "ratio_rules": vendor_ms / ms["rules"] if vendor_ms else None,
                     "ratio_autotune": vendor_ms / ms["autotune"] if vendor_ms else None,
                     "rel_error_rules": f"{errors[rules_pick.name]:.2e}",
                     "rel_error_autotune": f"{errors[autotune_pick.name]:.2e}",
                     "finalists_ms": json.dumps(record) if record else None}
            entries.append(entry)
            writer.writerow(entry)
            f.flush()
            tf = lambda t: flops / t / 1e9 if t else float("nan")  # noqa: E731
            print(f"{case['name']:<28} {dtype:<8} cublas {tf(vendor_ms):7.1f}  rules {tf(ms['rules']):7.1f}"
                  f"  autotune {tf(ms['autotune']):7.1f} TFLOP/s  (tuned in {tune_s:.2f} s: "
                  f"{autotune_pick.family})", flush=True)
            del sets, ref
            torch.cuda.empty_cache()

    summary = summarize(entries)
    summary.update({"cases": len(entries), "command": "python " + " ".join(sys.argv),
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "triton": __import__("triton").__version__, "rule_set": args.rule_set,
                    "top_k": autotune.TOP_K})
    (args.out / "gemm_autotune_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


def summarize(entries: list[dict]) -> dict:
    def stats(subset):
        out = {}
        for strategy in ("rules", "autotune"):
            ratios = [e[f"ratio_{strategy}"] for e in subset if e[f"ratio_{strategy}"]]
            out[f"geomean_ratio_dispatcher_{strategy}"] = geomean(ratios)
            out[f"min_ratio_dispatcher_{strategy}"] = min(ratios) if ratios else None
        tune = sorted(e["tune_s"] for e in subset)
        out["tune_s_median"] = tune[len(tune) // 2] if tune else None
        out["tune_s_max"] = tune[-1] if tune else None
        return out

    summary = stats([e for e in entries if not e["dtype"].startswith("fp8")])
    summary["per_dtype"] = {d: stats([e for e in entries if e["dtype"] == d])
                            for d in sorted({e["dtype"] for e in entries})}
    return summary


if __name__ == "__main__":
    sys.exit(main())
