"""The GEMM suite on the GPU, side by side with cuBLAS (and torch._scaled_mm for fp8).

For every case of benchmarks/suites/gemm.json (a copy of ../shared/suites/gemm.json) and
every dtype, with A row-major and B column-major (an nn.Linear weight):
  - every Triton kernel of the registry that supports the problem (with --top N, the rules'
    best N of each family) is checked against an fp32 reference, then timed: CUDA-event
    median after warm-up, inputs rotated through sets larger than L2;
  - the `rules` pick among the Triton kernels, and the dispatcher's pick with the vendor
    candidate in the registry (when the registry has one);
  - cuBLAS through PyTorch, timed the same way in the same run.
Kernel times come from CUDA-graph replays (bench.timing), so they hold no host time. Candidates
are screened one after another; then cuBLAS, the rules' pick, the screening's fastest and the
dispatcher's pick are timed again in turns, and the compared figures are those: the oracle is
the fastest Triton kernel of those final rounds.
Also the host time of a call on a tiny known problem, against torch.mm, and under a CUDA graph.

    python benchmarks/gemm.py --out benchmarks/results/h200 [--dtypes bf16,fp16,fp8e4m3] [--cases NAME,...]
    python benchmarks/gemm.py --out DIR/1 --shard 1/3   (then 2/3, 3/3, then --merge DIR/*/gemm.csv)
    python benchmarks/gemm.py --out DIR --picks-only     (the picks and cuBLAS alone: no oracle, one call)
    python benchmarks/gemm.py --out DIR --top 3          (the oracle among the rules' best 3 of each family)

Writes gemm.csv (one row per case, dtype and provider), gemm_summary.json and gemm.png.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path

import tiledispatch  # noqa: F401  (first: it picks the backend)
import torch

from tiledispatch.bench.plots import plot_speed_vs_vendor
from tiledispatch.bench.results import Environment, record_run
from tiledispatch.bench.timing import (
    geomean,
    graph_median_ms,
    graph_sampler,
    host_us_per_call,
    interleaved_medians,
    percentile,
)
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.kernel import build_all
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.gemm import check_operands
from tiledispatch.ops.gemm.ranking import replay_pick

SUITE = Path(__file__).parent / "suites" / "gemm.json"
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8e4m3": torch.float8_e4m3fn}
L2_BYTES = 60 * 2**20
GPU_SECONDS_PER_KERNEL = 0.05  # timing budget per candidate and case: sets the repeat count
FINAL_ROUNDS = 7  # cuBLAS, the rules' pick, the oracle and the dispatcher's pick, sampled in turns


def make_sets(case: dict, dtype: str, shapes_only: bool = False, device: str = "cuda") -> list[dict]:
    """Input sets for one case, enough of them that rotating through them defeats L2.

    `shapes_only`: one set of uninitialised tensors, for describing the problem (on the
    host, `device="cpu"`, where there is no GPU).
    """
    m, n, k, batch = case["M"], case["N"], case["K"], case["batch"]
    torch_dtype = TORCH_DTYPES[dtype]
    bytes_per_set = batch * (m * k + n * k) * torch_dtype.itemsize
    count = 1 if shapes_only else max(2, min(8, math.ceil(3 * L2_BYTES / bytes_per_set)))
    make = (lambda *shape: torch.empty(*shape, device=device, dtype=torch_dtype)) if shapes_only else (
        lambda *shape: torch.randn(*shape, device=device).to(torch_dtype))
    sets = []
    for _ in range(count):
        lead = (batch,) if batch > 1 else ()
        a = make(*lead, m, k)
        b = make(*lead, n, k).transpose(-1, -2)  # K x N, column-major
        entry = {"a": a, "b": b}
        if dtype.startswith("fp8"):
            entry["scale_a"] = torch.tensor(1.0 / math.sqrt(k), device=device)
            entry["scale_b"] = torch.tensor(1.0, device=device)
        sets.append(entry)
    return sets


def problem_of(case: dict, dtype: str, device: str = "cuda"):
    """The problem a case poses, alignment included: checked on one set of uninitialised tensors."""
    s = make_sets(case, dtype, shapes_only=True, device=device)[0]
    return check_operands(s["a"], s["b"], scale_a=s.get("scale_a"), scale_b=s.get("scale_b")).problem


def vendor_fn(dtype: str):
    if dtype.startswith("fp8"):
        def scaled(s):
            if s["a"].dim() == 3:
                raise RuntimeError("torch._scaled_mm has no batched form")
            return torch._scaled_mm(s["a"], s["b"], s["scale_a"], s["scale_b"], out_dtype=torch.bfloat16)
        return scaled
    return lambda s: torch.matmul(s["a"], s["b"])


def reference(s: dict) -> torch.Tensor:
    out = torch.matmul(s["a"].float(), s["b"].float())
    if "scale_a" in s:
        out = out * s["scale_a"] * s["scale_b"]
    return out


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def call(dispatcher, kernel):
    return lambda s: tiledispatch.gemm(s["a"], s["b"], scale_a=s.get("scale_a"), scale_b=s.get("scale_b"),
                                       kernel=kernel, dispatcher=dispatcher)


def precompile(dispatcher: Dispatcher, jobs: list, workers: int) -> None:
    """Compiles every (candidate, alignment) the run will need, in parallel, before timing."""
    by_alignment: dict = {}
    for problem, specs in jobs:
        by_alignment.setdefault(problem.alignment, set()).update(specs)
    for alignment, specs in by_alignment.items():
        start = time.perf_counter()
        results = build_all(sorted(specs, key=lambda s: s.name), dispatcher.cache, workers,
                            specializations=(alignment,))
        failed = [r for r in results if not r.ok]
        print(f"built {len(results) - len(failed)} kernels for {alignment.tag} in {time.perf_counter() - start:.0f} s"
              + (f"; {len(failed)} failed: {failed[0].error[:300]}" if failed else ""), flush=True)


def host_overhead(dispatcher: Dispatcher) -> dict:
    """Host time per call on a tiny problem seen before: tiledispatch, torch.mm, and a graph replay.

    The dispatcher sends the tiny problem to cuBLAS (its device time is the lowest), so
    `host_us_dispatch` is torch.mm's own host time plus ours; `host_us_dispatch_triton`
    is the same call with the vendor left out of the registry: a Triton launch through
    the bound fast path, the figure ANCHORS.md compares with torch.mm.
    """
    a = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 16, device="cuda", dtype=torch.bfloat16)
    triton_only = Dispatcher(dispatcher.registry.filter(lambda spec: spec.family != "vendor"), dispatcher.arch)

    results = {
        "host_us_dispatch": host_us_per_call(lambda: tiledispatch.gemm(a, b, out=out, dispatcher=dispatcher)),
        "host_us_dispatch_no_out": host_us_per_call(lambda: tiledispatch.gemm(a, b, dispatcher=dispatcher)),
        "host_us_dispatch_triton": host_us_per_call(lambda: tiledispatch.gemm(a, b, out=out, dispatcher=triton_only)),
        "host_us_torch_mm": host_us_per_call(lambda: torch.mm(a, b, out=out)),
        "host_us_torch_mm_no_out": host_us_per_call(lambda: torch.mm(a, b)),
    }
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiledispatch.gemm(a, b, out=out, dispatcher=dispatcher)
    results["host_us_graph_replay"] = host_us_per_call(graph.replay)
    return {k: round(v, 2) for k, v in results.items()}


def best_of_each_family(ranked: list, top: int, pick) -> list:
    """The first `top` of each family in the rules' order, and the rules' own pick (which the
    ranking of launch-bound problems may take from further down)."""
    seen: dict[str, int] = {}
    chosen = []
    for spec in ranked:
        seen[spec.family] = seen.get(spec.family, 0) + 1
        if seen[spec.family] <= top or spec.name == pick.name:
            chosen.append(spec)
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200"))
    parser.add_argument("--dtypes", default="bf16,fp16,fp8e4m3")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--shard", default="1/1", help="i/n: run the i-th of n equal slices of the cases "
                        "(a suite too long for one device call); --merge joins the CSVs")
    parser.add_argument("--rule-set", default="default")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--merge", nargs="+", type=Path, default=None,
                        help="no GPU work: rebuild gemm.csv, the summary and the plot from these CSVs of "
                             "earlier runs (a suite split over several device calls); host figures are "
                             "taken from --host-json")
    parser.add_argument("--host-json", type=Path, default=None)
    parser.add_argument("--top", type=int, default=0,
                        help="time only the best N of each family by the rules (0: every candidate); the oracle "
                             "is then the fastest of those: a suite in fewer device calls, at the risk of missing "
                             "a kernel the rules rank low")
    parser.add_argument("--picks-only", action="store_true",
                        help="time only the picks (the rules' among our kernels, the dispatcher's) and cuBLAS: "
                             "the whole suite in one device call, without the oracle and selection figures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        return merge(args)

    suite = json.loads(SUITE.read_text())
    cases = [c for c in suite["cases"] if not args.cases or c["name"] in args.cases.split(",")]
    shard, shards = (int(x) for x in args.shard.split("/"))
    cases = cases[(shard - 1) * len(cases) // shards: shard * len(cases) // shards]
    dtypes = args.dtypes.split(",")
    arch = current_arch()
    registry = Registry.from_rule_set("gemm", args.rule_set, arch)
    dispatcher = Dispatcher(registry, arch)
    ours = Dispatcher(registry.filter(lambda s: s.family != "vendor"), arch)  # our kernels alone

    work = []
    for case in cases:
        for dtype in dtypes:
            problem = problem_of(case, dtype)
            explanation = dispatcher.explain(problem)
            triton = [c.spec for c in explanation.ranked if c.spec.family != "vendor"
                      and c.spec.config.layout.name == problem.layout.name]
            if args.top:
                triton = best_of_each_family(triton, args.top, replay_pick(ours, problem))
            if args.picks_only:  # what `selected` below would be, found without timing
                triton = [replay_pick(ours, problem)]
            work.append((case, dtype, problem, triton, explanation))
    torch.cuda.empty_cache()
    precompile(dispatcher, [(p, t) for _, _, p, t, _ in work], args.jobs)

    rows, summary_cases = [], []
    csv_path = args.out / "gemm.csv"
    fields = ["case", "dtype", "m", "n", "k", "batch", "provider", "kernel", "ms", "tflops", "ratio_vs_vendor",
              "rel_error"]
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for case, dtype, problem, triton, explanation in work:
            sets = make_sets(case, dtype)
            ref = reference(sets[0])
            flops = problem.flops()

            def record(provider, kernel, ms, err):
                row = {"case": case["name"], "dtype": dtype, "m": problem.m, "n": problem.n, "k": problem.k,
                       "batch": problem.batch, "provider": provider, "kernel": kernel,
                       "ms": None if ms is None else round(ms, 5),
                       "tflops": None if ms is None else round(flops / ms / 1e9, 2), "ratio_vs_vendor": None,
                       "rel_error": None if err is None else f"{err:.2e}"}
                rows.append(row)
                return row

            vendor, vendor_error = vendor_fn(dtype), None
            try:
                vendor_error = rel_error(vendor(sets[0]), ref)
                estimate_ms = graph_median_ms(vendor, sets, 20)
            except RuntimeError as e:
                vendor, estimate_ms = None, flops / 300e9  # no cuBLAS call: guess 300 TFLOP/s
                record("cublas", f"unavailable: {str(e).splitlines()[0][:80]}", None, None)
            times = {}
            tolerance = 2e-2 if dtype != "fp16" else 5e-3
            repeats = max(5, min(25, int(GPU_SECONDS_PER_KERNEL * 1e3 / max(estimate_ms, 1e-3))))
            for spec in triton:
                fn = call(dispatcher, spec.name)
                err = rel_error(fn(sets[0]), ref)
                if not err <= tolerance:
                    record("triton-rejected", spec.name, None, err)
                    print(f"WRONG RESULT {case['name']} {dtype} {spec.name}: rel error {err:.2e}", flush=True)
                    continue
                times[spec.name] = graph_median_ms(fn, sets, repeats)
                record("triton-candidate", spec.name, times[spec.name], err)
            # What a CUDA graph of the call runs (the rows are graph replays): for a launch-bound
            # problem, the fastest kernel on the device rather than the cheapest to launch.
            timed = Dispatcher(dispatcher.registry.filter(lambda s: s.name in times), dispatcher.arch)
            selected = replay_pick(timed, problem).name if times else None
            oracle = min(times, key=times.get) if times else None
            dispatcher_pick = replay_pick(dispatcher, problem).name if explanation.selected else None
            # The compared figures are timed again in turns: the GPU's clock drifts by more than the
            # margins between them (see bench.timing.interleaved_medians).
            finalists = {name: call(dispatcher, name) for name in (selected, oracle, dispatcher_pick) if name}
            if vendor is not None:
                finalists["cublas"] = vendor
            final = interleaved_medians({name: graph_sampler(fn, sets, repeats) for name, fn in finalists.items()},
                                        FINAL_ROUNDS)
            vendor_ms, dispatch_ms = final.get("cublas"), final.get(dispatcher_pick)
            # The oracle is the fastest Triton finalist of the final rounds (the rules' pick may have won
            # the re-timing). Every other candidate was slower than the finalists at screening, and a
            # screening time set beside a final-round one compares two moments of the GPU's clock: on
            # the H200 whole final rounds ran up to 8 % slower than the screening before them.
            oracle = min((name for name in final if name in times), key=final.get, default=None)
            times.update({name: ms for name, ms in final.items() if name in times})  # Triton kernels only
            if args.picks_only:
                oracle = None  # nothing else was timed
            if vendor is not None:
                record("cublas", "torch._scaled_mm" if dtype.startswith("fp8") else "torch.matmul", vendor_ms,
                       vendor_error)
            entry = {"case": case["name"], "dtype": dtype, "cublas_ms": vendor_ms,
                     "selected": selected, "selected_ms": times.get(selected), "oracle": oracle,
                     "oracle_ms": times.get(oracle), "dispatcher": dispatcher_pick, "dispatcher_ms": dispatch_ms}
            for provider, name, ms in (("triton-selected", selected, entry["selected_ms"]),
                                       ("triton-oracle", oracle, entry["oracle_ms"]),
                                       ("dispatcher", dispatcher_pick, dispatch_ms)):
                row = record(provider, name, ms, None)
                if ms and vendor_ms:
                    row["ratio_vs_vendor"] = round(vendor_ms / ms, 4)
            summary_cases.append(entry)
            for row in rows:
                if row["ratio_vs_vendor"] is None and row["ms"] and vendor_ms and row["provider"] != "cublas":
                    row["ratio_vs_vendor"] = round(vendor_ms / row["ms"], 4)
            writer.writerows(rows)
            f.flush()
            print(f"{case['name']:<28} {dtype:<8} cublas {flops / vendor_ms / 1e9 if vendor_ms else float('nan'):7.1f}"
                  f"  selected {flops / entry['selected_ms'] / 1e9 if entry['selected_ms'] else float('nan'):7.1f}"
                  f"  oracle {flops / entry['oracle_ms'] / 1e9 if entry['oracle_ms'] else float('nan'):7.1f}"
                  f"  dispatcher {flops / dispatch_ms / 1e9 if dispatch_ms else float('nan'):7.1f} TFLOP/s",
                  flush=True)
            rows.clear()
            del sets, ref
            torch.cuda.empty_cache()

    summary = summarize(summary_cases, dtypes)
    summary.update(host_overhead(dispatcher))
    summary.update({
        "cases": len(summary_cases),
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "rule_set": args.rule_set,
        "top_per_family": args.top or None,
    })
    (args.out / "gemm_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    record_run(args.out, "gemm.csv")  # its rows into the folder's long-format table (results.parquet)
    plot_speed_vs_vendor(summary_cases, args.out / "gemm.png", vendor="cuBLAS", vendor_key="cublas_ms",
                         label=lambda e: e["case"])
    print(json.dumps({k: v for k, v in summary.items() if k != "per_dtype"}, indent=1))
    return 0


def merge(args) -> int:
    rows = [row for path in args.merge for row in csv.DictReader(path.open())]
    with (args.out / "gemm.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    host = json.loads(args.host_json.read_text()) if args.host_json else {}  # the shards' GPU and versions
    record_run(args.out, "gemm.csv", Environment(gpu=host.get("gpu"), torch=host.get("torch"),
                                                 triton=host.get("triton")))
    entries: dict[tuple, dict] = {}
    keys = {"cublas": ("vendor", "cublas_ms"), "triton-selected": ("selected", "selected_ms"),
            "triton-oracle": ("oracle", "oracle_ms"), "dispatcher": ("dispatcher", "dispatcher_ms")}
    for row in rows:
        entry = entries.setdefault((row["case"], row["dtype"]), {"case": row["case"], "dtype": row["dtype"]})
        if row["provider"] in keys:
            name_key, ms_key = keys[row["provider"]]
            entry[name_key] = row["kernel"]
            entry[ms_key] = float(row["ms"]) if row["ms"] else None
    cases = list(entries.values())
    dtypes = sorted({e["dtype"] for e in cases})
    summary = summarize(cases, dtypes)
    if args.host_json:
        summary.update({k: v for k, v in host.items() if k.startswith("host_us")})
    summary.update({"cases": len(cases), "command": "python " + " ".join(sys.argv) + " (merged runs)",
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "gpu": host.get("gpu") if args.host_json else None, "rule_set": args.rule_set,
                    "top_per_family": args.top or None})
    (args.out / "gemm_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot_speed_vs_vendor(cases, args.out / "gemm.png", vendor="cuBLAS", vendor_key="cublas_ms",
                         label=lambda e: e["case"])
    print(json.dumps({k: v for k, v in summary.items() if k != "per_dtype"}, indent=1))
    return 0


def summarize(entries: list[dict], dtypes: list[str]) -> dict:
    def stats(subset):
        # a case may lack any provider's row (cuBLAS unavailable, a pick that failed its check)
        with_vendor = [e for e in subset if e.get("cublas_ms")]
        ratio = lambda key: [e["cublas_ms"] / e[key] for e in with_vendor if e.get(key)]  # noqa: E731
        efficiency = [e["oracle_ms"] / e["selected_ms"] for e in subset if e.get("selected_ms") and e.get("oracle_ms")]
        dispatcher_ratio = ratio("dispatcher_ms")
        return {
            "geomean_ratio_triton_selected": geomean(ratio("selected_ms")),
            "geomean_ratio_triton_oracle": geomean(ratio("oracle_ms")),
            "geomean_ratio_dispatcher": geomean(dispatcher_ratio),
            "min_ratio_dispatcher": min(dispatcher_ratio) if dispatcher_ratio else None,
            "selection_efficiency_mean": statistics.mean(efficiency) if efficiency else None,
            "selection_efficiency_median": statistics.median(efficiency) if efficiency else None,
            "selection_efficiency_p10": percentile(efficiency, 0.10),
            "selection_efficiency_min": min(efficiency) if efficiency else None,
        }

    summary = stats([e for e in entries if not e["dtype"].startswith("fp8")])  # the bf16/fp16 targets
    summary["per_dtype"] = {d: stats([e for e in entries if e["dtype"] == d]) for d in dtypes}
    return summary


if __name__ == "__main__":
    sys.exit(main())
