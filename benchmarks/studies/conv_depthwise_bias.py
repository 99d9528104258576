"""Depthwise 7x7 forward with a bias, as ConvNeXt calls it: the toeplitz walk, the window kernel and cuDNN.

The suite's cases have no bias (benchmarks/conv.py); a model's depthwise conv mostly has one.
Each kernel is forced by name, checked against an fp32 cuDNN reference, and timed as CUDA-graph
replays taken in turns with the others (bench.timing.interleaved_medians), bf16 and fp16.

    python benchmarks/studies/conv_depthwise_bias.py [--out FILE.csv]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import tiledispatch  # first: it picks the backend
from tiledispatch.bench.timing import graph_sampler, interleaved_medians

SHAPES = ((32, 384, 28), (32, 128, 56), (32, 768, 14))  # N, C, H = W: ConvNeXt-T's stages at 224 px
ROUNDS = 9
CALLS = 20


def main() -> int:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("conv_depthwise_bias.csv"))
    args = parser.parse_args()
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        tag = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        kernels = {"toeplitz": f"conv_fwd_{tag}_toeplitz_16x32_w16_r28_f7_bias_sm90",
                   "window": f"conv_fwd_{tag}_direct_8x32_w2_k1_win7r14_bias_sm90"}
        for n, c, hw in SHAPES:
            x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
            w = torch.randn(c, 1, 7, 7, device="cuda", dtype=dtype)
            b = torch.randn(c, device="cuda", dtype=dtype)
            ops = [(x, w, b)]
            ref = torch.nn.functional.conv2d(x.float(), w.float(), b.float(), padding=3, groups=c)
            calls = {name: (lambda s, k=k: tiledispatch.conv(s[0], s[1], padding=3, groups=s[0].shape[1], bias=s[2],
                                                             kernel=k))
                     for name, k in kernels.items()}
            calls["dispatcher"] = lambda s: tiledispatch.conv(s[0], s[1], padding=3, groups=s[0].shape[1], bias=s[2])
            calls["cudnn"] = lambda s: torch.nn.functional.conv2d(s[0], s[1], s[2], padding=3, groups=s[0].shape[1])
            errors = {}
            for name, fn in calls.items():
                y = fn(ops[0]).float()
                errors[name] = float((y - ref).abs().max() / ref.abs().max())
            medians = interleaved_medians({name: graph_sampler(fn, ops, CALLS) for name, fn in calls.items()},
                                          ROUNDS)
            for name, ms in medians.items():
                rows.append({"dtype": tag, "n": n, "c": c, "hw": hw, "provider": name,
                             "kernel": kernels.get(name, ""), "us": round(ms * 1e3, 2),
                             "ratio_vs_cudnn": round(medians["cudnn"] / ms, 3), "rel_error": f"{errors[name]:.1e}"})
                print(f"{tag} {n}x{c}x{hw}x{hw} {name:10s} {ms * 1e3:7.1f} us  {medians['cudnn'] / ms:5.2f}x cuDNN  "
                      f"err {errors[name]:.1e}", flush=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    bad = [r for r in rows if float(r["rel_error"]) > 2e-2]
    if bad:
        print(f"{len(bad)} rows past the bf16/fp16 tolerance 2e-2: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
