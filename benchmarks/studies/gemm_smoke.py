"""A first look at GEMM speed on the GPU: the rules-selected Triton kernel against cuBLAS.

Not the suite benchmark (`benchmarks/gemm.py`): a handful of shapes
from ../shared/suites/gemm.json in bf16, CUDA-event medians with inputs rotated beyond
L2, correctness checked before timing. Writes a CSV to the path given (default stdout).

    python benchmarks/studies/gemm_smoke.py benchmarks/results/h200/gemm_smoke.csv
"""

import csv
import statistics
import sys
import time

import torch

import tiledispatch
from tiledispatch.ops.gemm import check_operands
from tiledispatch.ops.gemm.reference import compare

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (1024, 1024, 1024), (128, 4096, 4096),
          (256, 8192, 28672), (1000, 1000, 1000), (4095, 4097, 4093), (64, 64, 65536), (3000, 5000, 100),
          (16, 6144, 4096), (1, 4096, 14336)]
L2_BYTES = 60 * 2**20


def median_ms(fn, sets, repeats=30):
    for i in range(3):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = sets[i % len(sets)]
        begin.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def main(path=None):
    dispatcher = tiledispatch.default_dispatcher()
    rows = []
    for m, n, k in SHAPES:
        per_set = 2 * (m * k + k * n)
        count = max(2, min(8, 3 * L2_BYTES // per_set + 1))
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(count)]
        a, b = sets[0]
        ops = check_operands(a, b)
        problem = ops.problem
        start = time.perf_counter()
        out = dispatcher.run(ops)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
        check = compare(out, ops) if m * n * k <= 2**33 else None
        spec = dispatcher.select(problem)
        td_ms = median_ms(lambda x, y: tiledispatch.gemm(x, y, dispatcher=dispatcher), sets)
        cublas_ms = median_ms(torch.mm, sets)
        tflops = lambda ms: problem.flops() / ms / 1e9  # noqa: E731
        rows.append({"m": m, "n": n, "k": k, "kernel": spec.name, "tiledispatch_tflops": round(tflops(td_ms), 1),
                     "cublas_tflops": round(tflops(cublas_ms), 1), "ratio": round(cublas_ms / td_ms, 3),
                     "first_call_s": round(first_s, 2),
                     "rel_error": None if check is None else f"{check.relative_error:.2e}",
                     "passed": None if check is None else check.passed})
        print(rows[-1], flush=True)
    # Host overhead of a call on a known tiny problem, against torch.mm.
    a, b = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16), torch.randn(16, 16, device="cuda",
                                                                                   dtype=torch.bfloat16)
    for name, fn in (("tiledispatch.gemm", lambda: tiledispatch.gemm(a, b, dispatcher=dispatcher)),
                     ("torch.mm", lambda: torch.mm(a, b))):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(2000):
            fn()
        host_us = (time.perf_counter() - start) / 2000 * 1e6
        torch.cuda.synchronize()
        print({"host_us_per_call": name, "us": round(host_us, 2)}, flush=True)
        rows.append({"m": 16, "n": 16, "k": 16, "kernel": f"host overhead: {name}", "first_call_s": None,
                     "tiledispatch_tflops": None, "cublas_tflops": None, "ratio": None, "rel_error": None,
                     "passed": None, "host_us": round(host_us, 2)})
    out = open(path, "w", newline="") if path else sys.stdout
    writer = csv.DictWriter(out, fieldnames=list(rows[0].keys()) + ["host_us"])
    writer.writeheader()
    writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
