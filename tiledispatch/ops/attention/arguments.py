"""The non-tensor arguments of `attention()`, read and checked: each refusal names the argument.

The kernels take the dropout seed and offset as signed 64-bit arguments (the seed is the
64-bit Philox key), window sides and sequence positions as 32-bit ones: what would not fit
is refused here rather than wrapped or truncated on its way to them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...core.args import INT64_MAX, as_bool, as_float, as_int
from ...core.errors import InvalidArgumentError, UnsupportedError
from .problem import MaskKind, Window

# The dropout seed is the Philox key, passed to the kernels as a signed 64-bit integer.
SEED_MAX = INT64_MAX

_CAUSAL_WORDS = {"top_left": MaskKind.CAUSAL_TOP_LEFT, "bottom_right": MaskKind.CAUSAL_BOTTOM_RIGHT}
_CAUSAL_KINDS = (MaskKind.NONE, MaskKind.CAUSAL_TOP_LEFT, MaskKind.CAUSAL_BOTTOM_RIGHT)
_CAUSAL_VALUES = "False, True (top-left, as torch SDPA), 'top_left' or 'bottom_right' (as FlashAttention)"


def tagged(rule: str, read: Callable[..., Any], *args, **kwargs) -> Any:
    """`read(*args, **kwargs)` (a core.args reader), its refusal prefixed by the rule's name."""
    try:
        return read(*args, **kwargs)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"[{rule}] {e}") from None


def parse_causal(causal: Any) -> MaskKind:
    """False or None, True (top-left, as torch SDPA), "top_left" or "bottom_right" (as FlashAttention)."""
    if causal is False or causal is None:
        return MaskKind.NONE
    if causal is True:
        return MaskKind.CAUSAL_TOP_LEFT
    if isinstance(causal, MaskKind):
        if causal in _CAUSAL_KINDS:
            return causal
        raise InvalidArgumentError(f"[causal] causal={causal} is not a causal mask; use {_CAUSAL_VALUES}, "
                                   "and window=(left, right) for a sliding window")
    if isinstance(causal, str):
        if causal in _CAUSAL_WORDS:
            return _CAUSAL_WORDS[causal]
        raise UnsupportedError(f"[causal] causal={causal!r}: use {_CAUSAL_VALUES}")
    if isinstance(causal, (bool, np.bool_)):
        return MaskKind.CAUSAL_TOP_LEFT if causal else MaskKind.NONE
    raise InvalidArgumentError(f"[causal] causal must be {_CAUSAL_VALUES}, got {causal!r} ({type(causal).__name__})")


def _window_side(value: Any, side: str) -> int:
    try:
        return as_int(value, f"window {side}", low=-1)
    except InvalidArgumentError:
        raise InvalidArgumentError(f"[window] window {side}={value!r} must be an integer >= 0, or -1 for "
                                   "unbounded") from None


def parse_window(window: Any) -> Window | None:
    """None (no window), a Window, or (left, right): keys beside the bottom-right diagonal, -1 unbounded."""
    if window is None or isinstance(window, Window):
        return window
    if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
        raise InvalidArgumentError(f"[window] window={window!r} must be (left, right): two integers, keys "
                                   "beside the diagonal, -1 unbounded")
    left, right = window
    return Window(_window_side(left, "left"), _window_side(right, "right"))


def dropout_probability(dropout_p: Any) -> float:
    if type(dropout_p) is float and 0.0 <= dropout_p < 1.0:
        return dropout_p  # the common call, without the reader
    p = tagged("dropout", as_float, dropout_p, "dropout_p", low=0.0, high=1.0)
    if p == 1.0:
        raise InvalidArgumentError("[dropout] dropout_p=1.0 must be in [0, 1): it would drop every key")
    return p


def dropout_seed(seed: Any) -> int:
    """A seed of the 64-bit Philox key, as the kernels take it: an integer in [0, 2**63 - 1]."""
    return tagged("dropout-seed", as_int, seed, "dropout_seed (the Philox key: an integer in [0, 2**63 - 1])",
                  low=0, high=SEED_MAX)


def dropout_offset(offset: Any) -> int:
    """The first Philox counter: an integer in [0, 2**63 - 1] (the counters of a call then follow it)."""
    return tagged("dropout-offset", as_int, offset, "dropout_offset (a Philox counter: an integer in "
                  "[0, 2**63 - 1])", low=0, high=INT64_MAX)


def checked_scale(scale: Any) -> Any:
    """None (1 / sqrt(head dim)), a finite real, or a one-element real tensor holding one (kept as
    given: the checked path reads it per call, the fast path never binds it)."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.dtype.is_floating_point:
            raise InvalidArgumentError(f"[scale] a tensor scale must hold one real floating value, got "
                                       f"{scale.dtype} of shape {tuple(scale.shape)}; or pass a Python float")
        tagged("scale", as_float, scale.item(), "scale")
        return scale
    return tagged("scale", as_float, scale, "scale")


def already_checked(causal, window, scale, softcap, dropout_p, seed, offset, needs_lse, deterministic) -> bool:
    """Whether every field is already of its checked type and in range: the common call (attention()
    builds its options from checked values) skips the readers, which cost microseconds a call."""
    return (type(causal) is MaskKind and causal is not MaskKind.SLIDING_WINDOW
            and (window is None or type(window) is Window)
            and (scale is None or (type(scale) is float and -math.inf < scale < math.inf))
            and (softcap is None or (type(softcap) is float and 0.0 < softcap < math.inf))
            and type(dropout_p) is float and 0.0 <= dropout_p < 1.0
            and type(seed) is int and 0 <= seed <= SEED_MAX and type(offset) is int and 0 <= offset <= INT64_MAX
            and (needs_lse is True or needs_lse is False) and (deterministic is True or deterministic is False))


def checked_options(causal, window, scale, softcap, dropout_p, seed, offset, needs_lse, deterministic) -> dict:
    """AttentionOptions' fields, read and checked (operands.AttentionOptions calls this on construction).

    `scale` is any finite real (a negative one flips the scores; the plan handles it); `softcap`
    None (off) or a finite positive cap."""
    return {
        "causal": parse_causal(causal), "window": parse_window(window),
        "scale": checked_scale(scale),
        "softcap": None if softcap is None else tagged("softcap", as_float, softcap, "softcap (None: off)",
                                                       low=0.0, low_open=True),
        "dropout_p": dropout_probability(dropout_p), "dropout_seed": dropout_seed(seed),
        "dropout_offset": dropout_offset(offset), "needs_lse": as_bool(needs_lse, "needs_lse (return_lse)"),
        "deterministic": as_bool(deterministic, "deterministic"),
    }
