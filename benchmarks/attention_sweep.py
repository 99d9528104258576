"""Every Triton attention tile of the default rule set on a few suite cases, beside SDPA cuDNN.

For each case (default: mha_S4096_D128, mha_S4096_D128_causal, mha_S2048_D64,
gqa_S8192_D128_causal of benchmarks/suites/attention.json) and bf16:
  - the forward: every Triton forward config of the default rule set for the case's head
    dims that takes the problem (fwd, fwd-tma), the rules' pick marked;
  - the backward alone (the plan: preprocess, dK/dV, dQ or its conversion) of every
    backward config (bwd, bwd-atomic), fed by the forward's O and LSE;
  - SDPA's cuDNN backend, forward and backward alone (autograd with retain_graph).
Every kernel is compiled first, in parallel (tiledispatch.core.kernel.build_all), then each
one is checked against cuDNN's output (relative error) and timed: CUDA-event medians of
back-to-back executions of one prepared plan, so the time is the kernels' alone. The kernels
of a case and direction, cuDNN among them, are sampled in turns: the H200's clock drifts by
more than the differences between tiles.

    python benchmarks/attention_sweep.py --out /tmp/sweep [--cases NAME,...] [--jobs 16] [--all-tiles]
        [--rule-set full --families fwd-tma --match '_(64|128)x(64|128)_' --forward-only]

Prints a table per case and direction sorted by TFLOP/s with the ratio to cuDNN, and writes
attention_sweep.csv under --out. Budgeted to about 400 s on one H200 (16 compile workers).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tiledispatch.bench.timing import event_sampler, interleaved_medians
from tiledispatch.core.cache import KernelCache
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.kernel import build_all
from tiledispatch.core.launch import execute
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.attention import AttentionConfig, AttentionOptions, Direction, check_operands, parse_causal
from tiledispatch.ops.attention.rules import supports

import triton  # noqa: E402  (after tiledispatch, which picks Triton's backend)

SUITE = Path(__file__).parent / "suites" / "attention.json"
CASES = ("mha_S4096_D128", "mha_S4096_D128_causal", "mha_S2048_D64", "gqa_S8192_D128_causal")
CALLS_PER_SAMPLE = 3
TOLERANCE = 2e-2  # relative error against cuDNN above which a time is not reported


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


class Case:
    """One suite case in bf16: inputs, its forward and backward problems, cuDNN's results."""

    def __init__(self, spec: dict):
        self.name = spec["name"]
        self.causal = bool(spec.get("causal", False))
        b, hq, hkv, sq, skv, d = (spec[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D"))
        torch.manual_seed(0)
        self.q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
        self.k = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
        self.v = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
        self.grad = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
        self.options = AttentionOptions(causal=parse_causal(self.causal), needs_lse=True)
        self.forward = check_operands(self.q, self.k, self.v, options=self.options)
        self.flops = self.forward.problem.forward_flops()

    def backward_operands(self, out: torch.Tensor, lse: torch.Tensor):
        return check_operands(self.q, self.k, self.v, options=self.options, direction=Direction.BACKWARD,
                              out=out, lse=lse, grad_out=self.grad)


def cudnn(case: Case) -> dict:
    """SDPA cuDNN: its output and gradients (the reference), and samplers of its forward and of its backward alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = case.q.shape[1] // case.k.shape[1]
    q, k, v = (t.detach().clone().requires_grad_() for t in (case.q, case.k, case.v))

    def run(k, v, gqa):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    try:
        out = run(k, v, group > 1)
        forward = lambda: run(k, v, group > 1)  # noqa: E731
    except RuntimeError:  # no native GQA in this cuDNN: K/V expanded, inside the autograd graph
        forward = lambda: run(k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), False)  # noqa: E731
        out = forward()
    grads = torch.autograd.grad(out, (q, k, v), case.grad, retain_graph=True)

    def forward_no_grad():
        with torch.no_grad():
            return forward()

    return {"out": out.detach(), "grads": [g.detach() for g in grads],
            "fwd": event_sampler(forward_no_grad, CALLS_PER_SAMPLE),
            "bwd": event_sampler(lambda: torch.autograd.grad(out, (q, k, v), case.grad, retain_graph=True),
                                 CALLS_PER_SAMPLE)}


def triton_specs(registry: Registry, problem, all_tiles: bool) -> list:
    """The registry's Triton configs that take `problem`; the tiny test tiles left out unless asked."""
    out = []
    for spec in registry:
        config = spec.config
        if not isinstance(config, AttentionConfig) or supports(config, problem) is not None:
            continue
        own = config.block_m if config.direction is Direction.FORWARD else config.block_n
        if all_tiles or own >= 64:
            out.append(spec)
    return out


def compile_everything(jobs: list[tuple], workers: int) -> None:
    """(spec, variant) pairs, compiled in parallel per variant before any timing."""
    by_variant: dict = {}
    for spec, variant in jobs:
        by_variant.setdefault(variant, {})[spec.name] = spec
    start = time.perf_counter()
    for variant, specs in by_variant.items():
        for result in build_all(list(specs.values()), KernelCache(), workers, specializations=(variant,)):
            if not result.ok:
                print(f"build failed: {result.name}: {result.error}", file=sys.stderr)
    count = sum(len(s) for s in by_variant.values())
    print(f"compiled {count} kernels in {time.perf_counter() - start:.0f} s", file=sys.stderr)


def prepare_plan(dispatcher: Dispatcher, operands, spec, error_of):
    """(sampler or None, relative error, first result) of one spec: each call makes its plan
    (outputs, the zeroed dQ workspace of bwd-atomic) and executes it, as a caller's call does;
    the error is taken on the first call's result, before any other call writes into its buffers."""
    print(f"  running {spec.name}", flush=True)  # a kernel that hangs is named by the last line
    spec, launchers = dispatcher.prepare(operands, kernel=spec)
    stream = torch.cuda.current_stream().cuda_stream

    def call():
        return execute(spec.definition.plan(spec.config, operands), launchers, stream)

    result = call()
    torch.cuda.synchronize()
    error = error_of(result)
    if error > TOLERANCE:
        print(f"{spec.name}: relative error {error:.3g} against cuDNN; not timed", file=sys.stderr)
        return None, error, result
    return event_sampler(call, CALLS_PER_SAMPLE), error, result


def time_all(dispatcher: Dispatcher, operands, specs: list, vendor, repeats: int, error_of) -> tuple[dict, dict, dict]:
    """Times and errors of every spec and of cuDNN (`vendor`), sampled in turns so that they
    share the GPU's clock (bench.timing.interleaved_medians); and each spec's first result."""
    samplers, errors, results = {"sdpa-cudnn": vendor}, {"sdpa-cudnn": 0.0}, {}
    for spec in specs:
        try:
            sampler, errors[spec.name], results[spec.name] = prepare_plan(dispatcher, operands, spec, error_of)
            if sampler is not None:
                samplers[spec.name] = sampler
        except Exception as e:  # one failing kernel must not end the sweep
            print(f"{spec.name}: {type(e).__name__}: {e}", file=sys.stderr)
            errors[spec.name] = math.nan
    times = {name: math.nan for name in errors}
    times.update(interleaved_medians(samplers, repeats))
    return times, errors, results


def row(case: Case, direction: str, provider: str, ms: float, flops: float, error: float, cudnn_ms: float,
        picked: bool = False) -> dict:
    tflops = flops / ms / 1e9 if ms and math.isfinite(ms) else math.nan
    print(f"{case.name} {direction} {provider}: {tflops:.1f} TFLOP/s, error {error:.2g}", flush=True)
    return {"case": case.name, "direction": direction, "provider": provider, "time_ms": ms, "tflops": tflops,
            "ratio_vs_cudnn": cudnn_ms / ms if ms and math.isfinite(ms) else math.nan, "rel_error": error,
            "rules_pick": picked}


def sweep_case(case: Case, registry: Registry, dispatcher: Dispatcher, repeats: int, all_tiles: bool,
               forward_only: bool) -> list[dict]:
    ref = cudnn(case)
    problem = case.forward.problem
    pick = dispatcher.select(problem).name
    specs = triton_specs(registry, problem, all_tiles)
    times, errors, results = time_all(dispatcher, case.forward, specs, ref["fwd"], repeats,
                                      lambda result: rel_error(result.out, ref["out"]))
    rows = [row(case, "fwd", name, ms, case.flops, errors[name], times["sdpa-cudnn"], name == pick)
            for name, ms in times.items()]
    timed = [name for name in results if math.isfinite(times[name])]
    if not timed or forward_only:
        return rows
    best = results[min(timed, key=times.get)]
    backward = case.backward_operands(best.out, best.lse)
    del results
    bwd_pick = dispatcher.select(backward.problem).name
    times, errors, _ = time_all(dispatcher, backward, triton_specs(registry, backward.problem, all_tiles), ref["bwd"],
                                repeats, lambda grads: max(rel_error(g, r) for g, r in
                                                           zip((grads.dq, grads.dk, grads.dv), ref["grads"])))
    rows += [row(case, "bwd", name, ms, 2.5 * case.flops, errors[name], times["sdpa-cudnn"], name == bwd_pick)
             for name, ms in times.items()]
    return rows


def print_table(rows: list[dict]) -> None:
    for key in dict.fromkeys((r["case"], r["direction"]) for r in rows):
        subset = sorted((r for r in rows if (r["case"], r["direction"]) == key),
                        key=lambda r: -r["tflops"] if math.isfinite(r["tflops"]) else math.inf)
        print(f"\n{key[0]} {key[1]}")
        for r in subset:
            mark = "  <- rules" if r["rules_pick"] else ""
            print(f"  {r['tflops']:7.1f} TFLOP/s  {r['ratio_vs_cudnn']:5.2f}x cuDNN  {r['time_ms']:8.3f} ms  "
                  f"err {r['rel_error']:.1e}  {r['provider']}{mark}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200"))
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--jobs", type=int, default=16, help="compile workers")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--all-tiles", action="store_true", help="also the small test tiles (own block < 64)")
    parser.add_argument("--budget-s", type=float, default=380.0, help="stop starting new cases after this long")
    parser.add_argument("--rule-set", default="default", choices=("tests", "default", "full"))
    parser.add_argument("--families", default="", help="comma-separated Triton families to keep (default: all)")
    parser.add_argument("--match", default="", help="a regular expression the kernel names must contain")
    parser.add_argument("--forward-only", action="store_true")
    args = parser.parse_args()
    begin = time.perf_counter()
    wanted = args.cases.split(",")
    suite = {c["name"]: c for c in json.loads(args.suite.read_text())["cases"]}
    missing = [name for name in wanted if name not in suite]
    if missing:
        parser.error(f"cases {missing} are not in {args.suite}; it has {sorted(suite)}")
    arch = current_arch()
    families = set(filter(None, args.families.split(",")))
    pattern = re.compile(args.match)
    registry = Registry.from_rule_set("attention", args.rule_set, arch).filter(
        lambda s: s.dtype == "bf16" and not s.family.startswith("sdpa") and (not families or s.family in families)
        and pattern.search(s.name) is not None)
    dispatcher = Dispatcher(registry, arch)
    cases = [Case(suite[name]) for name in wanted]
    jobs = []
    for case in cases:
        backward = case.backward_operands(case.q, case.q).problem  # its problem only: no kernel runs
        for problem in (case.forward.problem,) if args.forward_only else (case.forward.problem, backward):
            jobs += [(spec, problem.variant) for spec in triton_specs(registry, problem, args.all_tiles)]
    compile_everything(jobs, args.jobs)
    rows = []
    for case in cases:
        if time.perf_counter() - begin > args.budget_s:
            print(f"budget reached: {case.name} and later cases left out", file=sys.stderr)
            break
        rows += sweep_case(case, registry, dispatcher, args.repeats, args.all_tiles, args.forward_only)
        torch.cuda.empty_cache()
    print_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open(args.out / "attention_sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*rows[0], *stamp])
        writer.writeheader()
        writer.writerows({**r, **stamp} for r in rows)
    print(f"\n{len(rows)} rows in {time.perf_counter() - begin:.0f} s -> {args.out / 'attention_sweep.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
