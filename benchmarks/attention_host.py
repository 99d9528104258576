"""Host time of a dispatched attention call on a tiny problem, beside SDPA cuDNN (GPU).

B1 H1 S128 D128 bf16, in BHSD and BSHD storage; the GPU work is a few microseconds, so
back-to-back calls are paced by the host (tiledispatch.bench.timing.host_us_per_call).
For each layout, (a) the inference forward (no grad) and (b) forward+backward (leaves
requiring grad, `out.backward(g)`), for:
  - ours: tiledispatch.attention with the default dispatcher's picks;
  - ours, Triton forced: `kernel=` (and `backward_kernel=`) the rules' best Triton kernels;
  - ours, cuDNN forced: the sdpa-cudnn candidates;
  - SDPA cuDNN: F.scaled_dot_product_attention inside one sdpa_kernel([CUDNN_ATTENTION])
    context entered outside the timed loop (and, for reference, entered per call).
Then the layers on BHSD: of our inference forward (its signature, the memo lookup, the bound
call, a bare torch.empty), and of forward+backward (the forward that builds the graph, the
backward's signature and bound call, the bare cuDNN backward op).

    python benchmarks/attention_host.py --out benchmarks/results/h200/attention_host.json [--profile]

`--profile` adds a cProfile of 500 inference forwards (top 20 by cumulative time).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledispatch
from tiledispatch.bench.timing import host_us_per_call, profiled
from tiledispatch.core.dispatcher import default_dispatcher
from tiledispatch.ops.attention import AttentionOptions, Direction, Family, check_operands, fastpath, vendor

SHAPE = (1, 1, 128, 128)  # batch, heads, seqlen, head dim
DTYPE = torch.bfloat16
CALLS, WARMUP = 3000, 200  # the warm-up also compiles (or loads) each kernel once


def make(layout: str, grad: bool) -> torch.Tensor:
    b, h, s, d = SHAPE
    if layout == "bshd":
        t = torch.randn(b, s, h, d, device="cuda", dtype=DTYPE).transpose(1, 2)
    else:
        t = torch.randn(b, h, s, d, device="cuda", dtype=DTYPE)
    return t.requires_grad_(grad)


def picks(dispatcher, q, k, v) -> dict[str, str | None]:
    """The dispatcher's pick, the best Triton kernel and the cuDNN candidate, per problem:
    the inference forward, the training forward (keeps the LSE) and the backward."""
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    problems = {
        "fwd": check_operands(q, k, v).problem,
        "train_fwd": check_operands(q, k, v, options=AttentionOptions(needs_lse=True)).problem,
        "bwd": check_operands(q, k, v, direction=Direction.BACKWARD, out=out, lse=lse, grad_out=out).problem,
    }
    found = {}
    for name, problem in problems.items():
        ranked = dispatcher.explain(problem).ranked
        found[name] = ranked[0].spec.name if ranked else None
        found[f"{name}_triton"] = next((c.spec.name for c in ranked if not c.spec.config.family.is_vendor), None)
        found[f"{name}_cudnn"] = next((c.spec.name for c in ranked if c.spec.config.family is Family.SDPA_CUDNN),
                                      None)
    return found


def cases(layout: str, names: dict) -> list[tuple[str, str, str, object]]:
    """(mode, provider, kernels, call) rows for one layout."""
    q, k, v = make(layout, False), make(layout, False), make(layout, False)
    qg, kg, vg = make(layout, True), make(layout, True), make(layout, True)
    g = torch.randn_like(qg)
    rows = []

    def inference(**kw):
        return lambda: tiledispatch.attention(q, k, v, **kw)

    def training(**kw):
        def run():
            tiledispatch.attention(qg, kg, vg, **kw).backward(g)
        return run

    rows.append(("fwd", "ours", f"{names['fwd']}", inference()))
    rows.append(("fwd+bwd", "ours", f"{names['train_fwd']} + {names['bwd']}", training()))
    if names["fwd_triton"]:
        rows.append(("fwd", "ours, Triton forced", names["fwd_triton"], inference(kernel=names["fwd_triton"])))
    if names["train_fwd_triton"] and names["bwd_triton"]:
        rows.append(("fwd+bwd", "ours, Triton forced", f"{names['train_fwd_triton']} + {names['bwd_triton']}",
                     training(kernel=names["train_fwd_triton"], backward_kernel=names["bwd_triton"])))
    if names["fwd_cudnn"]:
        rows.append(("fwd", "ours, cuDNN forced", names["fwd_cudnn"], inference(kernel=names["fwd_cudnn"])))
    if names["train_fwd_cudnn"] and names["bwd_cudnn"]:
        rows.append(("fwd+bwd", "ours, cuDNN forced", f"{names['train_fwd_cudnn']} + {names['bwd_cudnn']}",
                     training(kernel=names["train_fwd_cudnn"], backward_kernel=names["bwd_cudnn"])))

    def sdpa_fwd():
        F.scaled_dot_product_attention(q, k, v)

    def sdpa_train():
        F.scaled_dot_product_attention(qg, kg, vg).backward(g)

    def sdpa_fwd_context_per_call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v)

    rows.append(("fwd", "SDPA cuDNN", "sdpa_kernel outside the loop", sdpa_fwd))
    rows.append(("fwd+bwd", "SDPA cuDNN", "sdpa_kernel outside the loop", sdpa_train))
    rows.append(("fwd", "SDPA cuDNN, context per call", "sdpa_kernel per call", sdpa_fwd_context_per_call))
    return rows


def time_rows(layout: str, rows) -> list[dict]:
    results = []
    for mode, provider, kernels, call in rows:
        if provider.startswith("SDPA cuDNN") and "per call" not in provider:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                us = host_us_per_call(call, calls=CALLS, warmup=WARMUP)
        else:
            us = host_us_per_call(call, calls=CALLS, warmup=WARMUP)
        results.append({"layout": layout, "mode": mode, "provider": provider, "kernels": kernels,
                        "host_us": round(us, 2)})
        print(f"{layout:5s} {mode:8s} {provider:30s} {us:8.1f} us   {kernels}", flush=True)
    return results


def layers(dispatcher) -> list[dict]:
    """Where our inference forward's host time goes (BHSD), layer by layer."""
    q, k, v = make("bhsd", False), make("bhsd", False), make("bhsd", False)
    tiledispatch.attention(q, k, v)
    options = AttentionOptions()
    key = fastpath.forward_key(q, k, v, (None,) * 4, options, None)
    bound = dispatcher.memo(("attention", key), lambda: None)
    rows = {
        "tiledispatch.attention": lambda: tiledispatch.attention(q, k, v),
        "  AttentionOptions()": lambda: AttentionOptions(),
        "  fastpath.forward_key": lambda: fastpath.forward_key(q, k, v, (None,) * 4, options, None),
        "  dispatcher.memo": lambda: dispatcher.memo(("attention", key), lambda: None),
        f"  bound call ({type(bound).__name__})": lambda: bound(q, k, v, None, None, None, None, 0, 0),
        "  torch.empty (out)": lambda: torch.empty_like(q),
    }
    rows.update(training_layers(dispatcher))
    results = []
    for name, fn in rows.items():
        us = host_us_per_call(fn, calls=CALLS, warmup=WARMUP)
        results.append({"layer": name.strip(), "host_us": round(us, 2)})
        print(f"{name:45s} {us:8.2f} us", flush=True)
    return results


