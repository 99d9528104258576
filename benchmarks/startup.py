"""Start-up cost in a fresh process with a warm kernel cache (issue 40 item 4's target).

Each figure comes from a fresh Python subprocess (`python -c`), so nothing of the parent's
imports, registries or memo tables helps it:
  - `import torch`, then `import tiledispatch` on top of it (wall clock, median of --repeats
    processes);
  - for each op (a bf16 GEMM 2048x2048x2048 with an nn.Linear weight, a 3x3 conv 32x128x56x56
    -> 128 channels-last, a causal GQA attention 4x16x1024x128 with 4 KV heads), the first call
    after the imports and the inputs are ready (synchronized, wall clock), and the median of the
    same call repeated warm in the same process; the difference is what a user's first call pays.
    Before the clock, the PyTorch call of the same kind runs once (timed apart:
    vendor_first_call_ms), so that creating a cuBLAS or cuDNN handle, which torch.mm's first
    call pays too, is not counted as ours.
The parent first runs each op once in a child of its own, so the kernel cache is warm: the
difference is start-up work (registries, ranking, loading compiled kernels), not compiling.

    python benchmarks/startup.py [--out DIR] [--repeats 3] [--cache-dir DIR] [--smoke]

Writes startup.json under DIR (default benchmarks/results/h200): the import seconds, each op's
first-call and warm-call milliseconds and their difference, against the targets (at most 50 ms
over a warm call, at most 0.3 s of import on top of torch), with pass/fail. --cache-dir points
the children's kernel cache there (TILEDISPATCH_CACHE_DIR), a fresh directory for a measurement
that does not depend on what the user's cache holds. --smoke: tiny fp32 shapes on the CPU under
Triton's interpreter (the code path, not a measurement: the interpreter's first call is not a
GPU's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

OUT = Path("benchmarks/results/h200")
FIRST_CALL_TARGET_MS = 50.0
IMPORT_TARGET_S = 0.3
WARM_CALLS = 20


@dataclass(frozen=True)
class OpCase:
    """One op call, as the source a child runs: `setup` makes the inputs, `call` is timed, and
    `vendor` (timed apart, before it) is the PyTorch call of the same kind that pays the vendor
    library's own first-call set-up (a cuBLAS or cuDNN handle) whichever library the pick is."""
    name: str
    setup: str
    call: str
    vendor: str


SDPA = "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)"
GPU_CASES = (
    OpCase("gemm", "a = torch.randn(2048, 2048, device=dev).to(dt); w = torch.randn(2048, 2048, device=dev).to(dt)",
           "tiledispatch.gemm(a, w.t())", "torch.mm(a, w.t())"),
    OpCase("conv", "x = torch.randn(32, 128, 56, 56, device=dev).to(dt).contiguous(memory_format=torch.channels_last)"
                   "; w = torch.randn(128, 128, 3, 3, device=dev).to(dt).contiguous(memory_format=torch.channels_last)",
           "tiledispatch.conv(x, w, padding=1)", "torch.nn.functional.conv2d(x, w, padding=1)"),
    OpCase("attention", "q = torch.randn(4, 16, 1024, 128, device=dev).to(dt); "
                        "k = torch.randn(4, 4, 1024, 128, device=dev).to(dt); v = torch.randn_like(k)",
           "tiledispatch.attention(q, k, v, causal=True)", SDPA),
)
SMOKE_CASES = (
    OpCase("gemm", "a = torch.randn(32, 32, device=dev).to(dt); w = torch.randn(32, 32, device=dev).to(dt)",
           "tiledispatch.gemm(a, w.t())", "torch.mm(a, w.t())"),
    OpCase("conv", "x = torch.randn(1, 8, 8, 8, device=dev).to(dt).contiguous(memory_format=torch.channels_last)"
                   "; w = torch.randn(8, 8, 3, 3, device=dev).to(dt).contiguous(memory_format=torch.channels_last)",
           "tiledispatch.conv(x, w, padding=1)", "torch.nn.functional.conv2d(x, w, padding=1)"),
    OpCase("attention", "q = torch.randn(1, 2, 16, 32, device=dev).to(dt); "
                        "k = torch.randn(1, 1, 16, 32, device=dev).to(dt); v = torch.randn_like(k)",
           "tiledispatch.attention(q, k, v, causal=True)", SDPA),
)

# The child's source: the clock starts before `import torch`; results go to stdout as one JSON line.
IMPORTS = """
import time, json
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import tiledispatch
t2 = time.perf_counter()
"""
OP_CHILD = IMPORTS + """
dev, dt = {device!r}, getattr(torch, {dtype!r})
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
{setup}
sync()
start = time.perf_counter()
{vendor}
sync()
vendor = time.perf_counter() - start
start = time.perf_counter()
{call}
sync()
first = time.perf_counter() - start
warm = []
for _ in range({warm_calls}):
    start = time.perf_counter()
    {call}
    sync()
    warm.append(time.perf_counter() - start)
warm.sort()
strategy = tiledispatch.default_dispatcher().strategy.value  # model where LightGBM loads and a model ships
print(json.dumps({{"first_ms": first * 1e3, "warm_ms": warm[len(warm) // 2] * 1e3, "vendor_first_ms": vendor * 1e3,
                  "strategy": strategy}}))
"""
IMPORT_CHILD = IMPORTS + 'print(json.dumps({"torch_s": t1 - t0, "tiledispatch_s": t2 - t1}))\n'


