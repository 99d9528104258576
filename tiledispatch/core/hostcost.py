"""Host time against device time: which pick a call runs where its host time is exposed.

The ranking orders kernels by their time on the device. A call of one of our Triton kernels
costs the host more than the vendor's call through PyTorch: our replay and launch, or our
autograd node, against PyTorch's C++ ones (`calibration.eager_call_host_s` for an eager call,
`calibration.compiled_call_host_s` for a call inside a compiled graph, and
`calibration.recorded_call_host_s` for a call autograd records, whose twin's forward and
backward both run in Python: there the three directions' savings add up against it,
`native_for_recorded`). A program bound by its
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

__all__ = ["ByCapture", "capturing", "eager_host_s", "eager_pick", "for_eager", "native_for_recorded",
           "recorded_host_s", "weighed"]


def weighed(dispatcher, problem, spec, host_s: float):
    """`spec` (the dispatcher's pick for `problem`), or the vendor's candidate where `spec` is not
    expected to save `host_s` seconds of device time over it."""
    if host_s <= 0 or spec.is_vendor:
        return spec
    against = _against_vendor(dispatcher, problem, spec)
    return spec if against is None or against[1] > host_s else against[0]


def _against_vendor(dispatcher, problem, spec):
    """(the vendor's candidate, the device seconds `spec` is expected to save over it), or None where
    there is no vendor candidate or no estimate of either."""
    ranked = dispatcher.ranked(problem)
    vendor = next((c for c in ranked if c.spec.is_vendor), None)
    pick = next((c for c in ranked if c.spec.name == spec.name), None)
    if vendor is None or pick is None:
        return None
    vendor_us, pick_us = (c.score.terms.get("modelled_us") if c.score is not None else None for c in (vendor, pick))
    if vendor_us is None or pick_us is None:
        return None
    return vendor.spec, (vendor_us - pick_us) * 1e-6


def native_for_recorded(dispatcher, problems, device) -> bool | None:
    """Whether an eager call that autograd records, whose forward and gradients pose `problems`, runs
    PyTorch's own op (its autograd in C++): None where it does not, and our op's twin runs it; else
    whether a pick of ours was weighed away (a CUDA graph capture then runs the twin, which replays
    the device's picks, and those are loaded now: a capture loads no kernel).

    The twin costs the host `calibration.recorded_call_host_s` over PyTorch's op, once for the
    forward and backward together, so the picks' savings over the vendor add up against it."""
    host_s = recorded_host_s(dispatcher)
    picks = [(problem, dispatcher.select(problem, device=device)) for problem in problems]
    ours = [(problem, pick) for problem, pick in picks if not pick.is_vendor]
    saving = 0.0
    for problem, pick in ours:
        against = None if host_s <= 0 else _against_vendor(dispatcher, problem, pick)
        if against is None:
            return None
        saving += against[1]
    if ours and saving > host_s:
        return None
    for problem, pick in ours:
        _load_ahead(dispatcher, problem, pick)
    return bool(ours)


def eager_host_s(dispatcher) -> float:
    """The host time an eager call of ours costs over the vendor's on this dispatcher's arch; 0 on
    Triton's interpreter, whose kernels' time is the host's own and no estimate holds."""
    arch = dispatcher.arch
    return 0.0 if arch.is_interpreter else arch.calibration.eager_call_host_s


def recorded_host_s(dispatcher) -> float:
    """The host time a call through our op's autograd twin costs over PyTorch's op on this
    dispatcher's arch; 0 on Triton's interpreter, as `eager_host_s`."""
    arch = dispatcher.arch
    return 0.0 if arch.is_interpreter else arch.calibration.recorded_call_host_s


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
        _load_ahead(dispatcher, problem, pick)
    return pick, eager


def _load_ahead(dispatcher, problem, pick) -> None:
    """Loads a pick a graph capture runs; one that fails is left to the capture's own call, which
    selects past a kernel that fails."""
    try:
        dispatcher.load_for(problem, pick)
    except (BuildError, CacheError):
        log.debug("kernel %s did not load ahead of a capture", pick.name, exc_info=True)


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
