"""Does the order in which providers are sampled move their medians? One attention case, fwd+bwd.

The suite's providers of one prefill case (the dispatcher, the Triton rules pick, SDPA cuDNN and
flash) are sampled in rounds, in blocks of `--rounds` rounds that alternate between a fixed order
(the order the suite benchmark used before bench.timing shuffled it) and an order shuffled each
round (what bench.timing.interleaved_medians does now). Under the power cap a sample inherits the
clock its predecessor left, so in a fixed order a provider is judged after the same neighbour
every time. Prints each mode's medians and the dispatcher's ratio to cuDNN, and per provider the
shuffled mode's median by predecessor.

    python benchmarks/studies/sampling_order.py [--case long_S16384_D128_causal] [--rounds 10] [--blocks 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite runners
import attention as suite  # noqa: E402  (benchmarks/attention.py: its case inputs, providers and samplers)

from tiledispatch.core.runtime import current_arch  # noqa: E402


def case_samplers(spec: dict) -> dict:
    """The suite's forward+backward samplers of one case, as benchmarks/attention.py builds them."""
    case = suite.Case(spec, "bf16")
    triton = suite.triton_dispatcher(current_arch())
    fns = {"tiledispatch": suite.ours(None, case), "triton-rules": suite.ours(triton, case)}
    for backend in ("sdpa-cudnn", "sdpa-flash"):
        fns[backend], _ = suite.sdpa(backend, case)
    return {name: suite.sampler(fn, case, backward=True) for name, fn in fns.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="long_S16384_D128_causal")
    parser.add_argument("--rounds", type=int, default=10, help="rounds a block")
    parser.add_argument("--blocks", type=int, default=2, help="blocks of each mode, alternating")
    args = parser.parse_args()
    spec = next(c for c in json.loads(suite.SUITE.read_text())["cases"] if c["name"] == args.case)
    samplers = case_samplers(spec)
    shuffle = random.Random(0)
    log = []  # (mode, provider, predecessor, ms)
    for _ in range(args.blocks):
        for mode in ("fixed", "shuffled"):
            for _ in range(args.rounds):
                order = list(samplers)
                if mode == "shuffled":
                    shuffle.shuffle(order)
                for i, name in enumerate(order):
                    log.append((mode, name, order[i - 1] if i else None, samplers[name]()))
    print(f"{args.case} on {torch.cuda.get_device_name()}: medians (ms) of {args.blocks * args.rounds} samples a mode")
    for mode in ("fixed", "shuffled"):
        med = {n: statistics.median(ms for m, p, _, ms in log if m == mode and p == n) for n in samplers}
        line = "  ".join(f"{n} {t:.3f}" for n, t in med.items())
        print(f"  {mode:<8} {line}  dispatcher vs cuDNN x{med['sdpa-cudnn'] / med['tiledispatch']:.3f}")
    print("  shuffled, by predecessor:")
    for name in samplers:
        by = {}
        for m, p, before, ms in log:
            if m == "shuffled" and p == name:
                by.setdefault(before or "(first)", []).append(ms)
        print(f"    {name:<13} " + "  ".join(f"after {b} {statistics.median(v):.3f} ({len(v)})" for b, v in by.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
