"""A GEMM tile sweep on the H200: a tile space over chosen suite cases, each kernel against cuBLAS in turns.

It calibrates the rule sets and `ranking.rule_score` where the suite's default registry is
thin. The default space is the tma-persistent family with split-K (small M x N over deep K:
deep_k_*, the T <= 128 Llama projections): every block shape, stage count and split whose
work units fill between half a wave and four waves of SMs. Each kernel is checked against an
fp32 reference, then timed as CUDA-graph replays in turns with cuBLAS
(bench.timing.interleaved_medians), so each ratio compares the same moments of the GPU's
clock; the best few are timed again with cuBLAS. The `rules` pick of the default rule set is
timed beside them, and every row holds the model's time and its rank among all candidates
(the default registry and the space together).

    python benchmarks/gemm_sweep.py --out DIR [--cases a,b] [--dtypes bf16,fp8e4m3]
    python benchmarks/gemm_sweep.py --space stream-k --out DIR   # stream-K tiles beside their persistent twins
    python benchmarks/gemm_sweep.py --space decode --cases <DECODE_CASES> --out DIR   # narrow tiles for M <= 32
    python benchmarks/gemm_sweep.py --space gemv --cases <the T1 cases> --out DIR      # the gemv family (M = 1)
    python benchmarks/gemm_sweep.py --dry-run        # no GPU: the candidates and the model's times

Writes DIR/gemm_sweep.csv (one row per case, dtype and kernel, cuBLAS included).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tiledispatch  # noqa: E402,F401  (first: it picks the backend)
from tiledispatch import arch as arch_facts  # noqa: E402
from tiledispatch.core.dispatcher import Dispatcher  # noqa: E402
from tiledispatch.core.registry import Registry  # noqa: E402
from tiledispatch.ops.gemm import Family, GemmConfig, GemmLayout, GemmProblem, GemmTypes  # noqa: E402
from tiledispatch.ops.gemm.problem import Epilogue  # noqa: E402
from tiledispatch.ops.gemm.rules import accumulator_registers  # noqa: E402
from tiledispatch.ops.gemm.rulesets import WS_TILES  # noqa: E402

from gemm import SUITE, call, make_sets, precompile, problem_of, reference, rel_error, vendor_fn  # noqa: E402

CASES = ("deep_k_64x64x65536", "deep_k_256x256x131072", "llama3_8b_down_T128", "llama3_8b_o_T128",
         "llama3_8b_qkv_T128", "llama3_8b_down_T16", "llama3_70b_down_T256", "llama3_70b_down_T32",
         "tall_skinny_8192x64x8192")
RCR = GemmLayout.parse("rcr")
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
SCREEN_ROUNDS = 3
FINAL_ROUNDS = 7
FINALISTS = 3
FIELDS = ["case", "dtype", "kernel", "source", "split_k", "units", "ms", "tflops", "tbps", "ratio_vs_cublas",
          "cublas_ms_same_turns", "rel_error", "final", "model_us", "model_rank", "status"]


def persistent_split_space(types: GemmTypes, problem: GemmProblem, sm_count: int):
    """tma-persistent tiles with split-K whose work units fill 0.5-4 waves (split 1 always)."""
    block_ks = (128,) if types.a.is_fp8 else (64, 128)
    for bm, bn, bk, stages, split in itertools.product((64, 128), (64, 128, 256), block_ks, (3, 4, 5), SPLITS):
        units = math.ceil(problem.m / bm) * math.ceil(problem.n / bn) * problem.batch * split
        k_iters = math.ceil(problem.k / bk / split)
        if split > 1 and not (sm_count // 2 <= units <= 4 * sm_count and k_iters >= 2):
            continue
        warps = 8 if bm * bn >= 128 * 256 else 4
        yield GemmConfig(Family.TMA_PERSISTENT, types, RCR, Epilogue(), bm, bn, bk, 8, warps, stages, split)


# (block_m, block_n, block_k, stages) of the stream-k sweep: accumulators of 64 registers per thread.
STREAM_K_TILES = {
    False: ((128, 128, 64, 3), (128, 128, 64, 4), (64, 256, 64, 3), (64, 256, 64, 4), (64, 128, 64, 4),
            (64, 128, 64, 5), (128, 64, 64, 4), (64, 128, 128, 4), (128, 128, 128, 3)),
    True: ((128, 128, 128, 3), (128, 128, 128, 4), (64, 256, 128, 3), (64, 256, 128, 4), (64, 128, 128, 4),
           (64, 128, 128, 5), (128, 64, 128, 4)),  # fp8
}


def stream_k_space(types: GemmTypes, problem: GemmProblem, sm_count: int):
    """Stream-k tiles, each beside its tma-persistent twin (the same tile, whole tiles per
    program): the pair shows what dealing the last wave's K iterations buys."""
    for bm, bn, bk, stages in STREAM_K_TILES[types.a.is_fp8]:
        warps = bm * bn // (32 * 64)
        for family in (Family.STREAM_K, Family.TMA_PERSISTENT):
            yield GemmConfig(family, types, RCR, Epilogue(), bm, bn, bk, 8, warps, stages)


