"""The conv kernel families, one module each; importing this package registers them all in
`signature.FAMILIES` (the op's shared code finds a config's family there).

| family       | module         | config type          | kernel file(s)                          |
| ------------ | -------------- | -------------------- | --------------------------------------- |
| igemm        | igemm.py       | ImplicitGemmConfig   | kernels/implicit_gemm.py                |
| igemm-flat   | igemm_flat.py  | ImplicitGemmConfig   | kernels/implicit_gemm_flat.py           |
| igemm-tma    | igemm_tma.py   | TmaConfig            | kernels/implicit_gemm_tma.py            |
| direct       | direct.py      | DirectConfig         | kernels/direct.py                       |
| toeplitz     | toeplitz.py    | ToeplitzConfig       | kernels/toeplitz.py                     |
| gemm         | pointwise.py   | PointwiseConfig      | the GEMM op (../pointwise.py calls it)  |
| vendor       | vendor.py      | VendorConfig         | cuDNN (../vendor.py calls it)           |

implicit_gemm.py holds what igemm and igemm-flat share (their config type, its rules and GEMM
model); direct_window.py the direct family's sliding-window kernels.
"""

from . import direct, igemm, igemm_flat, igemm_tma, pointwise, toeplitz, vendor

__all__ = ["direct", "igemm", "igemm_flat", "igemm_tma", "pointwise", "toeplitz", "vendor"]
