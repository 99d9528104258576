"""The GEMM kernel families, one module each; importing this package registers them all in
`family.FAMILIES` (the op's shared rules, ranking, plan and rule sets find a config's family there).

| family         | module             | kernel file                              |
| -------------- | ------------------ | ---------------------------------------- |
| tiled          | tiled.py           | kernels/tiled.py                         |
| tma-persistent | tma_persistent.py  | kernels/tma_persistent.py                |
| stream-k       | stream_k.py        | kernels/stream_k.py                      |
| ws-persistent  | ws_persistent.py   | kernels/ws_persistent.py                 |
| ws-pingpong    | ws_pingpong.py     | kernels/ws_pingpong.py                   |
| gemv           | gemv.py            | kernels/gemv.py                          |
| vendor         | vendor.py          | ../vendor.py (cuBLAS through PyTorch)    |

Every family but the vendor's takes GemmConfig; the vendor's, VendorConfig. realign.py is no
family of its own but the realign variant each Triton family registers through (`variant`):
a config with ``realign=True`` copies unaligned operands (kernels/realign.py) around its twin.
stream-k builds on tma_persistent.py (`main_unit`), ws-pingpong on ws_persistent.py.
"""

from . import gemv, stream_k, tiled, tma_persistent, vendor, ws_persistent, ws_pingpong

__all__ = ["gemv", "stream_k", "tiled", "tma_persistent", "vendor", "ws_persistent", "ws_pingpong"]
