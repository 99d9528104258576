"""Host time per call of attention on a small problem seen before: the fp8 fast path (scales given,
and left out) against bf16's, and fp8's checked path (checks, selection and plan on every call).

    python benchmarks/attention_fp8_host.py       (on a GPU)
"""

import tiledispatch  # noqa: I001  (first: it picks the backend)
import torch

from tiledispatch.bench.timing import host_us_per_call
from tiledispatch.core.dispatcher import default_dispatcher
from tiledispatch.ops.attention import AttentionOptions, check_operands


def main() -> None:
    q, k, v = (torch.randn(1, 8, 128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    s = torch.ones(1, device="cuda")
    d = default_dispatcher()
    calls = {
        "bf16": lambda: tiledispatch.attention(q, k, v),
        "fp8, scales given": lambda: tiledispatch.attention(q8, k8, v8, scale_q=s, scale_k=s, scale_v=s),
        "fp8, unit scales": lambda: tiledispatch.attention(q8, k8, v8),
        "fp8, checked path": lambda: d.run(check_operands(q8, k8, v8, options=AttentionOptions(), scale_q=s,
                                                          scale_k=s, scale_v=s)),
    }
    with torch.no_grad():
        for name, fn in calls.items():
            print(f"{name:20s} {host_us_per_call(fn):7.2f} us a call")


if __name__ == "__main__":
    main()