DECODE_CASES = ("llama3_8b_o_T1", "llama3_8b_qkv_T1", "llama3_8b_down_T1", "llama3_8b_up_T1", "llama3_8b_o_T16",
                "llama3_8b_qkv_T16", "llama3_8b_down_T16", "llama3_70b_down_T32")


def decode_space(types: GemmTypes, problem: GemmProblem, sm_count: int):
    """Pointer tiles for a few rows of A (the decode projections, M <= 32): B is read once, so
    the kernel is a stream of B at memory speed. Narrow N tiles give every SM several programs
    without splitting K; long K steps give each load enough bytes. Tiles whose shared memory
    exceeds the H200's are left out, and grids of under half a wave or over 16 waves."""
    from tiledispatch.ops.gemm.rules import shared_memory_bytes

    block_m = 16 if problem.m <= 16 else 32
    block_ks = (256, 512, 1024) if types.a.is_fp8 else (128, 256, 512)
    for bn, bk, stages, split in itertools.product((16, 32, 64), block_ks, (2, 3, 4), (1, 2, 4)):
        units = math.ceil(problem.n / bn) * problem.batch * split
        config = GemmConfig(Family.TILED, types, RCR, Epilogue(), block_m, bn, bk, 1, 4, stages, split)
        if sm_count // 2 <= units <= 16 * sm_count and shared_memory_bytes(config) <= 200 * 1024:
            yield config


def gemv_space(types: GemmTypes, problem: GemmProblem, sm_count: int):
    """The gemv family (M = 1): column tiles of 1-32, K steps of 256-2048 elements loaded 1, 2 or 4
    at a time, 2-8 warps, accumulators of 8-128 registers a thread and at most 160 with the steps."""
    if problem.m != 1:
        return
    for bn, bk, warps, stages in itertools.product((1, 2, 4, 8, 16, 32), (256, 512, 1024, 2048), (2, 4, 8), (1, 2, 4)):
        config = GemmConfig(Family.GEMV, types, RCR, Epilogue(), 1, bn, bk, 1, warps, stages)
        if 8 <= bn * bk // (warps * 32) <= 128 and accumulator_registers(config) <= 160 and bk * stages <= problem.k:
            yield config


def ws_space(types: GemmTypes, problem: GemmProblem, sm_count: int):
    """The warp-specialised tiles (rulesets.WS_TILES: ws-persistent and ws-pingpong) for B's element
    size, and tma-persistent's tiles of ws-persistent's first three shapes (8 warps, C stored in
    halves where 256 wide)."""
    tiles = [t for t in WS_TILES if types.b.itemsize in t.b_itemsizes]
    for t in tiles:
        yield GemmConfig(t.family, types, RCR, Epilogue(), t.block_m, t.block_n, t.block_k, 8, 8, t.num_stages)
    for t in [t for t in tiles if t.family is Family.WS_PERSISTENT][:3]:
        yield GemmConfig(Family.TMA_PERSISTENT, types, RCR, Epilogue(), t.block_m, t.block_n, t.block_k, 8, 8,
                         t.num_stages, epilogue_split=2 if t.block_n == 256 else 1)


SPACES = {"split-k": persistent_split_space, "stream-k": stream_k_space, "decode": decode_space, "gemv": gemv_space,
          "ws": ws_space}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("gemm_sweep_out"))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--dtypes", default="bf16,fp8e4m3")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=400.0, help="stop screening new candidates after this")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: list the candidates and the model's times")
    parser.add_argument("--space", choices=sorted(SPACES), default="split-k")
    args = parser.parse_args()
    started = time.perf_counter()
    suite = {c["name"]: c for c in json.loads(SUITE.read_text())["cases"]}
    if args.dry_run:
        arch = arch_facts.load("sm_90")
    else:
        from tiledispatch.core.runtime import current_arch
        arch = current_arch()
    default = Registry.from_rule_set("gemm", "default", arch)
    work = []
    for name, dtype in itertools.product(args.cases.split(","), args.dtypes.split(",")):
        p = problem_of(suite[name], dtype, device="cpu")  # host tensors: --dry-run has no GPU
        space = Registry.from_configs("gemm", SPACES[args.space](p.types, p, arch.sm_count), arch,
                                      source=f"the {args.space} space")
        dispatcher = Dispatcher(default.merge(space), arch)
        ranked = [c for c in dispatcher.explain(p).ranked if c.spec.family != "vendor"]
        rules_pick = next(c.spec.name for c in Dispatcher(default, arch).explain(p).ranked
                          if c.spec.family != "vendor")
        cands = [(c.spec, c.score.terms.get("modelled_us"), rank, "space" if c.spec.name in space else "rules-pick")
                 for rank, c in enumerate(ranked) if c.spec.name in space or c.spec.name == rules_pick]
        work.append((suite[name], dtype, p, dispatcher, cands))
        print(f"{name} {dtype}: {len(cands)} candidates", flush=True)
        if args.dry_run:
            for spec, model_us, rank, source in cands:
                print(f"   {rank:4d} {model_us:9.1f} us  {source:10s} {spec.name}")
    if args.dry_run:
        return 0
    return run(args, work, started)


