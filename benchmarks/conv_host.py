"""Host cost of an eager conv call: tiledispatch's fast path and checked path beside PyTorch's own call.

For each case-direction of the suite named, bf16, channels-last: `host us` is the time spent inside
the Python call (the launches are asynchronous), `wall us` the time of CALLS back-to-back calls to
the last one's end, over CALLS. A call whose host time passes its GPU time is host-bound, and eager
code sees that instead of the kernel. `checked` runs every check and plans anew each call (the
path before ops/conv/fastpath.py, and still the first call of each signature).

    python benchmarks/conv_host.py [--cases depthwise_5x5,resnet50_3x3] [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import conv as bench  # noqa: E402  (benchmarks/conv.py: the suite's problems and inputs)

import tiledispatch  # noqa: E402
from tiledispatch.core.dispatcher import default_dispatcher  # noqa: E402
from tiledispatch.ops.conv import Direction, check_operands  # noqa: E402
from tiledispatch.ops.conv.inputs import make_inputs  # noqa: E402

PUBLIC = {Direction.FORWARD: (tiledispatch.conv, ("x", "w")),
          Direction.BWD_DATA: (tiledispatch.conv_backward_data, ("dy", "w", "input_size")),
          Direction.BWD_WEIGHT: (tiledispatch.conv_backward_weight, ("x", "dy", "weight_size"))}


def timed(fn, calls: int) -> tuple[float, float]:
    """(host us, wall us) a call over `calls` calls, after warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    host = 0.0
    begin = time.perf_counter()
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        host += time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - begin
    return host / calls * 1e6, wall / calls * 1e6


def calls(p, dispatcher) -> dict:
    """The three calls of `p` on one set of inputs (the caller's out given, as a training step does)."""
    inputs = make_inputs(p, device="cuda")
    kwargs = inputs.kwargs(p)
    function, positional = PUBLIC[p.direction]
    args = [kwargs[k] for k in positional]
    keywords = {k: v for k, v in kwargs.items() if k in ("stride", "padding", "dilation", "groups", "out")}
    vendor, vendor_set = bench.cudnn_fn(p), {"inputs": inputs}
    return {"fast path": lambda: function(*args, **keywords),
            "checked": lambda: dispatcher.run(check_operands(p.direction, **kwargs)),
            "pytorch": lambda: vendor(vendor_set)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="depthwise_5x5,depthwise_mbv2_3x3,resnet50_3x3,conv1d_g16_k3")
    parser.add_argument("--directions", default="forward,bwd_data,bwd_weight")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    cases = {c["name"]: c for c in json.loads(bench.SUITE.read_text())["cases"]}
    dispatcher = default_dispatcher()
    print(f"{'case':<22} {'direction':<10} {'call':<10} {'host us':>8} {'wall us':>8}", flush=True)
    for name in args.cases.split(","):
        for direction in map(Direction, args.directions.split(",")):
            p = bench.problem_of(cases[name], direction, "bf16")
            for label, fn in calls(p, dispatcher).items():
                host, wall = timed(fn, args.calls)
                print(f"{name:<22} {direction.value:<10} {label:<10} {host:8.1f} {wall:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
