"""The grouped-convolution suite on the GPU, side by side with cuDNN measured in the same run.

For every case of benchmarks/suites/conv.json (a copy of ../shared/suites/conv.json),
every direction (forward, bwd_data, bwd_weight) and every dtype, channels-last:
  - cuDNN through PyTorch (F.conv{1,2,3}d, aten.convolution_backward), timed;
  - the Triton candidates of the registry that support the problem (the `rules` pick and
    the best `--top` of each family by the `rules` ranking, 0 for all), compiled in
    parallel up front, each checked against an fp32 cuDNN reference before it is timed;
    the fastest is the oracle;
  - the `rules` pick among the Triton kernels, and the dispatcher's pick with cuDNN as a
    candidate.
Times are CUDA-event medians after warm-up: of CUDA-graph replays (no host time in them,
input sets rotated so that the working set is beyond L2) for calls under SLOW_MS, of
single calls above it, where a graph of many calls would cost seconds and the host time
is noise. The repeat count follows each candidate's own first timed call, so a kernel
100x slower than cuDNN costs a few calls, not a budget. Candidates are screened one after
another; then cuDNN, the rules' pick, the oracle and the dispatcher's pick are timed again
in turns (FINAL_ROUNDS), and the compared figures are those: the GPU's clock drifts by more
than the margins measured here. TFLOP/s and TB/s (the fewest
bytes the conv must move) are reported for each; depthwise cases also time, in the same
turns, a copy kernel moving those bytes (`copy_fraction_depthwise`: a 17-38 MB copy
moves 2.9-3.5 TB/s, where `bandwidth_fraction_depthwise` divides by 4.25; bench/copy.py
says why a kernel and not torch's memcpy).

    python benchmarks/conv.py --out benchmarks/results/h200 [--dtypes bf16,fp16]
        [--directions forward,bwd_data,bwd_weight] [--suite FILE] [--cases NAME,...] [--top 2]
        [--budget-s 480]

The whole suite (15 cases x 3 directions x 2 dtypes) is sized for one 10-minute device
call on an H200: compiles first (16 workers), then about 2-4 s per case-direction-dtype.

Writes conv.csv (one row per case, direction, dtype and provider), conv_summary.json and conv.png.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

import tiledispatch  # noqa: F401  (first: it picks the backend)
from tiledispatch.bench.copy import copy_elements, kernel_copy
from tiledispatch.bench.plots import plot_speed_vs_vendor
from tiledispatch.bench.results import record_run
from tiledispatch.bench.timing import event_sampler, geomean, graph_sampler, interleaved_medians, percentile
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.errors import TiledispatchError
from tiledispatch.core.kernel import build_all
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.conv import ConvProblem, ConvTypes, Direction, check_operands
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.operands import channels_last_empty

SUITE = Path(__file__).parent / "suites" / "conv.json"
L2_BYTES = 60 * 2**20
COPY_BANDWIDTH = 4.25e12  # device-to-device copy on the H200, bytes read + written (ANCHORS.md)
GRAPH_MS = 3.0  # GPU time one graph replay aims at: sets the calls per graph (1..MAX_CALLS)
MAX_CALLS = 25
SLOW_MS = 2.0  # above this a call is timed alone, not in a graph
SAMPLES = 3  # per screened candidate
FINAL_ROUNDS = 7  # cuDNN, the rules' pick, the oracle and the dispatcher's pick, sampled in turns
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3}
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
FIELDS = ["case", "direction", "dtype", "n", "c", "k", "g", "provider", "kernel", "ms", "tflops", "tbps",
          "ratio_vs_vendor", "rel_error"]


def problem_of(case: dict, direction: Direction, dtype: str) -> ConvProblem:
    return ConvProblem(direction, case["N"], case["C"], case["K"], case["G"], tuple(case["input"]),
                       tuple(case["filter"]), case["stride"], tuple(case["pad"]), case["dilation"],
                       ConvTypes.parse(dtype))


def make_sets(p: ConvProblem) -> list[dict]:
    """Checked operands for enough input sets that rotating through them defeats L2."""
    count = max(2, min(8, math.ceil(3 * L2_BYTES / p.bytes())))
    sets = []
    for seed in range(count):
        inputs = make_inputs(p, device="cuda", seed=seed)
        kwargs = inputs.kwargs(p)
        kwargs["out"] = None  # each call allocates, as a caller without `out` does
        sets.append({"inputs": inputs, "ops": check_operands(p.direction, **kwargs)})
    return sets


def copy_fn(moved: int, count: int):
    """A kernel copy of `moved` bytes (half read, half written) over `count` rotating buffer pairs,
    and its sets: the bandwidth limit of a transfer that size, launch and tail included."""
    half = copy_elements(moved, 2)  # bf16 elements read, and as many written
    sets = [{"src": torch.randn(half, device="cuda", dtype=torch.bfloat16),
             "dst": torch.empty(half, device="cuda", dtype=torch.bfloat16)} for _ in range(count)]
    return (lambda s: kernel_copy(s["src"], s["dst"])), sets


def cudnn_fn(p: ConvProblem):
    """The vendor call a PyTorch user makes for this direction."""
    args = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation, "groups": p.groups}
    conv = CONV[p.spatial_dims]
    if p.direction is Direction.FORWARD:
        return lambda s: conv(s["inputs"].x, s["inputs"].w, **args)
    mask = [p.direction is Direction.BWD_DATA, p.direction is Direction.BWD_WEIGHT, False]
    index = 0 if p.direction is Direction.BWD_DATA else 1

    def backward(s):  # the unread operand stands in uninitialised and channels-last, as in autograd (vendor.py)
        i = s["inputs"]
        x = i.x if i.x is not None else channels_last_empty((p.n, p.c, *p.input_size), i.dy.dtype, i.dy.device)
        w = i.w if i.w is not None else channels_last_empty((p.k, p.c_per_group, *p.filter_size), i.dy.dtype,
                                                             i.dy.device)
        return torch.ops.aten.convolution_backward(i.dy, x, w, None, list(p.stride), list(p.padding),
                                                   list(p.dilation), False, [0] * p.spatial_dims, p.groups,
                                                   mask)[index]
    return backward


def reference(p: ConvProblem, s: dict) -> torch.Tensor:
    """fp32 cuDNN without tf32: accurate enough to judge bf16 and fp16 kernels."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        i = s["inputs"]
        def as32(t):
            return None if t is None else t.float()

        fp32 = {"inputs": type(i)(as32(i.x), as32(i.w), as32(i.dy), None, None, i.out)}
        return cudnn_fn(p)(fp32).float()
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def call(dispatcher: Dispatcher, spec):
    return lambda s: dispatcher.run(s["ops"], kernel=spec)


