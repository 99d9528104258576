"""The dropout keep mask as the kernels draw it, materialised: for tests, and users who want to see it."""

from __future__ import annotations

import torch

from ...core.args import as_int
from ...core.arith import cdiv
from ...core.runtime import interpreting
from .arguments import dropout_offset, dropout_probability, dropout_seed
from .problem import check_seqlen_limit


def keep_mask(batch: int, heads_q: int, seqlen_q: int, seqlen_kv: int, dropout_p: float, seed: int,
              offset: int = 0, device="cpu") -> torch.Tensor:
    """(batch, heads_q, seqlen_q, seqlen_kv) bool: True where dropout keeps the (query, key) pair.

    For varlen, seqlen_q/kv are the longest sequences and sequence b uses [b, :, :len_q, :len_kv].
    Runs Triton's JIT (or the interpreter) directly: this is a debugging aid, not a hot path.
    """
    dropout_p, seed, offset = dropout_probability(dropout_p), dropout_seed(seed), dropout_offset(offset)
    sizes = {"batch": batch, "heads_q": heads_q, "seqlen_q": seqlen_q, "seqlen_kv": seqlen_kv}
    batch, heads_q, seqlen_q, seqlen_kv = (as_int(n, name, low=1) for name, n in sizes.items())
    check_seqlen_limit(seqlen_q, seqlen_kv)
    from .kernels.scores import dropout_mask  # the kernels' module: Triton's import comes with it

    keep = torch.empty((batch, heads_q, seqlen_q, seqlen_kv), dtype=torch.uint8, device=device)
    block_m, block_n = 16, 64
    with interpreting():  # the interpreter runs one kernel at a time
        dropout_mask[(cdiv(seqlen_q, block_m), batch * heads_q)](
            keep, seed, offset, heads_q, seqlen_q, seqlen_kv, dropout_p, BLOCK_M=block_m, BLOCK_N=block_n)
    return keep.bool()
