"""A vendor library's TF32 switch set to one call's own choice while the call runs.

cuDNN and cuBLAS read PyTorch's process-wide switches (`torch.backends.cudnn.allow_tf32`,
`torch.backends.cuda.matmul.allow_tf32`), which say nothing of what a call of ours asked for
(`allow_tf32=`): the vendor path sets the library's switch for the call and puts it back.
Another thread's call in that window sees the value: PyTorch's convs and matmuls take no
per-call precision to pass instead.
"""

from __future__ import annotations

from typing import Any


class TF32:
    """`holder.allow_tf32` (`torch.backends.cudnn` or `torch.backends.cuda.matmul`) at `allow` inside
    the block; None, for a call of a dtype the switch does not apply to, leaves it alone."""

    def __init__(self, holder: Any, allow: bool | None) -> None:
        self.holder, self.allow = holder, allow

    def __enter__(self) -> None:
        if self.allow is not None:
            self.saved = self.holder.allow_tf32
            self.holder.allow_tf32 = self.allow

    def __exit__(self, *exc) -> None:
        if self.allow is not None:
            self.holder.allow_tf32 = self.saved