def candidates(dispatcher: Dispatcher, p: ConvProblem, top: int):
    """The Triton candidates to time (best `top` of each family by the rules), and the explanation."""
    explanation = dispatcher.explain(p)
    chosen, per_family = [], {}
    for c in explanation.ranked:
        if c.spec.family == "vendor":
            continue
        per_family[c.spec.family] = per_family.get(c.spec.family, 0) + 1
        if not top or per_family[c.spec.family] <= top or not chosen:  # the first is the rules pick
            chosen.append(c.spec)
    return chosen, explanation


def precompile(dispatcher: Dispatcher, work: list, workers: int) -> None:
    """Compiles every (candidate, specialisation) the run will time, in parallel, before timing."""
    by_specialization: dict = {}
    for entry in work:
        by_specialization.setdefault(entry["problem"].specialization, set()).update(entry["triton"])
    for specialization, specs in by_specialization.items():
        start = time.perf_counter()
        results = build_all(sorted(specs, key=lambda s: s.name), dispatcher.cache, workers,
                            specializations=(specialization,))
        failed = [r for r in results if not r.ok]
        print(f"built {len(results) - len(failed)} kernels for {specialization.tag} in "
              f"{time.perf_counter() - start:.0f} s" + (f"; {len(failed)} failed: {failed[0].error[:300]}"
                                                         if failed else ""), flush=True)


