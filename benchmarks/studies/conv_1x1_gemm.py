"""Why conv's 1x1 `gemm` family loses to cuDNN inside networks (GPU; model_layer_times.py found it
0.81-0.84x cuDNN on 76 layers of resnet50 and mobilenet_v3_large): for resnet50's and MobileNet's
1x1 shapes, in turns under CUDA graphs (bf16, channels-last), F.conv2d (cuDNN), our conv with the
`gemm` family forced, torch.mm on the same matrices (cuBLAS) and tiledispatch.gemm on them, with the
GEMM kernel tiledispatch.gemm picks.

    python benchmarks/studies/conv_1x1_gemm.py [--calls 20] [--rounds 15]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch.bench.selections import selections
from tiledispatch.bench.timing import graph_sampler, interleaved_medians

# (N, C, H, W, K): resnet50's and mobilenet_v3_large's 1x1 layers that lose the most
SHAPES = [(32, 64, 56, 56, 256), (32, 256, 56, 56, 64), (32, 1024, 14, 14, 512), (32, 512, 7, 7, 2048),
          (64, 24, 56, 56, 72), (64, 72, 56, 56, 24), (64, 16, 112, 112, 64), (64, 960, 7, 7, 160)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    forced = "conv_fwd_bf16_gemm_none_sm90"
    for n, c, h, w, k in SHAPES:
        x = torch.randn(n, c, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
        wt = (torch.randn(k, c, 1, 1, device="cuda", dtype=torch.bfloat16) * 0.1).contiguous(
            memory_format=torch.channels_last)
        a, b = x.permute(0, 2, 3, 1).reshape(-1, c), wt.reshape(k, c).t()  # (NHW, C) @ (C, K)
        picks = [" > ".join(selections(call)) for call in (lambda: tiledispatch.gemm(a, b),
                                                           lambda: tiledispatch.conv(x, wt, kernel=forced))]
        samplers = {
            "cudnn": graph_sampler(lambda _: F.conv2d(x, wt), [None], args.calls),
            "mm": graph_sampler(lambda _: torch.mm(a, b), [None], args.calls),
            "td.gemm": graph_sampler(lambda _: tiledispatch.gemm(a, b), [None], args.calls),
        }
        try:
            samplers["conv gemm family"] = graph_sampler(lambda _: tiledispatch.conv(x, wt, kernel=forced), [None],
                                                         args.calls)
        except Exception as e:  # noqa: BLE001  (a study: say it and go on)
            print(f"  conv gemm family: {type(e).__name__}: {e}")
        times = interleaved_medians(samplers, args.rounds)
        print(f"N{n} C{c} {h}x{w} K{k} (M={n * h * w}, N={k}, K={c}): "
              + "  ".join(f"{p} {t * 1e3:6.1f} us" for p, t in times.items())
              + f"\n    td.gemm picks {picks[0]}; the conv family's call picks {picks[1]}")


if __name__ == "__main__":
    main()
