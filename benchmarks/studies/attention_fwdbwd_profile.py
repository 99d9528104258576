"""Forward+backward through the dispatcher (cuDNN both ways) beside SDPA's cuDNN backend:
times sampled in turns, then the kernels each one launches (torch.profiler), to tell the
dispatcher's own cost apart from the GPU clock's drift.

    python benchmarks/studies/attention_fwdbwd_profile.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile, ProfilerActivity

import tiledispatch
from tiledispatch.bench.timing import event_sampler, interleaved_medians

for (b, h, s, d) in ((16, 16, 2048, 64), (4, 32, 4096, 128)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    g = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)

    def ours():
        return torch.autograd.grad(tiledispatch.attention(q, k, v), (q, k, v), g)

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), g)

    for fn in (ours, sdpa):
        fn()
        fn()
    torch.cuda.synchronize()
    med = interleaved_medians({"ours": event_sampler(ours, 5), "sdpa": event_sampler(sdpa, 5)}, 9)
    flops = 4 * b * h * s * s * d * 3.5
    print((b, h, s, d), {k: f"{v:.4f} ms {flops / v / 1e9:.0f} TFLOP/s" for k, v in med.items()},
          "ratio", med["sdpa"] / med["ours"], flush=True)
    for name, fn in (("ours", ours), ("sdpa", sdpa)):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=90)
        print(f"--- {name} {(b, h, s, d)}\n{table}", flush=True)
