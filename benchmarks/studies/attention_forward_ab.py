"""Forward kernels side by side on the GPU: named tiles of the `full` rule set and cuDNN, timed in turns.

For the prefill cases of the suite at d = 64, 128 and 256 (bf16), each kernel's output is checked
against the first one's, then every provider is timed as CUDA-event medians of back-to-back calls,
sampled in turns (bench.timing.interleaved_medians), so the ratios compare the same moments of
the GPU's clock. It calibrates the ranking between families (ops/attention/ranking.py): the
suite benchmark (attention.py) times only the rules' top few, which come from one family.

    python benchmarks/studies/attention_forward_ab.py [--kernels fwd-tma_64x64_w4_s3,fwd-ws_128x128_w8_s2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tiledispatch
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from tiledispatch import Dispatcher, Registry
from tiledispatch.bench.timing import calls_lasting, event_sampler, interleaved_medians
from tiledispatch.core.runtime import current_arch

SUITE = Path(__file__).resolve().parents[1] / "suites" / "attention.json"
KERNELS = ("fwd-tma_64x64_w4_s3,fwd-tma_128x64_w8_s2,fwd-ws_128x128_w8_s2,fwd-ws_128x128_w8_s3,fwd-ws_128x64_w8_s3,"
           "fwd-ws_128x64_w8_s2")
ROUNDS = 9
SAMPLE_MS = 30.0  # back-to-back calls per sample: about this long


def cases(names: list[str] | None) -> list[dict]:
    chosen = [c for c in json.loads(SUITE.read_text())["cases"]
              if c["mode"] == "prefill" and c["D"] in (64, 128, 256)]
    return [c for c in chosen if names is None or c["name"] in names]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", default=KERNELS,
                        help="tiles as FAMILY_BMxBN_wW_sS; the first of them a head dim has is the baseline")
    parser.add_argument("--cases", default=None,
                        help="comma-separated case names (default: the prefill cases at d = 64, 128, 256)")
    parser.add_argument("--out", type=Path, default=None, help="also write the medians here as JSON lines")
    args = parser.parse_args()
    arch = current_arch()
    dispatcher = Dispatcher(Registry.from_rule_set("attention", "full", arch), arch)
    out = args.out.open("w") if args.out else None
    for case in cases(args.cases.split(",") if args.cases else None):
        b, hq, hkv, s, d = case["B"], case["Hq"], case["Hkv"], case["Sq"], case["D"]
        causal, window, softcap = case["causal"], case.get("window"), case.get("softcap")
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        names = {tile: f"attention_fwd_bf16_d{d}x{d}_{tile}_{arch.tag}" for tile in args.kernels.split(",")}
        tiles = [tile for tile, name in names.items() if name in dispatcher.registry]  # d=256 has fewer
        runs = {}
        if window is None and softcap is None:  # SDPA has neither a sliding window nor a soft-cap
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                            enable_gqa=hq != hkv)
            runs["cudnn"] = cudnn
        for tile in tiles:
            runs[tile] = lambda name=names[tile]: tiledispatch.attention(q, k, v, causal=causal, window=window,
                                                                  softcap=softcap, kernel=name, dispatcher=dispatcher)
        reference = runs[tiles[0]]().float()
        for label, run in runs.items():
            error = (run().float() - reference).abs().max().item()
            if not error < 2e-2:
                print(f"{case['name']}: {label} differs from {tiles[0]} by {error}", file=sys.stderr)
                return 1
        samplers = {label: event_sampler(run, calls_lasting(run, SAMPLE_MS, least=3, most=100))
                    for label, run in runs.items()}
        times = interleaved_medians(samplers, ROUNDS)
        print(f"== {case['name']} ({torch.cuda.get_device_name()})", flush=True)
        for label, ms in sorted(times.items(), key=lambda kv: kv[1]):
            vs_cudnn = f"x{times['cudnn'] / ms:.3f} cuDNN" if "cudnn" in times else ""
            print(f"  {label:26s} {ms * 1e3:9.1f} us  x{times[tiles[0]] / ms:.3f} {tiles[0]}  {vs_cudnn}", flush=True)
        if out:
            out.write(json.dumps({"case": case["name"], "gpu": torch.cuda.get_device_name(), "times_ms": times}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