def run(args, work, started) -> int:
    import torch

    from tiledispatch.bench.timing import graph_sampler, interleaved_medians

    args.out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    for _, _, p, dispatcher, cands in work:
        precompile(dispatcher, [(p, [spec for spec, *_ in cands])], args.jobs)
    print(f"compiled in {time.perf_counter() - t:.0f} s", flush=True)
    with (args.out / "gemm_sweep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for case, dtype, p, dispatcher, cands in work:
            name = case["name"]
            sets = make_sets(case, dtype)
            ref = reference(sets[0])
            vendor = vendor_fn(dtype)
            calls = max(5, min(25, int(50 / max(p.flops() / 400e9, 1e-3))))
            vendor_sampler = graph_sampler(vendor, sets, calls)
            rows, fns = [], {}
            for spec, model_us, rank, source in cands:
                row = {"case": name, "dtype": dtype, "kernel": spec.name, "source": source,
                       "split_k": spec.config.split_k, "model_us": round(model_us, 2), "model_rank": rank,
                       "units": math.ceil(p.m / spec.config.block_m) * math.ceil(p.n / spec.config.block_n)
                       * p.batch * spec.config.split_k}
                if time.perf_counter() - started > args.budget_s:
                    rows.append({**row, "status": "skipped-for-time"})
                    continue
                fn = call(dispatcher, spec.name)
                try:
                    err = rel_error(fn(sets[0]), ref)
                except Exception as e:  # does not build or launch: reported, not fatal
                    rows.append({**row, "status": f"failed: {str(e)[:200]}"})
                    continue
                if not err <= 2e-2:
                    rows.append({**row, "rel_error": f"{err:.2e}", "status": "wrong-result"})
                    print(f"WRONG RESULT {name} {dtype} {spec.name}: {err:.2e}", flush=True)
                    continue
                medians = interleaved_medians({"cublas": vendor_sampler, "k": graph_sampler(fn, sets, calls)},
                                              SCREEN_ROUNDS)
                fns[spec.name] = fn
                rows.append({**row, "ms": medians["k"], "cublas_ms_same_turns": medians["cublas"],
                             "rel_error": f"{err:.2e}", "status": "ok"})
            timed = sorted((r for r in rows if r.get("ms")), key=lambda r: r["ms"] / r["cublas_ms_same_turns"])
            final_names = {r["kernel"] for r in timed[:FINALISTS]} | {r["kernel"] for r in timed
                                                                        if r["source"] == "rules-pick"}
            final = interleaved_medians({"cublas": vendor_sampler, **{k: graph_sampler(fns[k], sets, calls)
                                                                      for k in final_names}}, FINAL_ROUNDS)
            for r in rows:
                if r["kernel"] in final:
                    r.update(ms=final[r["kernel"]], cublas_ms_same_turns=final["cublas"], final=True)
            rows.append({"case": name, "dtype": dtype, "kernel": "cublas", "source": "vendor", "ms": final["cublas"],
                         "cublas_ms_same_turns": final["cublas"], "rel_error": f"{rel_error(vendor(sets[0]), ref):.2e}",
                         "final": True, "status": "ok"})
            for r in rows:
                if r.get("ms"):
                    r["tflops"] = round(p.flops() / r["ms"] / 1e9, 1)
                    r["tbps"] = round(p.bytes() / r["ms"] / 1e9, 3)
                    r["ratio_vs_cublas"] = round(r["cublas_ms_same_turns"] / r["ms"], 3)
                    r["ms"], r["cublas_ms_same_turns"] = round(r["ms"], 5), round(r["cublas_ms_same_turns"], 5)
            writer.writerows(rows)
            f.flush()
            best = sorted((r for r in rows if r.get("ms") and r["source"] != "vendor"),
                          key=lambda r: -r["ratio_vs_cublas"])
            print(f"\n{name} {dtype}: cuBLAS {final['cublas']:.4f} ms; {len(timed)} timed", flush=True)
            for r in best[:6]:
                print(f"   {r['ms']:.4f} ms x{r['ratio_vs_cublas']:.3f}  model {r['model_us']:.1f} us "
                      f"(#{r['model_rank']})  {r['source']:10s} {r['kernel']}", flush=True)
            del sets, ref
            torch.cuda.empty_cache()
    print(f"done in {time.perf_counter() - started:.0f} s; {args.out / 'gemm_sweep.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
