"""The Llama workloads' attention call, each way it can run (GPU): where its time goes.

benchmarks/models.py's Llama shapes (bf16, 16 query heads over 4 KV heads, head dim 128): the
prefill's causal 4 x 512 tokens and the decode's one token over a 512-token cache, q, k, v laid
out as transformers hands them over (q, k, v each a transpose of its projection's output). Each
path is timed three ways, the paths of one shape in turns (bench.timing.interleaved_medians):

    loop   wall time a call of back-to-back calls, the GPU synchronised around them: what an
           eager program pays, its host and its kernels together;
    host   the wall time of the Python call alone (the GPU's work is queued, not awaited);
    gpu    a CUDA graph of the calls, replayed: the kernels' time, no host.

Paths: sdpa (F.scaled_dot_product_attention as transformers calls it, enable_gqa), the private
cuDNN and flash ops called straight, tiledispatch.attention with its own picks, and with each
of its forward's candidates forced (`kernel=`). The training form (forward and backward, q, k,
v requiring grad) is timed for the prefill. Then the dispatcher's ranking of each problem.

    python benchmarks/studies/llama_attention_paths.py [--rounds 9] [--forced 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tiledispatch  # noqa: E402
from tiledispatch.bench.timing import event_sampler, interleaved_medians  # noqa: E402
from tiledispatch.core.dispatcher import default_dispatcher  # noqa: E402
from tiledispatch.ops.attention.function import _checked, read_call  # noqa: E402

HEADS, KV_HEADS, DIM, BATCH, TOKENS = 16, 4, 128, 4, 512


def operands(seqlen_q: int, grad: bool):
    """q, k, v as transformers' Llama hands them to its attention: (batch, heads, seq, dim) views
    of (batch, seq, heads * dim) projections."""
    def project(heads, seq):
        x = torch.randn(BATCH, seq, heads * DIM, device="cuda", dtype=torch.bfloat16)
        return x.view(BATCH, seq, heads, DIM).transpose(1, 2).requires_grad_(grad)
    return project(HEADS, seqlen_q), project(KV_HEADS, TOKENS), project(KV_HEADS, TOKENS)


def paths(q, k, v, causal: bool, forced: list[str]) -> dict:
    scale = DIM ** -0.5
    ours_causal = "bottom_right" if causal else False
    out = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True),
        "cudnn op": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, q.requires_grad, 0.0, causal, False, scale=scale)[0],
        "flash op": lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False,
                                                                              scale=scale)[0],
        "ours": lambda: tiledispatch.attention(q, k, v, causal=ours_causal, scale=scale),
    }
    for name in forced:
        out[f"ours forced {name}"] = lambda name=name: tiledispatch.attention(q, k, v, causal=ours_causal,
                                                                               scale=scale, kernel=name)
    return out


def trained(fn, q, k, v):
    grad = torch.randn(BATCH, HEADS, q.shape[2], DIM, device="cuda", dtype=torch.bfloat16)

    def step():
        q.grad = k.grad = v.grad = None
        fn().backward(grad)
    return step


def host_sampler(fn, calls: int = 50):
    def sample() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - start) / calls * 1e3
        torch.cuda.synchronize()
        return host
    return sample


def graph_sampler(fn, calls: int = 20):
    """bench.timing.graph_sampler's replay of `calls` calls, warmed up on a side stream first, as a
    capture of autograd's backward wants (the training form records and runs one)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()

    def sample() -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / calls
    return sample


def ranking(q, k, v, causal: bool, top: int) -> list[tuple[str, str]]:
    """(direction, "name modelled_us") of the forward's (and, for a training call, the backward's)
    best candidates, and the pick."""
    call, grad, _ = read_call(q, k, v, None, None, None, None, causal="bottom_right" if causal else False,
                              window=None, scale=DIM ** -0.5, softcap=None, dropout_p=0.0, dropout_seed=None,
                              dropout_offset=0, return_lse=False, deterministic=False, kernel=None,
                              backward_kernel=None, dispatcher=None)
    d = default_dispatcher()
    tensors = dict.fromkeys(("bias", "sinks", "mask", "alibi_slopes", "cu_seqlens_q", "cu_seqlens_k",
                             "scale_q", "scale_k", "scale_v"))
    forward = _checked(d, q, k, v, tensors, call.options).problem
    problems = [("forward", forward)]
    if grad:
        from tiledispatch.ops.attention.problem import Direction
        out = q.new_empty((*q.shape[:3], v.shape[3]))
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        backward = _checked(d, q, k, v, tensors, call.options, direction=Direction.BACKWARD, out=out, lse=lse,
                            grad_out=torch.empty_like(out)).problem
        problems.append(("backward", backward))
    lines = []
    for direction, problem in problems:
        pick = d.select(problem, device=q.device)
        lines.append((direction, f"pick {pick.name}"))
        for c in d.ranked(problem)[:top]:
            us = c.score.terms.get("modelled_us") if c.score is not None else None
            lines.append((direction, f"  {c.spec.name}  modelled {us if us is None else round(us, 1)} us"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--forced", type=int, default=3, help="the forward's best N candidates forced")
    args = parser.parse_args()
    cases = [("prefill", TOKENS, True, False), ("decode", 1, False, False), ("prefill train", TOKENS, True, True)]
    for name, seqlen_q, causal, grad in cases:
        q, k, v = operands(seqlen_q, grad)
        with torch.enable_grad():
            lines = ranking(q, k, v, causal, args.forced + 2)
        for direction, line in lines:
            print(f"{name} {direction}: {line}")
        forced = [line.split()[0] for direction, line in lines if direction == "forward" and line.startswith("  ")]
        table = paths(q, k, v, causal, forced[:args.forced])
        if grad:
            table = {path: trained(fn, q, k, v) for path, fn in table.items()}
        samplers = {}
        for path, fn in table.items():
            try:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                samplers[f"{path} | loop"] = event_sampler(fn, 20)
                samplers[f"{path} | host"] = host_sampler(fn)
                samplers[f"{path} | gpu"] = graph_sampler(fn)
            except Exception as error:  # a path this shape refuses (the flash op with GQA, say)
                print(f"{name}: {path} failed: {str(error).splitlines()[0][:160]}")
        medians = interleaved_medians(samplers, rounds=args.rounds)
        for path in table:
            if f"{path} | loop" in medians:
                loop, host, gpu = (medians[f"{path} | {kind}"] * 1e3 for kind in ("loop", "host", "gpu"))
                print(f"{name}: {path:58s} loop {loop:8.1f} us  host {host:7.1f} us  gpu {gpu:7.1f} us", flush=True)


if __name__ == "__main__":
    main()
