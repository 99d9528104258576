"""Attention with a mask tensor, as transformers passes one under torch.compile (GPU): for a Llama
prefill and decode (GQA, bf16), in turns under CUDA graphs, our attention with the bool mask (its
pick and each masked Triton config the rules rank first), ours with the causal flag instead,
PyTorch SDPA with the mask (GQA as given, and K/V repeated), and cuDNN's private op with the mask as
an additive bias. Then what each SDPA backend does with the mask, and with rows that see no key.

    python benchmarks/studies/attention_masked.py [--calls 20] [--rounds 15]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch.bench.selections import selections
from tiledispatch.bench.timing import graph_sampler, interleaved_medians

# (batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim): benchmarks/models.py's Llama shape
CASES = {"prefill": (4, 16, 4, 512, 512, 128), "decode": (4, 16, 4, 1, 512, 128)}


def reference(q, k, v, mask):
    """fp32 attention with the bool mask; rows that see no key give 0."""
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = (q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    return p @ v


def as_bias(mask, like):
    return torch.zeros((), dtype=like.dtype, device=like.device).masked_fill(~mask, float("-inf")).expand(
        mask.shape[0], like.shape[1], *mask.shape[2:])


def cudnn(q, k, v, bias):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False, 0.0, False, False)[0]


def error(got, ref):
    got = got.float()
    return f"nan {int(got.isnan().sum())}, max err {float((got.nan_to_num(99) - ref).abs().max()):.3g}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    for name, (b, hq, hkv, sq, skv, d) in CASES.items():
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        rows = torch.arange(sq, device="cuda")[:, None] + (skv - sq)
        mask = (torch.arange(skv, device="cuda")[None, :] <= rows).expand(b, 1, sq, skv).contiguous()
        kr, vr = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        bias = as_bias(mask, q)
        ref = reference(q, k, v, mask)
        fns = {
            "ours mask": lambda: tiledispatch.attention(q, k, v, mask=mask),
            "ours causal flag": lambda: tiledispatch.attention(q, k, v, causal="bottom_right" if sq > 1 else False),
            "sdpa mask gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
            "sdpa mask kv repeated": lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask),
            "cudnn bias": lambda: cudnn(q, k, v, bias),
            "cudnn bias made each call": lambda: cudnn(q, k, v, as_bias(mask, q)),
        }
        masked, flagged = (" > ".join(selections(fns[label])) for label in ("ours mask", "ours causal flag"))
        print(f"{name} {(b, hq, hkv, sq, skv, d)}: ours picks {masked} with the mask, {flagged} with the flag")
        samplers = {}
        for label, fn in fns.items():
            try:
                print(f"  {label}: {error(fn(), ref)}")
                samplers[label] = graph_sampler(lambda _, fn=fn: fn(), [None], args.calls)
            except Exception as e:  # noqa: BLE001  (a study: say it and go on)
                print(f"  {label}: {type(e).__name__}: {str(e)[:300]}")
        times = interleaved_medians(samplers, args.rounds)
        print("  " + "  ".join(f"{p} {t * 1e3:.1f} us" for p, t in times.items()))
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION):
            for label, (kk, vv, gqa) in {"gqa": (k, v, True), "repeated": (kr, vr, False)}.items():
                try:
                    with sdpa_kernel([backend]):
                        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=gqa)
                    print(f"  {backend.name} {label}: {error(out, ref)}")
                except Exception as e:  # noqa: BLE001
                    print(f"  {backend.name} {label}: {type(e).__name__}: {str(e)[:160]}")
        dead = mask.clone()
        dead[0, 0, 0] = False  # batch 0's first query sees no key
        ref_dead = reference(q, k, v, dead)
        for label, fn in {"cudnn bias": lambda: cudnn(q, k, v, as_bias(dead, q)),
                          "sdpa mask gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dead,
                                                                                  enable_gqa=True),
                          "ours": lambda: tiledispatch.attention(q, k, v, mask=dead)}.items():
            try:
                out = fn()
                print(f"  a row that sees no key, {label}: that row {out[0, :, 0].float().abs().max().item()!r} "
                      f"(nan: {bool(out[0, :, 0].isnan().any())}); the rest {error(out, ref_dead)}")
            except Exception as e:  # noqa: BLE001
                print(f"  a row that sees no key, {label}: {type(e).__name__}: {str(e)[:160]}")


if __name__ == "__main__":
    main()
