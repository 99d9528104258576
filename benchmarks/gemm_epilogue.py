"""A fused epilogue (bias + activation) on large rcr GEMMs: ws-persistent, tma-persistent and cuBLAS.

The suite's cases carry no epilogue, so this times the one users of an MLP meet most,
`act(a @ w.T + bias)`, on a few Llama projections: each default ws-persistent and
tma-persistent tile of the signature, the rules' Triton pick, the dispatcher, and cuBLAS
followed by PyTorch's bias and activation (the vendor path's separate steps), all checked
against fp32 and timed as CUDA-graph replays in turns (bench.timing.interleaved_medians).

    python benchmarks/gemm_epilogue.py --out DIR [--cases ...] [--dtypes bf16,fp8e4m3] [--activation gelu]

Writes DIR/gemm_epilogue.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tiledispatch  # noqa: E402,F401  (first: it picks the backend)
from tiledispatch.core.dispatcher import Dispatcher  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.core.runtime import current_arch  # noqa: E402
from tiledispatch.ops.gemm.problem import Activation, Epilogue  # noqa: E402

from gemm import SUITE, make_sets, precompile, problem_of, rel_error  # noqa: E402

CASES = ("square_8192", "llama3_8b_up_T4096", "llama3_8b_qkv_T16384", "llama3_8b_o_T1024")
FAMILIES = ("ws-persistent", "tma-persistent")
ROUNDS = 7


def main() -> int:
    import torch

    from tiledispatch.bench.timing import graph_sampler, interleaved_medians

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("gemm_epilogue_out"))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--dtypes", default="bf16,fp8e4m3")
    parser.add_argument("--activation", default="gelu", choices=("relu", "gelu", "silu"))
    parser.add_argument("--jobs", type=int, default=16)
    args = parser.parse_args()
    act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}[args.activation]
    arch = current_arch()
    default = Registry.from_rule_set("gemm", "default", arch)
    dispatcher = Dispatcher(default, arch)
    triton_only = Dispatcher(default.filter(lambda s: s.family != "vendor"), arch)
    suite = {c["name"]: c for c in json.loads(SUITE.read_text())["cases"]}
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases.split(","):
        for dtype in args.dtypes.split(","):
            case = suite[name]
            sets = make_sets(case, dtype)
            out_dtype = sets[0]["a"].dtype if sets[0]["a"].element_size() == 2 else torch.bfloat16
            for s in sets:
                s["bias"] = torch.randn(case["N"], device="cuda").to(out_dtype)

            def call(kernel=None, using=dispatcher):
                return lambda s: tiledispatch.gemm(s["a"], s["b"], bias=s["bias"], activation=args.activation,
                                                   scale_a=s.get("scale_a"), scale_b=s.get("scale_b"),
                                                   kernel=kernel, dispatcher=using)

            def vendor(s):
                if "scale_a" in s:
                    y = torch._scaled_mm(s["a"], s["b"], scale_a=s["scale_a"], scale_b=s["scale_b"],
                                         out_dtype=torch.bfloat16)
                else:
                    y = s["a"] @ s["b"]
                return act(y + s["bias"])

            a, b = sets[0]["a"].float(), sets[0]["b"].float()
            ref = a @ b
            if "scale_a" in sets[0]:
                ref = ref * sets[0]["scale_a"] * sets[0]["scale_b"]
            ref = act(ref + sets[0]["bias"].float())
            problem = replace(problem_of(case, dtype), epilogue=Epilogue(True, Activation(args.activation)))
            specs = [s for s in default if s.family in FAMILIES and s.definition.supports(s.config, problem) is None
                     and s.config.split_k == 1 and s.config.block_m >= 128]
            precompile(dispatcher, [(problem, specs)], args.jobs)
            providers = {"cublas+steps": vendor, "dispatcher": call(), "triton-selected": call(using=triton_only)}
            providers.update({spec.name: call(spec.name) for spec in specs})
            samplers, errors = {}, {}
            for key, fn in providers.items():
                errors[key] = rel_error(fn(sets[0]), ref)
                if not errors[key] <= 2e-2:
                    print(f"WRONG RESULT {name} {dtype} {key}: {errors[key]:.2e}", flush=True)
                    continue
                samplers[key] = graph_sampler(fn, sets, 10)
            medians = interleaved_medians(samplers, ROUNDS)
            base = medians["cublas+steps"]
            picks = {"dispatcher": dispatcher.select(problem).name, "triton-selected": triton_only.select(problem).name}
            print(f"\n{name} {dtype} bias+{args.activation}: cuBLAS + steps {base * 1e3:.1f} us", flush=True)
            for key, ms in sorted(medians.items(), key=lambda kv: kv[1]):
                kernel = picks.get(key, key)
                rows.append({"case": name, "dtype": dtype, "epilogue": f"bias-{args.activation}", "provider": key,
                             "kernel": kernel, "ms": round(ms, 5), "tflops": round(problem.flops() / ms / 1e9, 1),
                             "ratio_vs_vendor": round(base / ms, 4), "rel_error": f"{errors[key]:.2e}"})
                print(f"   {ms * 1e3:8.1f} us x{base / ms:.3f}  {key}" + (f" ({kernel})" if key in picks else ""),
                      flush=True)
            del sets
            torch.cuda.empty_cache()
    with (args.out / "gemm_epilogue.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
