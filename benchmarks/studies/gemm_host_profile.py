"""Where the host time of a dispatched GEMM call goes, on a tiny problem seen before (GPU).

Times each layer of the fast path on its own (the call signature, the memo lookup, the
bound call, the bare launcher) against torch.mm, then profiles the whole call.

    python benchmarks/studies/gemm_host_profile.py [--kernel NAME] [--no-out]
"""

from __future__ import annotations

import argparse

import tiledispatch
import torch

from tiledispatch.bench.timing import host_us_per_call, profiled
from tiledispatch.core.dispatcher import default_dispatcher
from tiledispatch.ops.gemm import fastpath


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default=None, help="force a kernel (default: the dispatcher's pick)")
    parser.add_argument("--no-out", action="store_true", help="calls without out=: the result allocated per call")
    args = parser.parse_args()
    a = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, 16, device="cuda", dtype=torch.bfloat16)
    dispatcher = default_dispatcher()
    given = None if args.no_out else out
    call = lambda: tiledispatch.gemm(a, b, out=given, kernel=args.kernel)  # noqa: E731
    call()
    key = fastpath.call_key(a, b, None, None, None, given, None, False, None, None, args.kernel)
    bound = dispatcher.memo(key, lambda: None)
    eager = bound.eager if isinstance(bound, fastpath.ByCapture) else bound  # a graph capture runs .replayed
    stream = torch.cuda.current_stream().cuda_stream
    print("kernel:", dispatcher.select(bound_problem(a, b, out)).name if args.kernel is None else args.kernel,
          f"({type(bound).__name__}{', eager ' + type(eager).__name__ if eager is not bound else ''})")
    expanded = torch.empty((), device="cuda", dtype=torch.bfloat16).expand(16, 16)
    rows = {
        "torch.mm(out=)": lambda: torch.mm(a, b, out=out),
        "torch.mm": lambda: torch.mm(a, b),
        "tiledispatch.gemm" + ("" if args.no_out else "(out=)"): call,
        "  call_key": lambda: fastpath.call_key(a, b, None, None, None, given, None, False, None, None, args.kernel),
        "  dispatcher.memo": lambda: dispatcher.memo(key, lambda: None),
        "  bound call": lambda: bound(a, b, None, None, given, None, None),
        "  torch.empty(16x16)": lambda: torch.empty(1, 16, 16, device="cuda", dtype=torch.bfloat16),
        "  torch.empty_like(expanded)": lambda: torch.empty_like(expanded),  # how a bound call allocates
    }
    if isinstance(eager, fastpath.BoundGemm):  # the replay engine's run, the launch included
        rows["  replay engine run"] = lambda: eager._run((a, b, None, None, out, None, None), stream)
    for name, fn in rows.items():
        print(f"{name:28s} {host_us_per_call(fn, calls=5000, warmup=300):7.2f} us")
    stats, _ = profiled(call, 5000)
    stats.sort_stats("tottime").print_stats(15)


def bound_problem(a, b, out):
    from tiledispatch.ops.gemm import check_operands

    return check_operands(a, b, out=out).problem


if __name__ == "__main__":
    main()
