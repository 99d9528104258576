"""Backward kernels side by side on the GPU: named tiles of the `full` rule set and cuDNN, timed in turns.

For the prefill cases of the suite at d = 64, 128 and 256 without a window or soft-cap (bf16), each
backward tile runs behind the same forward (fwd-ws 128x128 w8 s2, 128x64 at d = 256; it keeps the LSE):
its gradients are checked against the first tile's, then forward+backward is timed as
CUDA-event medians of back-to-back calls, in turns with the forward alone and with cuDNN's
forward+backward (bench.timing.interleaved_medians); a tile's backward is the difference.
It calibrates the ranking between the backward families (ops/attention/ranking.py).

    python benchmarks/studies/attention_backward_ab.py [--kernels bwd_64x128_w8_s3,bwd-ws_32x128_w8_s3] [--out FILE]
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
KERNELS = ("bwd_64x128_w8_s3,bwd_64x128_w8_s2,bwd_64x64_w4_s2,bwd_64x64_w8_s2,"
           "bwd-ws_32x128_w8_s3,bwd-ws_32x128_w8_s2,bwd-ws_64x128_w8_s2,bwd-ws_32x64_w8_s2")
FORWARD = {64: "fwd-ws_128x128_w8_s2", 128: "fwd-ws_128x128_w8_s2", 256: "fwd-ws_128x64_w8_s2"}  # by head dim
ROUNDS = 7
SAMPLE_MS = 40.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", default=KERNELS,
                        help="tiles as FAMILY_BMxBN_wW_sS; the first of them a head dim has is the baseline")
    parser.add_argument("--cases", default=None,
                        help="comma-separated case names (default: d = 64, 128, 256, no window or soft-cap)")
    parser.add_argument("--out", type=Path, default=None, help="also write the medians here as JSON lines")
    args = parser.parse_args()
    arch = current_arch()
    dispatcher = Dispatcher(Registry.from_rule_set("attention", "full", arch), arch)
    chosen = [c for c in json.loads(SUITE.read_text())["cases"] if c["mode"] == "prefill" and c["D"] in FORWARD
              and "window" not in c and "softcap" not in c]
    if args.cases:
        chosen = [c for c in chosen if c["name"] in args.cases.split(",")]
    out = args.out.open("w") if args.out else None
    for case in chosen:
        b, hq, hkv, s, d, causal = case["B"], case["Hq"], case["Hkv"], case["Sq"], case["D"], case["causal"]
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for h in (hq, hkv, hkv))
        grad = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        forward = f"attention_fwd_bf16_d{d}x{d}_{FORWARD[d]}_{arch.tag}"
        names = {tile: f"attention_bwd_bf16_d{d}x{d}_{tile}_{arch.tag}" for tile in args.kernels.split(",")}
        tiles = [tile for tile, name in names.items() if name in dispatcher.registry]

        def training(name):
            def run():
                o = tiledispatch.attention(q, k, v, causal=causal, kernel=forward, backward_kernel=name,
                                           dispatcher=dispatcher)
                return torch.autograd.grad(o, (q, k, v), grad)
            return run

        def forward_only():
            with torch.no_grad():
                return tiledispatch.attention(q, k, v, causal=causal, kernel=forward, return_lse=True,
                                              dispatcher=dispatcher)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
            return torch.autograd.grad(o, (q, k, v), grad)

        runs = {"forward": forward_only, "cudnn": cudnn, **{tile: training(names[tile]) for tile in tiles}}
        reference = runs[tiles[0]]()
        for tile in tiles[1:]:
            error = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                        for g, r in zip(runs[tile](), reference))
            if not error < 3e-2:
                print(f"{case['name']}: {tile}'s gradients differ from {tiles[0]}'s by {error}", file=sys.stderr)
                return 1
        samplers = {label: event_sampler(run, calls_lasting(run, SAMPLE_MS, least=3, most=50))
                    for label, run in runs.items()}
        times = interleaved_medians(samplers, ROUNDS)
        fwd = times["forward"]
        print(f"== {case['name']} ({torch.cuda.get_device_name()}): forward {fwd * 1e3:.0f} us, cuDNN forward+backward "
              f"{times['cudnn'] * 1e3:.0f} us", flush=True)
        for tile in sorted(tiles, key=times.get):
            ms = times[tile]
            print(f"  {tile:22s} backward {(ms - fwd) * 1e3:8.0f} us  x{(times[tiles[0]] - fwd) / (ms - fwd):.3f} "
                  f"{tiles[0]}   forward+backward x{times['cudnn'] / ms:.3f} cuDNN", flush=True)
        if out:
            out.write(json.dumps({"case": case["name"], "gpu": torch.cuda.get_device_name(), "times_ms": times}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