def training_layers(dispatcher) -> dict:
    """Forward+backward split (BHSD): the forward that builds the graph, then the backward's
    bound call and the bare cuDNN backward op on the same saved tensors, beside SDPA's forward."""
    qg, kg, vg = make("bhsd", True), make("bhsd", True), make("bhsd", True)
    g = torch.randn_like(qg)
    tiledispatch.attention(qg, kg, vg).backward(g)  # binds the forward and the backward
    out, lse = tiledispatch.attention(qg, kg, vg, return_lse=True)
    q, k, v, out = qg.detach(), kg.detach(), vg.detach(), out.detach()
    options = AttentionOptions(needs_lse=True)
    key = fastpath.backward_key(q, k, v, out, lse, g, (None,) * 4, options, None, False)
    bound = dispatcher.memo(("attention", key), lambda: None)
    scale = q.shape[-1] ** -0.5
    rows = {
        "training forward (graph built, no backward)": lambda: tiledispatch.attention(qg, kg, vg),
        "  SDPA cuDNN training forward": lambda: _sdpa_cudnn(qg, kg, vg),
        "  AttentionOptions(needs_lse=True)": lambda: AttentionOptions(needs_lse=True),
        "  fastpath.backward_key": lambda: fastpath.backward_key(q, k, v, out, lse, g, (None,) * 4, options, None,
                                                                 False),
    }
    if bound is not None:
        rows[f"  backward bound call ({type(bound).__name__})"] = lambda: bound(q, k, v, None, None, None, None, 0, 0,
                                                                                out, lse, g)
    rows["  bare cuDNN backward op"] = lambda: vendor.cudnn_backward_op(g, q, k, v, out, lse.unsqueeze(-1), scale,
                                                                         False)
    return rows


def _sdpa_cudnn(q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v)


def profile() -> None:
    q, k, v = make("bhsd", False), make("bhsd", False), make("bhsd", False)
    for _ in range(WARMUP):
        tiledispatch.attention(q, k, v)
    torch.cuda.synchronize()
    stats, _ = profiled(lambda: tiledispatch.attention(q, k, v), 500)
    stats.sort_stats("cumulative").print_stats(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write (or a folder for it)")
    parser.add_argument("--profile", action="store_true", help="also cProfile 500 inference forwards")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_host.py times host work against a GPU; no CUDA device is visible")
    dispatcher = default_dispatcher()
    names = picks(dispatcher, make("bhsd", False), make("bhsd", False), make("bhsd", False))
    print("picks:", json.dumps(names, indent=1))
    results = []
    for layout in ("bhsd", "bshd"):
        results += time_rows(layout, cases(layout, names))
    layer_rows = layers(dispatcher)
    out = args.out / "attention_host.json" if args.out.is_dir() else args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "problem": {"batch": SHAPE[0], "heads": SHAPE[1], "seqlen": SHAPE[2], "head_dim": SHAPE[3], "dtype": "bf16"},
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "picks": names, "rows": results, "layers": layer_rows,
    }, indent=1) + "\n")
    print("wrote", out)
    if args.profile:
        profile()


if __name__ == "__main__":
    main()
