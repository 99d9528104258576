"""The prefill cases of the attention suite on the GPU, side by side with SDPA's cuDNN and flash backends.

For every `prefill` case of benchmarks/suites/attention.json (a copy of ../shared/suites/attention.json)
and every dtype asked for, forward and forward+backward:
  - tiledispatch.attention through the default dispatcher (Triton families plus the SDPA
    candidates; forward+backward: its pick for the forward that keeps the LSE and its pick
    for the backward, e.g. cuDNN's forward then cuDNN's backward), and the `rules` pick
    among the Triton kernels alone (`fwd_tflops_d128_noncausal_S4096_triton` in the summary);
  - the Triton candidates ranked highest by the rules (`--top`), each timed: the oracle;
  - SDPA's cuDNN and flash backends (GQA through enable_gqa, else K/V expanded before timing;
    no window or soft-cap there: those rows are left out).
Every provider's output (and gradients) is checked before it is timed: against SDPA's math
where SDPA takes the case, else against a float32 reference on one batch and head group.
Times are CUDA-event medians of back-to-back calls after warm-up (tiledispatch.bench.timing),
so host work overlaps the previous call as it does in a training loop; the providers of a
case are sampled in turns (`interleaved_medians`), so the GPU's clock drift falls on all alike.

    python benchmarks/attention.py --out benchmarks/results/h200 [--dtypes bf16] [--cases NAME,...] [--top 3]

Writes attention.csv (one row per case, dtype, direction and provider), attention_summary.json
and attention.png. Budgeted to finish in under 8 minutes on one H200 (`--budget-s`).
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
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import tiledispatch
from tiledispatch.bench.results import record_run
from tiledispatch.bench.timing import event_sampler, interleaved_medians
from tiledispatch.core.cache import KernelCache
from tiledispatch.core.dispatcher import Dispatcher, default_dispatcher
from tiledispatch.core.kernel import build_all
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.ops.attention import (
    AttentionOptions,
    Direction,
    Window,
    check_operands,
    parse_causal,
)

SUITE = Path(__file__).parent / "suites" / "attention.json"
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
CALLS_PER_SAMPLE = 4  # back-to-back calls per CUDA-event sample


def rel_error(got, ref) -> float:
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


class Case:
    def __init__(self, spec: dict, dtype: str):
        self.spec, self.dtype = spec, dtype
        self.name = spec["name"]
        self.causal = spec.get("causal", False)
        self.window = tuple(spec["window"]) if "window" in spec else None
        self.softcap = spec.get("softcap")
        torch.manual_seed(0)
        t = TORCH_DTYPES[dtype]
        b, hq, hkv, sq, skv, d = (spec[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D"))
        self.q = torch.randn(b, hq, sq, d, device="cuda", dtype=t)
        self.k = torch.randn(b, hkv, skv, d, device="cuda", dtype=t)
        self.v = torch.randn(b, hkv, skv, d, device="cuda", dtype=t)
        self.grad = torch.randn(b, hq, sq, d, device="cuda", dtype=t)
        self.kwargs = {"causal": self.causal, "window": self.window, "softcap": self.softcap}
        self.options = AttentionOptions(causal=parse_causal(self.causal), softcap=self.softcap,
                                        window=None if self.window is None else Window(*self.window))
        self.problem = check_operands(self.q, self.k, self.v, options=self.options).problem
        self.vendor_ok = self.window is None and self.softcap is None

    def leaves(self):
        return [t.detach().requires_grad_() for t in (self.q, self.k, self.v)]


def sdpa(backend, case: Case):
    """SDPA with one backend; GQA by enable_gqa, or K/V expanded once (outside the timing) if refused."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}[backend]
    group = case.q.shape[1] // case.k.shape[1]

    def run(q, k, v, gqa):
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(case.causal), enable_gqa=gqa)

    try:
        run(case.q[:1, :, :64], case.k[:1, :, :64], case.v[:1, :, :64], group > 1)
        return lambda q, k, v: run(q, k, v, group > 1), None
    except RuntimeError:
        expand = (lambda t: t.repeat_interleave(group, 1)) if group > 1 else (lambda t: t)
        return lambda q, k, v: run(q, expand(k), expand(v), False), "expanded K/V"


