"""cuDNN's own call timed as cuDNN and through the dispatcher's vendor candidate, in turns.

The suite benchmark (conv.py) has now and then timed the dispatcher slower than cuDNN on a row
where the dispatcher runs cuDNN's own call (82.6 against 18.8 us once). This times the two alone,
with conv.py's samplers, in both orders, and lists what each one's graph runs, kernel by kernel
with its time: if they match here, what slowed the suite's row was the state of that run, not
the call.

    python benchmarks/studies/conv_vendor_against_itself.py --rows resnet50_1x1:bwd_weight:fp16,conv3d_g4:bwd_data:fp16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite runners
import conv as suite_bench  # noqa: E402  (the suite benchmark's operands and samplers)
import torch  # noqa: E402

import tiledispatch  # noqa: E402,F401  (first: it picks the backend)
from tiledispatch.bench.timing import interleaved_medians  # noqa: E402
from tiledispatch.core.dispatcher import Dispatcher  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.core.runtime import current_arch  # noqa: E402
from tiledispatch.ops.conv import Direction  # noqa: E402

ROWS = "resnet50_1x1:bwd_weight:fp16,conv3d_g4:bwd_data:fp16,depthwise_mbv2_3x3:bwd_weight:bf16," \
       "resnet50_1x1:bwd_data:bf16,resnet50_1x1:forward:fp16"
PROFILED_CALLS = 5  # graph replays


def graph_kernels(sample) -> list[str]:
    """The GPU work of a sampler's graph replays, as the profiler sees it: each kernel (or memset, copy)
    with its count a replay and its mean time; where two calls' times differ, this says whether a kernel
    ran slower or the graph ran something more."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_CALLS):
            sample()
        torch.cuda.synchronize()
    return [f"{e.key[:60]} x{e.count / PROFILED_CALLS:g} {e.device_time_total / e.count:.2f} us"
            for e in prof.key_averages() if e.device_time_total > 0]


def compare(dispatcher: Dispatcher, case: dict, direction: Direction, dtype: str, repeats: int, rounds: int):
    p = suite_bench.problem_of(case, direction, dtype)
    sets = suite_bench.make_sets(p)
    vendor = next(c.spec for c in dispatcher.explain(p).ranked if c.spec.family == "vendor")
    # The vendor candidate named, and the dispatcher's own pick as the suite times it (its fast path).
    calls = {"cudnn": suite_bench.cudnn_fn(p), "dispatcher": suite_bench.call(dispatcher, vendor)}
    suite_bench.call(dispatcher, None)(sets[0])
    pick = dispatcher.select(sets[0]["ops"].problem)
    if pick.family == "vendor":
        calls["dispatcher-pick"] = suite_bench.call(dispatcher, None)
    else:
        print(f"{case['name']} {direction.value} {dtype}: the dispatcher picks {pick.name}, not cuDNN", flush=True)
    for repeat in range(repeats):
        order = list(calls) if repeat % 2 == 0 else list(reversed(calls))  # each first in turn
        samplers = {name: suite_bench.sampler(calls[name], sets) for name in order}
        medians = interleaved_medians(samplers, rounds)
        times = ", ".join(f"{name} {medians[name] * 1e3:.1f} us" for name in order)
        print(f"{case['name']} {direction.value} {dtype} ({order[0]} first): {times}", flush=True)
    for name, sample in samplers.items():
        print(f"    {name}, a graph replay: {'; '.join(graph_kernels(sample))}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=ROWS, help="comma-separated case:direction:dtype")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    arch = current_arch()
    dispatcher = Dispatcher(Registry.from_rule_set("conv", "default", arch), arch)
    cases = {c["name"]: c for c in json.loads(suite_bench.SUITE.read_text())["cases"]}
    for row in args.rows.split(","):
        name, direction, dtype = row.split(":")
        compare(dispatcher, cases[name], Direction(direction), dtype, args.repeats, args.rounds)


if __name__ == "__main__":
    main()
