"""Host time against device time: which pick a call runs where its host time is exposed.

The ranking orders kernels by their time on the device. A call of one of our Triton kernels
costs the host more than the vendor's call through PyTorch: our replay and launch, or our
autograd node, against PyTorch's C++ ones (`calibration.eager_call_host_s` for an eager call,
`calibration.compiled_call_host_s` for a call inside a compiled graph). A program bound by its
host (an eager model at a small batch, a compiled graph launched without CUDA graphs) pays that
time on every call, while a device saving counts only where the GPU is the bound. So where the
host is exposed, a pick that is not the vendor's is kept only where it is expected to save more
device time than it costs the host, which is the pick that minimises their sum, and the vendor
runs elsewhere. A CUDA graph's replays have no host time: a capture runs the device's pick
(`ByCapture`).

The saving is the analytic estimates every candidate carries (`modelled_us`), whatever ranked
them. Where there is no vendor candidate or no estimate, the pick stays. A vendor's cliff that
the estimates know (cuDNN's 3-D depthwise backward-weight: 50 ms where a kernel of ours takes
85 us, ops/conv/families/vendor.py) is a saving far above any host time, so its pick stays.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from .errors import BuildError, CacheError

log = logging.getLogger("tiledispatch.dispatcher")

__all__ = ["ByCapture", "capturing", "eager_host_s", "eager_pick", "for_eager", "weighed"]


def weighed(dispatcher, problem, spec, host_s: float):
    """`spec` (the dispatcher's pick for `problem`), or the vendor's candidate where `spec` is not
    expected to save `host_s` seconds of device time over it."""
    if host_s <= 0 or spec.is_vendor:
        return spec
    ranked = dispatcher.ranked(problem)
    vendor = next((c for c in ranked if c.spec.is_vendor), None)
    pick = next((c for c in ranked if c.spec.name == spec.name), None)
    if vendor is None or pick is None:
        return spec
    vendor_us, pick_us = (c.score.terms.get("modelled_us") if c.score is not None else None for c in (vendor, pick))
    if vendor_us is None or pick_us is None:
        return spec
    return spec if (vendor_us - pick_us) * 1e-6 > host_s else vendor.spec


def eager_host_s(dispatcher) -> float:
    """The host time an eager call of ours costs over the vendor's on this dispatcher's arch; 0 on
    Triton's interpreter, whose kernels' time is the host's own and no estimate holds."""
    arch = dispatcher.arch
    return 0.0 if arch.is_interpreter else arch.calibration.eager_call_host_s


def for_eager(dispatcher, problem, spec):
    """What an eager call runs where the dispatcher picks `spec`: `weighed` by an eager call's host time."""
    return weighed(dispatcher, problem, spec, eager_host_s(dispatcher))


def eager_pick(dispatcher, problem, device):
    """(the dispatcher's pick, the one an eager call runs) for `problem`. Where they differ, the pick
    is loaded now: a graph capture runs it, and loads no kernel while it captures. A pick that
    fails to load here is left to the capture's own call, which selects past a kernel that fails."""
    pick = dispatcher.select(problem, device=device)
    eager = for_eager(dispatcher, problem, pick)
    if eager is not pick:
        try:
            dispatcher.load_for(problem, pick)
        except (BuildError, CacheError):
            log.debug("kernel %s did not load ahead of a capture", pick.name, exc_info=True)
    return pick, eager


def _never() -> bool:
    return False


# torch's raw query: its Python wrapper is one more frame on every call that asks. A PyTorch built
# without CUDA captures nothing (and its query raises).
capturing: Callable[[], bool] = (getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                                         torch.cuda.is_current_stream_capturing)
                                 if torch.backends.cuda.is_built() else _never)


class ByCapture:
    """A signature's two bound calls: eager code runs the one cheapest in host and device time
    together, a CUDA graph capture the one fastest on the device (its replays have no host time).

    Both are loaded when the signature is first seen, so a capture never loads a kernel.
    """

    def __init__(self, eager: Callable[..., Any], replayed: Callable[..., Any]) -> None:
        self.eager, self.replayed = eager, replayed

    def __call__(self, *args):
        return (self.replayed if capturing() else self.eager)(*args)