def estimate_ms(fn, s, calls: int = 3) -> float:
    """The GPU time of one call, after the caller's warm-up: the estimate that sizes the repeats.

    The fastest of a few replays of a one-call CUDA graph, so the host's time is not in it. A
    call timed between two events counts the host's time too where it exceeds the GPU's: the
    dispatcher's call (tens of us of Python) then read slower than cuDNN's on 9-34 us convs and
    was given a graph of 12-20 calls where cuDNN's had 25. Its time per call then carried a
    larger share of the replay's own cost, and read 1-8 % slower than the same cuDNN kernel timed
    as cuDNN (H100, results/h100/conv_vendor_against_itself.txt); an estimate past SLOW_MS would
    time single calls, host and all (1.54 ms against 0.078 for cuDNN once, at 18d9611). A call
    that cannot be captured is timed between events instead."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(s)
        run = graph.replay
    except RuntimeError:
        run = lambda: fn(s)
    times = []
    for _ in range(calls):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return min(times)


def sampler(fn, sets: list):
    """A sampler (bench.timing) of `fn`'s time per call, with as many calls as its own speed affords.

    Fast calls: a CUDA graph of up to MAX_CALLS calls over the rotating sets (GRAPH_MS of GPU
    time per replay). Slow calls (> SLOW_MS): single calls, where the host time is noise and a
    graph would cost seconds.
    """
    fn(sets[0])  # warm-up (loads the kernel, picks cuDNN's algorithm)
    torch.cuda.synchronize()
    estimate = estimate_ms(fn, sets[-1])
    if estimate > SLOW_MS:
        turn = itertools.cycle(sets)
        return event_sampler(lambda: fn(next(turn)), 1)
    calls = max(1, min(MAX_CALLS, round(GRAPH_MS / max(estimate, 1e-3))))
    return graph_sampler(fn, sets[:calls], calls)


def median_ms(fn, sets: list) -> float:
    """The screening time of one candidate: the median of SAMPLES samples."""
    return interleaved_medians({"fn": sampler(fn, sets)}, SAMPLES)["fn"]


def run_case(dispatcher, entry, writer_rows) -> dict:
    p, case, dtype = entry["problem"], entry["case"], entry["dtype"]
    sets = make_sets(p)
    ref = reference(p, sets[0])
    flops, moved = p.flops(), p.bytes()

    def record(provider, kernel, ms, err):
        row = {"case": case["name"], "direction": p.direction.value, "dtype": dtype, "n": p.n, "c": p.c, "k": p.k,
               "g": p.groups, "provider": provider, "kernel": kernel, "ms": None if ms is None else round(ms, 5),
               "tflops": None if ms is None else round(flops / ms / 1e9, 3),
               "tbps": None if ms is None else round(moved / ms / 1e9, 4), "ratio_vs_vendor": None,
               "rel_error": None if err is None else f"{err:.2e}"}
        writer_rows.append(row)
        return row

    vendor = cudnn_fn(p)
    vendor_error = rel_error(vendor(sets[0]), ref)
    times = {}
    for spec in entry["triton"]:
        fn = call(dispatcher, spec)
        try:
            err = rel_error(fn(sets[0]), ref)  # the check comes first, and is the warm-up too
        except (TiledispatchError, RuntimeError) as e:  # does not build or launch here: reported, not fatal
            record("triton-failed", spec.name, None, None)
            print(f"FAILED {case['name']} {p.direction.value} {dtype} {spec.name}: {str(e)[:300]}", flush=True)
            continue
        if not err <= TOLERANCE[dtype]:
            record("triton-rejected", spec.name, None, err)
            print(f"WRONG RESULT {case['name']} {p.direction.value} {dtype} {spec.name}: rel error {err:.2e}",
                  flush=True)
            continue
        times[spec.name] = median_ms(fn, sets)
        record("triton-candidate", spec.name, times[spec.name], err)
    explanation = entry["explanation"]
    selected = next((c.spec.name for c in explanation.ranked if c.spec.name in times), None)
    oracle = min(times, key=times.get) if times else None
    # The dispatcher as a user gets it: its own selection (cuDNN a candidate), falling back past a
    # kernel that fails to build.
    call(dispatcher, None)(sets[0])  # the dispatcher's first call: a pick that does not build is passed over
    pick = dispatcher.select(sets[0]["ops"].problem).name
    # The figures that are compared are timed again, in turns, so the GPU's clock drift falls on all alike.
    finalists = {"cudnn": vendor, **{name: call(dispatcher, spec) for name, spec in
                                     ((selected, selected), (oracle, oracle), (pick, None)) if name}}
    samplers = {name: sampler(fn, sets) for name, fn in finalists.items()}
    if p.depthwise:  # the bandwidth target: against a copy of the same bytes too, in the same turns
        copy, copies = copy_fn(moved, len(sets))
        samplers["copy"] = sampler(copy, copies)
    final = interleaved_medians(samplers, FINAL_ROUNDS)
    vendor_ms = final["cudnn"]
    # The fastest Triton finalist of the final rounds: a screening time beside a final-round one
    # would compare two moments of the GPU's clock (see benchmarks/gemm.py).
    oracle = min((name for name in final if name in times), key=final.get, default=None)
    times.update({name: ms for name, ms in final.items() if name in times})  # Triton kernels only
    dispatch_ms = final[pick]
    record("cudnn", "torch " + ("F.conv" if p.direction is Direction.FORWARD else "convolution_backward"),
           vendor_ms, vendor_error)
    result = {"case": case["name"], "direction": p.direction.value, "dtype": dtype, "groups": p.groups,
              "depthwise": p.depthwise, "flops": flops, "bytes": moved, "cudnn_ms": vendor_ms,
              "selected": selected, "selected_ms": times.get(selected), "oracle": oracle,
              "oracle_ms": times.get(oracle), "dispatcher": pick, "dispatcher_ms": dispatch_ms,
              "copy_ms": final.get("copy")}
    if p.depthwise:
        record("copy", "kernel copy of the same bytes (bench/copy.py)", final["copy"], None)
    for provider, name, ms in (("triton-selected", selected, result["selected_ms"]),
                               ("triton-oracle", oracle, result["oracle_ms"]), ("dispatcher", pick, dispatch_ms)):
        record(provider, name, ms, None)
    for row in writer_rows:
        if row["ms"] and row["provider"] != "cudnn":
            row["ratio_vs_vendor"] = round(vendor_ms / row["ms"], 4)

    def tf(ms):
        return flops / ms / 1e9 if ms else float("nan")

    print(f"{case['name']:<26} {p.direction.value:<10} {dtype:<5} cudnn {tf(vendor_ms):7.1f}  selected "
          f"{tf(result['selected_ms']):7.1f}  oracle {tf(result['oracle_ms']):7.1f}  dispatcher "
          f"{tf(dispatch_ms):7.1f} TFLOP/s  ({moved / (dispatch_ms or math.nan) / 1e9:.2f} TB/s)", flush=True)
    del sets, ref
    torch.cuda.empty_cache()
    return result


def summarize(results: list[dict]) -> dict:
    """The issue's keys (dispatcher figures: what a user gets) and the Triton kernels' own figures beside them."""
    def ratio(subset, key):
        return [e["cudnn_ms"] / e[key] for e in subset if e.get(key)]

    grouped = [e for e in results if e["groups"] >= 8]  # the definition: depthwise included
    grouped_only = [e for e in grouped if not e["depthwise"]]  # resnext, regnet, conv1d g16
    dense = [e for e in results if e["groups"] == 1]
    depthwise = [e for e in results if e["depthwise"]]
    efficiency = [e["oracle_ms"] / e["selected_ms"] for e in results if e["selected_ms"]]
    dispatcher_ratio = ratio(results, "dispatcher_ms")

    def fraction(key):
        values = [e["bytes"] / (e[key] * 1e-3) / COPY_BANDWIDTH for e in depthwise if e.get(key)]
        return statistics.mean(values) if values else None

    def of_copy(key):  # a 17-38 MB copy moves 2.9-3.5 TB/s on the H200, not the 4.25 of a large one
        values = [e["copy_ms"] / e[key] for e in depthwise if e.get(key) and e.get("copy_ms")]
        return statistics.mean(values) if values else None

    def by(subset, key):
        return {f"{e['case']} {e['direction']} {e['dtype']}": round(e["cudnn_ms"] / e[key], 3)
                for e in subset if e.get(key)}

    return {
        "geomean_ratio_grouped": geomean(ratio(grouped, "dispatcher_ms")),
        "geomean_ratio_grouped_triton_selected": geomean(ratio(grouped, "selected_ms")),
        "geomean_ratio_grouped_triton_oracle": geomean(ratio(grouped, "oracle_ms")),
        "geomean_ratio_grouped_not_depthwise": geomean(ratio(grouped_only, "dispatcher_ms")),
        "geomean_ratio_grouped_not_depthwise_triton_selected": geomean(ratio(grouped_only, "selected_ms")),
        "geomean_ratio_dense": geomean(ratio(dense, "selected_ms")),  # the Triton kernels alone (the target)
        "geomean_ratio_dense_triton_oracle": geomean(ratio(dense, "oracle_ms")),
        "geomean_ratio_dense_dispatcher": geomean(ratio(dense, "dispatcher_ms")),
        "geomean_ratio_depthwise_dispatcher": geomean(ratio(depthwise, "dispatcher_ms")),
        "geomean_ratio_depthwise_triton_selected": geomean(ratio(depthwise, "selected_ms")),
        "geomean_ratio_dispatcher": geomean(dispatcher_ratio),
        "geomean_ratio_triton_selected": geomean(ratio(results, "selected_ms")),
        "min_ratio_dispatcher": min(dispatcher_ratio) if dispatcher_ratio else None,
        "bandwidth_fraction_depthwise": fraction("dispatcher_ms"),
        "bandwidth_fraction_depthwise_triton_selected": fraction("selected_ms"),
        "bandwidth_fraction_depthwise_triton_oracle": fraction("oracle_ms"),
        "bandwidth_fraction_depthwise_cudnn": fraction("cudnn_ms"),
        "copy_fraction_depthwise": of_copy("dispatcher_ms"),
        "copy_fraction_depthwise_triton_selected": of_copy("selected_ms"),
        "copy_fraction_depthwise_cudnn": of_copy("cudnn_ms"),
        "selection_efficiency_mean": statistics.mean(efficiency) if efficiency else None,
        "selection_efficiency_median": statistics.median(efficiency) if efficiency else None,
        "selection_efficiency_p10": percentile(efficiency, 0.10),
        "selection_efficiency_min": min(efficiency) if efficiency else None,
        "counts": {"all": len(results), "grouped": len(grouped), "grouped_not_depthwise": len(grouped_only),
                   "dense": len(dense), "depthwise": len(depthwise)},
        "per_direction": {d.value: {"geomean_ratio_dispatcher": geomean(ratio(
            [e for e in results if e["direction"] == d.value], "dispatcher_ms")),
            "geomean_ratio_triton_selected": geomean(ratio(
                [e for e in results if e["direction"] == d.value], "selected_ms"))} for d in Direction},
        "ratio_triton_selected_by_case": by(results, "selected_ms"),
        "ratio_dispatcher_by_case": by(results, "dispatcher_ms"),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200"))
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--directions", default="forward,bwd_data,bwd_weight")
    parser.add_argument("--suite", type=Path, default=SUITE, help="a suite file in conv.json's format")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--top", type=int, default=2,
                        help="Triton candidates timed per family, by the rules ranking (0: all)")
    parser.add_argument("--rule-set", default="default")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="stop starting new cases after this many seconds; the summary lists what was left")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    suite = json.loads(args.suite.read_text())
    cases = [c for c in suite["cases"] if not args.cases or c["name"] in args.cases.split(",")]
    directions = [Direction.parse(d) for d in args.directions.split(",")]
    arch = current_arch()
    dispatcher = Dispatcher(Registry.from_rule_set("conv", args.rule_set, arch), arch)

    work = []
    for case in cases:
        for direction in directions:
            for dtype in args.dtypes.split(","):
                p = problem_of(case, direction, dtype)
                # What make_sets' fresh dense channels-last tensors will be specialised on.
                p = replace(p, specialization=p.dense_specialization())
                triton, explanation = candidates(dispatcher, p, args.top)
                work.append({"case": case, "dtype": dtype, "problem": p, "triton": triton,
                             "explanation": explanation})
    torch.cuda.empty_cache()
    precompile(dispatcher, work, args.jobs)

    results, rows, skipped = [], [], []
    csv_path = args.out / "conv.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for entry in work:
            if time.perf_counter() - started > args.budget_s:
                skipped.append(f"{entry['case']['name']} {entry['problem'].direction.value} {entry['dtype']}")
                continue
            case_rows: list[dict] = []
            results.append(run_case(dispatcher, entry, case_rows))
            writer.writerows(case_rows)
            f.flush()
            rows += case_rows

    summary = summarize(results)
    summary.update({
        "cases": len(results),
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "cudnn": torch.backends.cudnn.version(),
        "rule_set": args.rule_set,
        "top_per_family": args.top,
        "skipped_for_time": skipped,
        "seconds": round(time.perf_counter() - started, 1),
    })
    (args.out / "conv_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    record_run(args.out, "conv.csv")  # its rows into the folder's long-format table (results.parquet)
    plot_speed_vs_vendor(results, args.out / "conv.png", vendor="cuDNN", vendor_key="cudnn_ms",
                         label=lambda e: f"{e['case']} {e['direction']}")
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, dict)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
