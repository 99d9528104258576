"""Whole models with tiledispatch's ops against PyTorch, in the same run (issue 40 item 6).

Five torchvision CNNs at 224x224 (resnet50 32, convnext_tiny 32, mobilenet_v3_large 64,
regnet_y_1_6gf 32, resnext50_32x4d 32) and a transformers Llama-shaped decoder (hidden 2048,
8 layers, 16 heads, 4 KV heads, MLP 5632, vocab 32000): a prefill of 4 x 512 tokens into a fresh
KV cache, and a one-token decode over a 512-token cache; bf16, channels-last, random weights.
Ours: every nn.Conv2d calls `tiledispatch.conv`, every nn.Linear `tiledispatch.gemm` (the
weight's transposed view, the bias fused), and Llama's attention `tiledispatch.attention`
through transformers' attention interface. PyTorch: the same weights, its own modules.

Modes, both providers timed in the same run, in turns (bench.timing.interleaved_medians):
  eager    inference forward, host time included (CUDA events around back-to-back calls);
  graph    the forward captured once in a CUDA graph, replays timed;
  compile  torch.compile (default mode): ours against PyTorch's own compile of the same model;
  train    forward, cross-entropy loss and backward, no optimizer step; dropout and stochastic
           depth off in every mode, so that the gradients can be compared.
Correctness: each output (train: the logits and the gradients of three weights) against an
fp32 PyTorch model of the same weights (TF32 off): ours beside PyTorch's own bf16 error.
A mode that fails records a row with status "error: ..." and the run goes on.

    python benchmarks/models.py [--models resnet50,...,llama] [--modes eager,graph,train,compile]
        [--out DIR] [--budget-s 420] [--fresh] [--smoke]

Writes models.csv (long format, a row per model, mode and provider) and models_summary.json
(per model and mode the ratio PyTorch time / ours, and issue 40's targets with pass/fail).
Rows of an earlier run in DIR for (model, mode) pairs this run does not repeat are kept (--fresh
drops them): the default run and the compile runs add up to one table.
Time: timing costs a few seconds per model and mode (7 rounds of a ~40 ms sample per provider,
medians). Compiling is what is long: our kernels at first sight of each shape (cold kernel
cache) and torch.compile (tens of seconds per model and provider), hence compile is not a
default mode. Past --budget-s no new (model, mode) starts; the rest is recorded as skipped.
--smoke: a tiny CNN and a 1-layer Llama (on the CPU: fp32 against float64, the kernels under
Triton's interpreter), eager and train by default: the code path, not a measurement.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import gc
import importlib
import inspect
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = Path("benchmarks/results/h200")
CNN_BATCH = {"resnet50": 32, "convnext_tiny": 32, "mobilenet_v3_large": 64, "regnet_y_1_6gf": 32,
             "resnext50_32x4d": 32}
LLAMA_NAMES = ("llama_prefill", "llama_decode")
SMOKE_NAMES = ("tiny_cnn", "tiny_llama_prefill", "tiny_llama_decode")
MODES = ("eager", "graph", "compile", "train")  # the order they run in: train moves BatchNorm's statistics
DEFAULT_MODES = ("eager", "graph", "train")
PROVIDERS = ("pytorch", "tiledispatch")
FIELDS = ["model", "batch", "mode", "provider", "time_ms", "rel_error", "status", "gpu", "torch", "triton", "date"]
ERROR_FACTOR = 2.0  # ours may err up to this multiple of PyTorch's own low-precision error
ERROR_FLOOR = 1e-5  # below this an error is rounding noise, whatever PyTorch's own is


@dataclass(frozen=True)
class Setting:
    """Where and in what precision a run computes, and how long it samples."""
    device: str
    dtype: torch.dtype
    reference_dtype: torch.dtype
    image: int
    rounds: int
    sample_ms: float  # GPU time one timing sample aims at
    smoke: bool


GPU = Setting("cuda", torch.bfloat16, torch.float32, 224, 7, 40.0, False)
CPU_SMOKE = Setting("cpu", torch.float32, torch.float64, 8, 1, 0.0, True)  # the interpreter has no bf16 tl.dot
GPU_SMOKE = Setting("cuda", torch.bfloat16, torch.float32, 8, 1, 5.0, True)


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    tokens: int  # the prefill's length, and the decode's cache


LLAMA = LlamaShape(2048, 8, 16, 4, 5632, 32000, 4, 512)
TINY_LLAMA = LlamaShape(64, 1, 2, 1, 128, 128, 2, 8)  # head dim 32: the smallest attention takes


@dataclass(frozen=True)
class Workload:
    """A model and how to drive it: `build(setting)` gives it in the reference precision,
    `inputs(setting)` its inputs (floating ones in the run's dtype) and labels, and
    `session(model, runner, inputs)` a step: a callable running one forward through `runner`
    (the model, or its compiled form) that returns the output."""
    name: str
    batch: int
    modes: tuple[str, ...]
    build: Callable
    inputs: Callable
    session: Callable


def use_tiledispatch(model: nn.Module) -> int:
    """Turns every nn.Conv2d, nn.Linear (and Conv1d, Conv3d) of the model into tiledispatch.nn's,
    in place (tiledispatch.nn.patch): parameters, names and hooks stay. Returns how many modules
    now call tiledispatch."""
    import tiledispatch.nn
    tiledispatch.nn.patch(model)
    return sum(type(m).__module__ == "tiledispatch.nn" for m in model.modules())


class TinyCNN(nn.Sequential):
    """The smoke stand-in: a strided stem, a depthwise and a dilated grouped conv, a linear."""
    def __init__(self, classes: int = 10):
        super().__init__(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=4), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(16, classes))


def cnn(name: str, batch: int, classes: int) -> Workload:
    def build(setting):
        return TinyCNN(classes) if name == "tiny_cnn" else getattr(
            importlib.import_module("torchvision.models"), name)(weights=None)

    def inputs(setting):
        x = torch.randn(batch, 3, setting.image, setting.image, device=setting.device).to(setting.dtype)
        return {"x": x.contiguous(memory_format=torch.channels_last),
                "labels": torch.randint(0, classes, (batch,), device=setting.device)}
    return Workload(name, batch, MODES, build, inputs, lambda model, runner, i: lambda: runner(i["x"]))


def llama(name: str, shape: LlamaShape, decode: bool) -> Workload:
    def build(setting):
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                             num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                             num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
                             max_position_embeddings=4 * shape.tokens, tie_word_embeddings=False)
        config._attn_implementation = "sdpa"
        return LlamaForCausalLM(config)

    def inputs(setting):
        ids = torch.randint(0, shape.vocab, (shape.batch, shape.tokens + 1), device=setting.device)
        return {"ids": ids[:, :-1], "next": ids[:, -1:], "labels": ids[:, 1:]}
    modes = ("eager", "graph", "compile") if decode else MODES
    return Workload(name, shape.batch, modes, build, inputs, decode_session if decode else prefill_session)


def prefill_session(model, runner, inputs):
    """A prefill into a fresh cache, as a server's: given a cache, transformers builds no mask for
    either attention (without one it looks for packed sequences, which under a graph capture
    gives both a mask, and SDPA its slower masked kernel)."""
    return lambda: runner(input_ids=inputs["ids"], use_cache=True).logits


def decode_session(model, runner, inputs):
    """One token a sequence over a cache of the prefill's length: the cache comes from `model`'s own
    prefill, and each step crops the token it appended (crop(-1) removes one in every version)."""
    params = inspect.signature(model.forward).parameters
    keyword = "cache" if "cache" in params else "past_key_values"  # the name changed in transformers 5
    with torch.no_grad():
        out = model(input_ids=inputs["ids"], use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        if isinstance(cache, tuple):  # transformers 4's legacy form, where no cache was passed in
            cache = importlib.import_module("transformers").DynamicCache.from_legacy_cache(cache)
        model(input_ids=inputs["next"], use_cache=True, **{keyword: cache})
        cache.crop(-1)  # the cache as every step leaves it (views of a longer tensor): compile guards on it

    def step():
        logits = runner(input_ids=inputs["next"], use_cache=True, **{keyword: cache}).logits
        cache.crop(-1)
        return logits
    step.state = cache  # a graph capture keeps its tensors alive
    return step


def workloads(smoke: bool) -> dict[str, Workload]:
    if smoke:
        table = [cnn("tiny_cnn", 2, 10), llama(SMOKE_NAMES[1], TINY_LLAMA, False),
                 llama(SMOKE_NAMES[2], TINY_LLAMA, True)]
    else:
        table = [cnn(name, batch, 1000) for name, batch in CNN_BATCH.items()]
        table += [llama(LLAMA_NAMES[0], LLAMA, False), llama(LLAMA_NAMES[1], LLAMA, True)]
    return {w.name: w for w in table}


ATTENTION_CALLS = [0]  # attention calls that reached tiledispatch: each Llama mode checks that some did


def tiledispatch_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    """transformers' attention-interface signature: q (batch, heads, seq, dim), k and v with the KV
    heads (GQA as is); returns (batch, seq, heads, dim). With no mask the causal diagonal is the
    bottom-right one (the last query on the last key): right for a prefill and over a cache."""
    import tiledispatch
    if not torch.compiler.is_compiling():  # a traced count would be a guard, and a recompile every call
        ATTENTION_CALLS[0] += 1
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None:
        mask, causal = attention_mask[..., : key.shape[-2]], False
    else:
        mask, causal = None, "bottom_right" if causal and query.shape[-2] > 1 else False
    out = tiledispatch.attention(query, key, value, causal=causal, mask=mask, scale=scaling, dropout_p=dropout)
    return out.transpose(1, 2).contiguous(), None


def route_attention(model: nn.Module) -> None:
    """Registers the function as "tiledispatch" (with SDPA's mask builder, so that a padded batch
    still gets its mask) and sets the model to it."""
    import transformers
    name = "tiledispatch"
    if hasattr(transformers, "AttentionInterface"):
        transformers.AttentionInterface.register(name, tiledispatch_attention)
    else:  # older transformers: the module-level table
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        ALL_ATTENTION_FUNCTIONS[name] = tiledispatch_attention
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    except (ImportError, KeyError):
        pass
    try:
        model.set_attn_implementation(name)
    except (AttributeError, ValueError, KeyError, TypeError):
        model.config._attn_implementation = name


@dataclass
class Variants:
    """One workload's three models (same weights) and inputs; first_call_s gathers first calls."""
    reference: nn.Module
    pytorch: nn.Module
    ours: nn.Module
    inputs: dict
    reference_inputs: dict
    first_call_s: dict


def make_variants(work: Workload, setting: Setting, warmup: bool, backward: bool = False) -> Variants:
    """The three models and inputs; with `warmup`, tiledispatch.warmup compiles our model's picks
    first, its backward's too where `backward` (a training mode follows)."""
    torch.manual_seed(0)
    with torch.device(setting.device):
        reference = work.build(setting).to(setting.reference_dtype).eval()
    for module in reference.modules():  # off in training too: the gradients are compared
        if "Dropout" in type(module).__name__ or "StochasticDepth" in type(module).__name__:
            module.p = 0.0
    pytorch, ours = (copy.deepcopy(reference).to(setting.dtype) for _ in PROVIDERS)
    if not hasattr(reference, "config"):  # the CNNs
        for model in (reference, pytorch, ours):
            model.to(memory_format=torch.channels_last)
    if use_tiledispatch(ours) == 0:
        raise RuntimeError(f"{work.name} has no Conv2d or Linear to replace")
    if hasattr(ours, "config"):
        route_attention(ours)
    inputs = work.inputs(setting)
    reference_inputs = {k: v.to(setting.reference_dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    variants = Variants(reference, pytorch, ours, inputs, reference_inputs, {})
    tiledispatch = importlib.import_module("tiledispatch")
    if warmup and hasattr(tiledispatch, "warmup"):  # issue 40 item 5: compiles the picks ahead, in parallel
        start = time.perf_counter()
        try:
            tiledispatch.warmup(ours, inputs["x" if "x" in inputs else "ids"], backward=backward)
            variants.first_call_s["tiledispatch warmup"] = round(time.perf_counter() - start, 3)
        except Exception as error:
            variants.first_call_s["tiledispatch warmup"] = first_error_line(error)
    return variants


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def sampler(fn, setting: Setting):
    """A sampler of fn's time per call (ms): on the GPU CUDA events around as many back-to-back
    calls as fill setting.sample_ms; on the CPU the wall clock of one call."""
    if setting.device != "cuda":
        def wall() -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return wall
    from tiledispatch.bench.timing import event_sampler, time_call
    once = time_call(fn, on_gpu=True, repeats=2, warmup=1).median_ms
    return event_sampler(fn, max(1, min(10, round(setting.sample_ms / max(once, 1e-3)))))


def tensors_in(obj, depth: int = 4) -> list:
    """Every tensor reachable from obj through attributes, lists, tuples and dicts (a KV cache's)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth == 0:
        return []
    items = (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple))
             else getattr(obj, "__dict__", {}).values())
    return [t for item in list(items) for t in tensors_in(item, depth - 1)]


def graphed(step):
    """step captured in a CUDA graph after two warm-up calls on a side stream: the replay (which
    holds what the graph reads) and the graph's output, replayed once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    held = tensors_in(getattr(step, "state", None))  # a decode step's cache, which the replays read
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()  # a capture runs nothing: the output is the replay's

    def replay():
        graph.replay()
    replay.held = (graph, held, step)
    return replay, out


def first_error_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return "error: " + (text[0] if text else type(error).__name__)[:300]


def train_step(model, work: Workload, inputs: dict):
    """Forward, cross-entropy loss and backward, the gradients set to None first."""
    step = work.session(model, model, inputs)

    def run():
        for p in model.parameters():
            p.grad = None
        out = step()
        F.cross_entropy(out.float().flatten(0, -2), inputs["labels"].flatten()).backward()
        return out
    return run


def watched_parameters(model: nn.Module) -> list[str]:
    """The first, a middle and the last weight of the modules we replace: the gradients compared."""
    names = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    return sorted({names[0], names[len(names) // 2], names[-1]}, key=names.index) if names else []


def reference_of(mode: str, work: Workload, v: Variants):
    """The fp32 (smoke on the CPU: float64) output, and in train the watched gradients too."""
    if mode != "train":
        with torch.no_grad():
            return work.session(v.reference, v.reference, v.reference_inputs)().double(), {}
    v.reference.train()
    with torch.enable_grad():
        out = train_step(v.reference, work, v.reference_inputs)().detach().double()
    params = dict(v.reference.named_parameters())
    v.reference.eval()
    return out, {n: params[n].grad.double() for n in watched_parameters(v.reference)}


def provider_step(mode: str, work: Workload, model: nn.Module, inputs: dict):
    """The callable to time for one provider in one mode, and the output of its first call."""
    if mode == "train":
        model.train()
        run = train_step(model, work, inputs)
        return run, run()
    model.eval()
    step = work.session(model, torch.compile(model) if mode == "compile" else model, inputs)
    return graphed(step) if mode == "graph" else (step, step())


def error_of(model, out, ref_out, ref_grads) -> float:
    """The largest relative error of the output and of the watched gradients."""
    errors = [rel_error(out.detach(), ref_out)]
    params = dict(model.named_parameters())
    for name, grad in ref_grads.items():
        if params[name].grad is None:
            raise RuntimeError(f"no gradient reached {name}")
        errors.append(rel_error(params[name].grad, grad))
    return max(errors)


def run_mode(work: Workload, mode: str, v: Variants, setting: Setting) -> list[dict]:
    """Both providers in one mode: each checked against the reference, then timed in turns."""
    from tiledispatch.bench.timing import interleaved_medians
    ref_out, ref_grads = reference_of(mode, work, v)
    rows, samplers = {}, {}
    for provider, model in zip(PROVIDERS, (v.pytorch, v.ours)):
        rows[provider] = {"model": work.name, "batch": work.batch, "mode": mode, "provider": provider,
                          "time_ms": None, "rel_error": None, "status": "ok"}
        calls = ATTENTION_CALLS[0]
        try:
            with torch.set_grad_enabled(mode == "train"):
                start = time.perf_counter()
                fn, out = provider_step(mode, work, model, v.inputs)
                if setting.device == "cuda":
                    torch.cuda.synchronize()
                v.first_call_s.setdefault(f"{provider} {mode}", round(time.perf_counter() - start, 3))
                rows[provider]["rel_error"] = error_of(model, out, ref_out, ref_grads)
                if provider == "tiledispatch" and hasattr(model, "config") and ATTENTION_CALLS[0] == calls \
                        and mode != "compile":
                    raise RuntimeError("transformers did not route attention to tiledispatch")
                samplers[provider] = sampler(fn, setting)
        except Exception as error:  # recorded, and the run goes on
            rows[provider]["status"] = first_error_line(error)
            print(f"  {work.name} {mode} {provider}: {rows[provider]['status']}", file=sys.stderr, flush=True)
            if os.environ.get("MODELS_TRACEBACK"):
                traceback.print_exc()
    try:
        with torch.set_grad_enabled(mode == "train"):
            for provider, ms in interleaved_medians(samplers, setting.rounds).items():
                rows[provider]["time_ms"] = round(ms, 4)
    except Exception as error:
        for provider in samplers:
            rows[provider]["status"] = first_error_line(error)
    for p in (*v.pytorch.parameters(), *v.ours.parameters(), *v.reference.parameters()):
        p.grad = None
    return [rows[p] for p in PROVIDERS]


def skipped_rows(work: Workload, mode: str, why: str) -> list[dict]:
    return [{"model": work.name, "batch": work.batch, "mode": mode, "provider": p, "time_ms": None,
             "rel_error": None, "status": why} for p in PROVIDERS]


def run_workload(work: Workload, modes: list[str], setting: Setting, deadline: float, args, firsts: dict):
    modes = [m for m in MODES if m in modes and m in work.modes]
    if time.perf_counter() > deadline:
        return [row for m in modes for row in skipped_rows(work, m, "skipped: time budget (--budget-s)")]
    try:
        variants = make_variants(work, setting, not args.no_warmup, backward="train" in modes)
    except Exception as error:
        print(f"{work.name}: {first_error_line(error)}", file=sys.stderr, flush=True)
        return [row for m in modes for row in skipped_rows(work, m, first_error_line(error))]
    rows = []
    for mode in modes:
        if time.perf_counter() > deadline:
            rows += skipped_rows(work, mode, "skipped: time budget (--budget-s)")
            continue
        if mode == "graph" and setting.device != "cuda":
            rows += skipped_rows(work, mode, "skipped: CUDA graphs need a GPU")
            continue
        start = time.perf_counter()
        rows += run_mode(work, mode, variants, setting)
        if mode == "compile":
            torch._dynamo.reset()
        pt, ours = rows[-2], rows[-1]
        ratio = pt["time_ms"] / ours["time_ms"] if pt["time_ms"] and ours["time_ms"] else None
        print(f"{work.name:<20} {mode:<8} pytorch {pt['time_ms']} ms (err {fmt(pt['rel_error'])})  tiledispatch "
              f"{ours['time_ms']} ms (err {fmt(ours['rel_error'])})  ratio {fmt(ratio)}  "
              f"[{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)
    firsts[work.name] = variants.first_call_s
    del variants
    gc.collect()
    if setting.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def merged_rows(path: Path, rows: list[dict], fresh: bool) -> list[dict]:
    """This run's rows, after an earlier table's rows for the (model, mode) pairs it did not run."""
    if fresh or not path.exists():
        return rows
    ran = {(r["model"], r["mode"]) for r in rows}
    with path.open() as f:
        return [r for r in csv.DictReader(f) if (r["model"], r["mode"]) not in ran] + rows


def summarize(rows: list[dict]) -> dict:
    """Per model and mode: the ratio PyTorch / ours and both errors; then issue 40's targets."""
    from tiledispatch.bench.timing import geomean

    def number(x):
        return None if x in (None, "") else float(x)
    per: dict = {}
    for row in rows:
        entry = per.setdefault(row["model"], {}).setdefault(row["mode"], {})
        entry.update({f"{row['provider']}_ms": number(row["time_ms"]), f"status_{row['provider']}": row["status"],
                      f"rel_error_{row['provider']}": number(row["rel_error"])})
    entries = {f"{m} {mode}": e for m, modes in per.items() for mode, e in modes.items()}
    for e in entries.values():
        pt, ours = e.get("pytorch_ms"), e.get("tiledispatch_ms")
        e["ratio"] = round(pt / ours, 4) if pt and ours else None
        err, err_pt = e.get("rel_error_tiledispatch"), e.get("rel_error_pytorch")
        e["error_within_2x_of_pytorch"] = (None if err is None or err_pt is None
                                           else err <= max(ERROR_FACTOR * err_pt, ERROR_FLOOR))

    def target(mode_names, least):
        ratios = {k: e["ratio"] for k, e in entries.items() if k.rsplit(" ", 1)[1] in mode_names}
        below = sorted(k for k, r in ratios.items() if r is not None and r < least)
        missing = sorted(k for k, r in ratios.items() if r is None)
        return {"at_least": least, "ratios": ratios, "below": below, "not_measured": missing,
                "pass": bool(ratios) and not missing and not below}

    graph = target(("graph",), 1.0)
    graph_geomean = geomean(graph["ratios"].values())
    accuracy = {k: e["error_within_2x_of_pytorch"] for k, e in entries.items()}
    return {"models": per, "targets": {
        "eager_and_train_each_at_least_1.0x": target(("eager", "train"), 1.0),
        "cuda_graph_each_at_least_1.0x": graph,
        # A target of its own: the each-model target above says which model falls short.
        "cuda_graph_geomean_at_least_1.1x": {"geomean": graph_geomean, "at_least": 1.1,
                                             "pass": not graph["not_measured"] and (graph_geomean or 0) >= 1.1},
        "compile_each_at_least_1.0x_of_torch_compile": target(("compile",), 1.0),
        "error_within_2x_of_pytorch": {"entries": accuracy, "pass": bool(accuracy) and all(
            v is True for v in accuracy.values())},
    }}


def write_outputs(rows: list[dict], setting: Setting, args, firsts: dict, seconds: float) -> dict:
    import triton

    from tiledispatch.bench.results import record_run

    env = {"gpu": torch.cuda.get_device_name() if setting.device == "cuda" else "cpu (Triton interpreter)",
           "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path, summary_path = args.out / "models.csv", args.out / "models_summary.json"
    rows = merged_rows(path, [{**row, **env} for row in rows], args.fresh)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    old = json.loads(summary_path.read_text()) if summary_path.exists() and not args.fresh else {}
    summary = summarize(rows)
    summary["first_call_s"] = {**old.get("first_call_s", {}), **firsts}
    summary.update({**env, "command": "python " + " ".join(sys.argv), "seconds": round(seconds, 1),
                    "cudnn_benchmark": args.cudnn_benchmark, "smoke": setting.smoke,
                    "llama": asdict(TINY_LLAMA if setting.smoke else LLAMA)})
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    record_run(args.out, "models.csv")  # its rows into the folder's long-format table (results.parquet)
    return summary


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated: the five CNNs, llama_prefill, llama_decode "
                        "(llama: both); default all (--smoke: tiny_cnn, tiny_llama_prefill, tiny_llama_decode)")
    parser.add_argument("--modes", default="", help=f"comma-separated of {','.join(MODES)}; default "
                        f"{','.join(DEFAULT_MODES)} (--smoke: eager,train)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new (model, mode) after this many seconds; the rest is recorded as skipped")
    parser.add_argument("--fresh", action="store_true", help="drop the rows of an earlier run in --out")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    parser.add_argument("--no-warmup", action="store_true", help="skip tiledispatch.warmup where it exists")
    parser.add_argument("--smoke", action="store_true", help="tiny models (on the CPU: Triton's interpreter)")
    return parser.parse_args(argv)


def selected(args, table: dict) -> tuple[list[Workload], list[str]]:
    llamas = SMOKE_NAMES[1:] if args.smoke else LLAMA_NAMES
    names = [n for part in args.models.split(",") if part
             for n in (llamas if part in ("llama", "tiny_llama") else (part,))] or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; known: {', '.join(table)} (and llama)")
    modes = [m for m in args.modes.split(",") if m] or list(("eager", "train") if args.smoke else DEFAULT_MODES)
    if any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: {args.modes!r}; known: {', '.join(MODES)}")
    return [table[n] for n in names], modes


def main(argv=None) -> dict:
    args = parse(argv)
    if torch.cuda.is_available():
        setting = GPU_SMOKE if args.smoke else GPU
    elif args.smoke:
        setting = CPU_SMOKE
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: kernels on CPU tensors
    else:
        raise SystemExit("no CUDA GPU: run with --smoke for the CPU stand-in")
    importlib.import_module("tiledispatch")  # after TRITON_INTERPRET is set
    work, modes = selected(args, workloads(args.smoke))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows, firsts = [], {}
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:  # the fp32 reference is fp32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        for w in work:
            rows += run_workload(w, modes, setting, started + args.budget_s, args, firsts)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = flags
    summary = write_outputs(rows, setting, args, firsts, time.perf_counter() - started)
    print(json.dumps({k: v["pass"] for k, v in summary["targets"].items()}), file=sys.stderr)
    print(f"wrote {args.out / 'models.csv'} and models_summary.json in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()
