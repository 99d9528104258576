"""Which of tiledispatch's ops costs the Llama workloads their time against PyTorch (GPU).

benchmarks/models.py's Llama prefill and decode, each step timed four ways in turns
(bench.timing.interleaved_medians), all with the same weights:

    pytorch     PyTorch's modules and SDPA
    linears     tiledispatch.nn's Linear (tiledispatch.nn.patch), SDPA's attention
    attention   PyTorch's Linear, tiledispatch.attention through transformers' interface
    both        both, as models.py runs "tiledispatch"

A ratio of 1.0 means the variant costs what PyTorch's model does; the ratios of `linears` and
`attention` say which op a gap of `both` comes from. Modes: eager inference and, for the
prefill, a training step (forward, loss, backward), as models.py times them. Each mode first
prints what its first attention call got from transformers (mask, causal, the tensors' strides,
whether autograd records it) and the node our output carries (cuDNN's own, or our op's twin).

With `--profile`, each mode then runs a few steps of `pytorch` and `attention` under the torch
profiler and prints their ops by host time and by GPU time: where a gap the ratios show is spent.

    python benchmarks/studies/llama_attribution.py [--models llama_prefill,llama_decode] [--rounds 15] [--profile]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import models  # noqa: E402  (benchmarks/models.py)
from tiledispatch.bench.timing import interleaved_medians  # noqa: E402

VARIANTS = ("pytorch", "linears", "attention", "both")
SEEN: list[str] = []  # the first attention call of each mode, described


def inspected(attend):
    """models.tiledispatch_attention, describing its first call after SEEN is cleared."""
    def call(module, query, key, value, attention_mask, *args, **kwargs):
        out = attend(module, query, key, value, attention_mask, *args, **kwargs)
        if not SEEN:
            node, chain = out[0].grad_fn, []
            while node is not None and len(chain) < 3:  # the copy, the transpose, then the attention's node
                chain.append(node.name())
                node = node.next_functions[0][0] if node.next_functions else None
            SEEN.append(f"mask {None if attention_mask is None else tuple(attention_mask.shape)}, "
                        f"is_causal {kwargs.get('is_causal')}, q {tuple(query.stride())} k {tuple(key.stride())} "
                        f"v {tuple(value.stride())}, grad {query.requires_grad}, nodes {' <- '.join(chain) or None}")
        return out
    return call


def variants(work, setting) -> dict:
    """The four models of one workload, each of the reference's weights in the run's dtype."""
    torch.manual_seed(0)
    with torch.device(setting.device):
        reference = work.build(setting).to(setting.dtype).eval()
    out = {}
    for name in VARIANTS:
        model = copy.deepcopy(reference)
        if name in ("linears", "both"):
            models.use_tiledispatch(model)
        if name in ("attention", "both"):
            models.route_attention(model)
        out[name] = model
    return out


def step(mode: str, work, model, inputs):
    if mode == "train":
        model.train()
        return models.train_step(model, work, inputs)
    model.eval()
    return work.session(model, model, inputs)


def profiled(label: str, fn, steps: int = 5) -> None:
    """`steps` calls of `fn` under the torch profiler: the ops by host time and by GPU time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    for key in ("self_cpu_time_total", "self_device_time_total"):
        print(f"== {label}, {steps} steps, by {key}", flush=True)
        print(events.table(sort_by=key, row_limit=18, max_name_column_width=70), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama_prefill,llama_decode")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", action="store_true", help="profile pytorch and attention after timing them")
    args = parser.parse_args()
    setting = models.GPU
    models.tiledispatch_attention = inspected(models.tiledispatch_attention)
    table = models.workloads(smoke=False)
    for name in args.models.split(","):
        work = table[name]
        built = variants(work, setting)
        inputs = work.inputs(setting)
        for mode in ("eager", "train") if name == "llama_prefill" else ("eager",):
            with torch.set_grad_enabled(mode == "train"):
                steps = {v: step(mode, work, m, inputs) for v, m in built.items()}
                SEEN.clear()
                steps["attention"]()
                print(f"{name} {mode}: our attention's first call: {SEEN[0] if SEEN else 'none'}", flush=True)
                for fn in steps.values():  # first sights, compiles and cuDNN plans outside the clock
                    for _ in range(3):
                        fn()
                torch.cuda.synchronize()
                samplers = {v: models.sampler(fn, setting) for v, fn in steps.items()}
                medians = interleaved_medians(samplers, rounds=args.rounds)
            base = medians["pytorch"]
            line = "  ".join(f"{v} {medians[v]:.3f} ms ({base / medians[v]:.3f}x)" for v in VARIANTS)
            print(f"{name} {mode}: {line}", flush=True)
            if args.profile:
                with torch.set_grad_enabled(mode == "train"):
                    for variant in ("pytorch", "attention"):
                        profiled(f"{name} {mode} {variant}", steps[variant])


if __name__ == "__main__":
    main()