def triton_dispatcher(arch) -> Dispatcher:
    """The default rule set's Triton families alone: what "Triton alone" means in the summary."""
    return Dispatcher(Registry.from_rule_set("attention", "default", arch).filter(
        lambda s: not s.family.startswith("sdpa")), arch)


def ours(dispatcher: Dispatcher | None, case: Case, kernel=None, backward_kernel=None):
    return lambda q, k, v: tiledispatch.attention(q, k, v, dispatcher=dispatcher, kernel=kernel,
                                                  backward_kernel=backward_kernel, **case.kwargs)


def reference(case: Case):
    """float32 on one batch and one K/V head's query group: (slices, out, grads)."""
    group = case.q.shape[1] // case.k.shape[1]
    q, k, v = (t[:1, :group].float() if i == 0 else t[:1, :1].float() for i, t in enumerate((case.q, case.k, case.v)))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    k_e, v_e = k.expand(1, group, *k.shape[2:]), v.expand(1, group, *v.shape[2:])
    s = torch.matmul(q, k_e.transpose(-1, -2)) * case.problem.head_dim_qk ** -0.5
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    offset, left, right = case.problem.band(case.problem.seqlen_q, case.problem.seqlen_kv)
    i = torch.arange(s.shape[-2], device="cuda")[:, None]
    j = torch.arange(s.shape[-1], device="cuda")[None, :]
    keep = torch.ones_like(s, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + offset - left
    if right >= 0:
        keep &= j <= i + offset + right
    out = torch.matmul(torch.softmax(s.masked_fill(~keep, -math.inf), -1), v_e)
    grads = torch.autograd.grad(out, (q, k, v), case.grad[:1, :group].float())
    return out, grads


def check(fn, case: Case, backward: bool, ref) -> float:
    """The largest relative error of fn's output (and gradients) on the reference's slice."""
    group = case.q.shape[1] // case.k.shape[1]
    q, k, v = (t[:1, :group] if i == 0 else t[:1, :1] for i, t in enumerate((case.q, case.k, case.v)))
    q, k, v = (t.detach().contiguous().requires_grad_(backward) for t in (q, k, v))
    out = fn(q, k, v)
    errors = [rel_error(out, ref[0])]
    if backward:
        grads = torch.autograd.grad(out, (q, k, v), case.grad[:1, :group])
        errors += [rel_error(g, r) for g, r in zip(grads, ref[1])]
    return max(errors)


def sampler(fn, case: Case, backward: bool):
    """A sampler (bench.timing) of one call: the forward, or the forward and its gradients."""
    if not backward:
        return event_sampler(lambda: fn(case.q, case.k, case.v), CALLS_PER_SAMPLE)
    q, k, v = case.leaves()
    return event_sampler(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), case.grad), CALLS_PER_SAMPLE)


def problems(case: Case) -> dict:
    """The three problems a case poses: the forward alone, the forward that keeps the LSE, the backward."""
    backward = check_operands(case.q, case.k, case.v, options=case.options, direction=Direction.BACKWARD,
                              out=case.q, lse=case.q, grad_out=case.grad).problem
    return {"fwd": case.problem, "fwd-lse": replace(case.problem, needs_lse=True), "bwd": backward}


