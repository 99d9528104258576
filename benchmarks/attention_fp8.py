"""fp8 (e4m3) attention forward against bf16, on the prefill cases of the suite that fp8 takes.

For each case (default: the non-varlen prefill cases with power-of-two head dims) the inputs
are drawn in bf16 and quantized per tensor (scale = amax / 448). Timed in turns
(bench.timing.interleaved_medians), forward only:
  - tiledispatch.attention on the fp8 tensors and their scales (the fwd-tma kernel, bf16 out);
  - tiledispatch.attention on the bf16 tensors (the default dispatcher: Triton or SDPA cuDNN), and
    with the Triton kernels alone (`triton_bf16`: the same kernel family, in bf16);
  - SDPA's cuDNN backend on the bf16 tensors, where it takes the case (no window, no soft-cap).
The fp8 output is checked first against the bf16 dispatcher's output on the dequantized inputs
(the same values): `rel_error_vs_dequantized`; against the bf16 inputs' own output it also
carries the quantization error: `rel_error_vs_bf16`.

    python benchmarks/attention_fp8.py --out DIR [--cases NAME,...]

Writes attention_fp8.csv and attention_fp8_summary.json.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import sys
from pathlib import Path

import tiledispatch  # noqa: F401  (first: it picks the backend)
import torch
import torch.nn.functional as F

from tiledispatch.bench.timing import event_sampler, geomean, interleaved_medians
from tiledispatch.ops.attention import AttentionOptions, check_operands, parse_causal, parse_window

SUITE = Path(__file__).parent / "suites" / "attention.json"


def _triton_only():
    from tiledispatch.core.dispatcher import Dispatcher
    from tiledispatch.core.registry import Registry
    from tiledispatch.core.runtime import current_arch

    arch = current_arch()
    registry = Registry.from_rule_set("attention", "default", arch).filter(lambda s: not s.family.startswith("sdpa"))
    return Dispatcher(registry, arch)


TRITON_ONLY = _triton_only()
FP8 = torch.float8_e4m3fn
CALLS, ROUNDS = 4, 9


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (x.abs().amax().float() / 448).reshape(1)
    return (x.float() / scale).to(FP8), scale


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def run_case(case: dict) -> dict:
    b, hq, hkv, sq, skv, d = (case[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D"))
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for h, s in ((hq, sq), (hkv, skv), (hkv, skv)))
    (q8, sq8), (k8, sk8), (v8, sv8) = quantize(q), quantize(k), quantize(v)
    features = {"causal": case.get("causal", False)}
    if "window" in case:
        features["window"] = tuple(case["window"])
    if "softcap" in case:
        features["softcap"] = case["softcap"]
    fp8 = lambda: tiledispatch.attention(q8, k8, v8, scale_q=sq8, scale_k=sk8, scale_v=sv8, **features)  # noqa: E731
    bf16 = lambda: tiledispatch.attention(q, k, v, **features)  # noqa: E731
    triton_bf16 = lambda: tiledispatch.attention(q, k, v, dispatcher=TRITON_ONLY, **features)  # noqa: E731
    deq = [(t.float() * s).to(torch.bfloat16) for t, s in ((q8, sq8), (k8, sk8), (v8, sv8))]
    with torch.no_grad():
        out8 = fp8()
        err_deq = rel_error(out8, tiledispatch.attention(*deq, **features))
        err_bf16 = rel_error(out8, bf16())
    samplers = {"fp8": event_sampler(fp8, CALLS), "bf16": event_sampler(bf16, CALLS),
                "triton_bf16": event_sampler(triton_bf16, CALLS)}
    if "window" not in case and "softcap" not in case:
        kx, vx = (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v))

        def cudnn():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, kx, vx, is_causal=bool(case.get("causal")))

        samplers["cudnn"] = event_sampler(cudnn, CALLS)
    ms = interleaved_medians(samplers, ROUNDS)
    options = AttentionOptions(causal=parse_causal(features["causal"]), window=parse_window(features.get("window")),
                               softcap=features.get("softcap"))
    flops = check_operands(q, k, v, options=options).problem.forward_flops()
    row = {"case": case["name"], "fp8_ms": ms["fp8"], "bf16_ms": ms["bf16"], "triton_bf16_ms": ms["triton_bf16"],
           "cudnn_bf16_ms": ms.get("cudnn"), "fp8_tflops": flops / ms["fp8"] / 1e9,
           "bf16_tflops": flops / ms["bf16"] / 1e9, "triton_bf16_tflops": flops / ms["triton_bf16"] / 1e9,
           "speedup_fp8_vs_bf16": ms["bf16"] / ms["fp8"],
           "speedup_fp8_vs_triton_bf16": ms["triton_bf16"] / ms["fp8"],
           "ratio_fp8_vs_cudnn_bf16": ms["cudnn"] / ms["fp8"] if "cudnn" in ms else None,
           "rel_error_vs_dequantized": err_deq, "rel_error_vs_bf16": err_bf16}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default="")
    args = parser.parse_args()
    wanted = set(filter(None, args.cases.split(",")))
    cases = [c for c in json.loads(SUITE.read_text())["cases"] if c["mode"] == "prefill"
             and c["D"] & (c["D"] - 1) == 0 and (not wanted or c["name"] in wanted)]
    rows = [run_case(c) for c in cases]
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "attention_fp8.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {
        "geomean_speedup_fp8_vs_bf16": geomean([r["speedup_fp8_vs_bf16"] for r in rows]),
        "geomean_speedup_fp8_vs_triton_bf16": geomean([r["speedup_fp8_vs_triton_bf16"] for r in rows]),
        "geomean_ratio_fp8_vs_cudnn_bf16": geomean([r["ratio_fp8_vs_cudnn_bf16"] for r in rows
                                                    if r["ratio_fp8_vs_cudnn_bf16"]]),
        "max_rel_error_vs_dequantized": max(r["rel_error_vs_dequantized"] for r in rows),
        "cases": len(rows), "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__,
    }
    (args.out / "attention_fp8_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0 if all(math.isfinite(r["fp8_ms"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