def child(source: str, env: dict) -> dict:
    """Runs `source` in a fresh interpreter; its last stdout line is the JSON it reports."""
    done = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_env(args, smoke: bool) -> dict:
    env = dict(os.environ)
    if args.cache_dir:
        env["TILEDISPATCH_CACHE_DIR"] = str(args.cache_dir)
    if smoke:
        env.setdefault("TRITON_INTERPRET", "1")
    return env


def op_source(case: OpCase, smoke: bool, warm_calls: int) -> str:
    device, dtype = ("cpu", "float32") if smoke else ("cuda", "bfloat16")
    return OP_CHILD.format(device=device, dtype=dtype, setup=case.setup, vendor=case.vendor, call=case.call,
                           warm_calls=warm_calls)


def compile_bytecode() -> None:
    """The package's bytecode written ahead, as `pip install` writes it: a source tree run with
    PYTHONDONTWRITEBYTECODE set (the GPU hosts' default) would otherwise compile every module in
    each child, which is not start-up a user's install pays."""
    import compileall
    import importlib.util
    package = Path(importlib.util.find_spec("tiledispatch").origin).parent
    compileall.compile_dir(str(package), quiet=1)


def measure_imports(env: dict, repeats: int) -> dict:
    runs = [child(IMPORT_CHILD, env) for _ in range(repeats)]
    torch_s = statistics.median(r["torch_s"] for r in runs)
    ours_s = statistics.median(r["tiledispatch_s"] for r in runs)
    return {"import_torch_s": round(torch_s, 4), "import_tiledispatch_s": round(ours_s, 4),
            "target_s": IMPORT_TARGET_S, "pass": ours_s <= IMPORT_TARGET_S,
            "samples": [{k: round(v, 4) for k, v in r.items()} for r in runs]}


def measure_op(case: OpCase, env: dict, smoke: bool, repeats: int) -> dict:
    """The first and warm call of one op, each in `repeats` fresh processes (medians), after a
    child of its own has filled the kernel cache."""
    warm_calls = 3 if smoke else WARM_CALLS
    try:
        child(op_source(case, smoke, 1), env)  # fills the cache: compiles what the call selects
        runs = [child(op_source(case, smoke, warm_calls), env) for _ in range(repeats)]
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as error:
        return {"call": case.call, "status": f"error: {str(error).strip()[-600:]}", "pass": False}
    first = statistics.median(r["first_ms"] for r in runs)
    warm = statistics.median(r["warm_ms"] for r in runs)
    vendor = statistics.median(r["vendor_first_ms"] for r in runs)
    return {"call": case.call, "strategy": runs[0].get("strategy"), "first_call_ms": round(first, 3),
            "warm_call_ms": round(warm, 3),
            "vendor_first_call_ms": round(vendor, 3),
            "difference_ms": round(first - warm, 3), "target_ms": FIRST_CALL_TARGET_MS,
            "pass": first - warm <= FIRST_CALL_TARGET_MS, "status": "ok",
            "samples": [{k: round(v, 3) for k, v in r.items() if k != "strategy"} for r in runs]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--repeats", type=int, default=None,
                        help="fresh processes per figure, medians (default 3; --smoke: 1)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="the children's TILEDISPATCH_CACHE_DIR")
    parser.add_argument("--ops", default="gemm,conv,attention")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 shapes on the CPU (Triton's interpreter)")
    args = parser.parse_args(argv)
    import torch
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run with --smoke for the CPU stand-in")
    env = child_env(args, args.smoke)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    cases = [c for c in (SMOKE_CASES if args.smoke else GPU_CASES) if c.name in args.ops.split(",")]
    compile_bytecode()
    result = {"imports": measure_imports(env, args.repeats)}
    print(f"import torch {result['imports']['import_torch_s']} s, tiledispatch on top "
          f"{result['imports']['import_tiledispatch_s']} s", file=sys.stderr, flush=True)
    result["ops"] = {}
    for case in cases:
        result["ops"][case.name] = measure_op(case, env, args.smoke, args.repeats)
        op = result["ops"][case.name]
        print(f"{case.name}: first {op.get('first_call_ms')} ms, warm {op.get('warm_call_ms')} ms "
              f"({op['status'][:200]})", file=sys.stderr, flush=True)
    import triton
    result["pass"] = result["imports"]["pass"] and all(op["pass"] for op in result["ops"].values())
    result.update({"gpu": torch.cuda.get_device_name() if not args.smoke else "cpu (Triton interpreter)",
                   "torch": torch.__version__, "triton": triton.__version__, "smoke": args.smoke,
                   "cases": [asdict(c) for c in cases], "command": "python " + " ".join(sys.argv),
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out / 'startup.json'}: pass {result['pass']}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
