"""Attention's kernel families, one module each (`sdpa` and `bwd` hold two closely tied ones).
Importing this package registers them all in `config.FAMILIES`."""

from . import bwd, bwd_ws, fwd, fwd_tma, fwd_ws, sdpa  # noqa: F401  (each registers itself)