def precompile(cases: list[Case], dispatchers: dict, top: int, jobs: int) -> tuple[dict, dict]:
    """Selects every kernel the run will time, and compiles them all in parallel before any timing.

    Returns the Triton candidates to time per (case, dtype, problem) and each dispatcher's pick.
    """
    candidates, picks, specs = {}, {}, {}
    for case in cases:
        for kind, problem in problems(case).items():
            key = (case.name, case.dtype, kind)
            ranked = [c.spec for c in dispatchers["triton"].explain(problem).ranked[:top]]
            candidates[key] = ranked
            for label, dispatcher in dispatchers.items():
                picks[(label, *key)] = dispatcher.select(problem)
            for spec in [*ranked, *(picks[(label, *key)] for label in dispatchers)]:
                if not spec.family.startswith("sdpa"):
                    specs[(spec.name, problem.variant)] = spec
    by_variant: dict = {}
    for (name, variant), spec in specs.items():
        by_variant.setdefault(variant, {})[name] = spec
    start = time.perf_counter()
    for variant, group in by_variant.items():
        for r in build_all(list(group.values()), KernelCache(), jobs, specializations=(variant,)):
            if not r.ok:
                print(f"build failed: {r.name}: {r.error}", file=sys.stderr)
    print(f"compiled {len(specs)} kernel variants in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return candidates, picks


def geomean(values):
    values = [v for v in values if v and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200"))
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: every prefill case)")
    parser.add_argument("--top", type=int, default=2, help="Triton candidates timed per case and direction")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=16, help="compile workers")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this long")
    parser.add_argument("--tolerance", type=float, default=3e-2, help="largest relative error accepted before timing")
    args = parser.parse_args()
    begin = time.perf_counter()
    suite = json.loads(SUITE.read_text())
    wanted = set(args.cases.split(",")) if args.cases else None
    specs = [c for c in suite["cases"] if c["mode"] == "prefill" and (wanted is None or c["name"] in wanted)]
    cases = [Case(c, d) for d in args.dtypes.split(",") for c in specs]
    arch = current_arch()
    dispatchers = {"default": default_dispatcher(), "triton": triton_dispatcher(arch)}
    candidates, picks = precompile(cases, dispatchers, args.top, args.jobs)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    gpu = torch.cuda.get_device_name()
    rows, entries = [], []
    for case in cases:
        if time.perf_counter() - begin > args.budget_s:
            print(f"budget reached: {case.name} and later cases left out", file=sys.stderr)
            break
        ref = {direction: reference(case) for direction in (False, True)}
        for backward in (False, True):
            direction = "fwd+bwd" if backward else "fwd"
            flops = case.problem.training_flops() if backward else case.problem.forward_flops()
            fwd_kind = "fwd-lse" if backward else "fwd"
            providers = {}  # name -> (timed callable, the same kernels forced for the check, note)
            for label, provider in (("default", "tiledispatch"), ("triton", "triton-rules")):
                d = None if label == "default" else dispatchers[label]
                fwd_pick = picks[(label, case.name, case.dtype, fwd_kind)].name
                bwd_pick = picks[(label, case.name, case.dtype, "bwd")].name if backward else None
                providers[provider] = (ours(d, case), ours(dispatchers[label], case, fwd_pick, bwd_pick), None)
            for spec in candidates[(case.name, case.dtype, "bwd" if backward else "fwd")]:
                fwd_name = None if backward else spec.name
                fn = ours(dispatchers["triton"], case, kernel=fwd_name, backward_kernel=spec.name if backward else None)
                providers[f"triton:{spec.name}"] = (fn, fn, None)
            if case.vendor_ok:
                for backend in ("sdpa-cudnn", "sdpa-flash"):
                    try:
                        fn, note = sdpa(backend, case)
                        providers[backend] = (fn, fn, note)
                    except Exception as e:
                        print(f"{case.name}: {backend} unavailable: {e}", file=sys.stderr)
            times, errors, samplers = {}, {}, {}
            for provider, (fn, checked_fn, note) in providers.items():
                try:
                    errors[provider] = check(checked_fn, case, backward, ref[backward])
                    if errors[provider] <= args.tolerance:
                        samplers[provider] = sampler(fn, case, backward)
                except Exception as e:
                    print(f"{case.name} {direction} {provider}: failed: {type(e).__name__}: {e}", file=sys.stderr)
                    errors[provider] = math.nan
            # Every provider of the case is sampled in turns, so their medians share the GPU's clock.
            times = {provider: math.nan for provider in providers}
            times.update(interleaved_medians(samplers, args.repeats))
            for provider, (_, _, note) in providers.items():
                ms = times[provider]
                rows.append({"op": "attention", "case": case.name, "dtype": case.dtype, "direction": direction,
                             "provider": provider, "time_ms": ms, "tflops": flops / ms / 1e9 if not math.isnan(ms) else math.nan,
                             "rel_error": errors[provider], "note": note or "", "gpu": gpu, "torch": torch.__version__,
                             "triton": triton.__version__, "date": date})
            del samplers
            vendors = [times.get(b, math.nan) for b in ("sdpa-cudnn", "sdpa-flash")]
            best_vendor = min((t for t in vendors if not math.isnan(t)), default=math.nan)
            timed_all = [t for t in times.values() if not math.isnan(t)]
            mine = times["tiledispatch"]
            # What the default dispatcher ran, per direction (its timed calls select the same: the
            # problems are the same keys).
            kernels = {kind: picks[("default", case.name, case.dtype, kind)].name
                       for kind in ((fwd_kind, "bwd") if backward else (fwd_kind,))}
            entry = {"case": case.name, "dtype": case.dtype, "direction": direction, "flops": flops,
                     "tiledispatch_ms": mine, "tiledispatch_kernels": kernels, "triton_rules_ms": times["triton-rules"],
                     "cudnn_ms": vendors[0], "flash_ms": vendors[1],
                     "ratio_vs_cudnn": vendors[0] / mine if not math.isnan(vendors[0]) else None,
                     "triton_ratio_vs_cudnn": vendors[0] / times["triton-rules"] if not math.isnan(vendors[0]) else None,
                     "ratio_vs_best_vendor": best_vendor / mine if not math.isnan(best_vendor) else None,
                     "selection_efficiency": min(timed_all) / mine if timed_all and not math.isnan(mine) else None}
            entries.append(entry)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in entry.items()}),
                  file=sys.stderr)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "attention.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    fwd = [e for e in entries if e["direction"] == "fwd"]
    both = [e for e in entries if e["direction"] == "fwd+bwd"]
    s4096 = next((e for e in fwd if e["case"] == "mha_S4096_D128"), None)
    efficiencies = [e["selection_efficiency"] for e in entries if e["selection_efficiency"]]
    summary = {
        "fwd_tflops_d128_noncausal_S4096": s4096["flops"] / s4096["tiledispatch_ms"] / 1e9 if s4096 else None,
        # the same case by the Triton kernel the rules pick among the Triton families alone
        "fwd_tflops_d128_noncausal_S4096_triton": (s4096["flops"] / s4096["triton_rules_ms"] / 1e9
                                                   if s4096 and not math.isnan(s4096["triton_rules_ms"]) else None),
        "geomean_ratio_fwd_vs_cudnn": geomean([e["ratio_vs_cudnn"] for e in fwd]),
        "geomean_ratio_fwdbwd_vs_cudnn": geomean([e["ratio_vs_cudnn"] for e in both]),
        "geomean_ratio_fwd_triton_vs_cudnn": geomean([e["triton_ratio_vs_cudnn"] for e in fwd]),
        "geomean_ratio_fwdbwd_triton_vs_cudnn": geomean([e["triton_ratio_vs_cudnn"] for e in both]),
        "min_ratio_dispatcher": min((e["ratio_vs_best_vendor"] for e in entries if e["ratio_vs_best_vendor"]),
                                    default=None),
        "selection_efficiency_mean": statistics.mean(efficiencies) if efficiencies else None,
        "cases": entries,
        "command": "python " + " ".join(sys.argv),
        "date": date, "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
        "seconds": round(time.perf_counter() - begin, 1),
        "flops_convention": "forward: 4 * d * visible (query, key) pairs per head; fwd+bwd: 3.5x forward",
    }
    (args.out / "attention_summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    record_run(args.out, "attention.csv")  # its rows into the folder's long-format table (results.parquet)
    try:
        plot(entries, args.out / "attention.png")
    except ImportError:
        print("matplotlib is missing (pip install .[bench]): no plot", file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if k != "cases"}, indent=1, default=str))
    return 0


def plot(entries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, direction in zip(axes, ("fwd", "fwd+bwd")):
        subset = [e for e in entries if e["direction"] == direction]
        labels = [f"{e['case']}\n{e['dtype']}" for e in subset]
        x = range(len(subset))
        for i, (key, label) in enumerate((("tiledispatch_ms", "tiledispatch"), ("triton_rules_ms", "Triton (rules)"),
                                          ("cudnn_ms", "SDPA cuDNN"), ("flash_ms", "SDPA flash"))):
            values = [e["flops"] / e[key] / 1e9 if e[key] and not math.isnan(e[key]) else 0 for e in subset]
            ax.bar([j + 0.2 * i - 0.3 for j in x], values, width=0.2, label=label)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"attention {direction}, H200")
        ax.set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
