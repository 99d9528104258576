"""Where torch.compile's inductor meets a call the dispatcher gives the vendor, PyTorch's own op.

Under torch.compile each tiledispatch op is a custom op: inductor calls it from its generated code,
through the dispatcher and our fast path, which costs 40-60 us of host time a call more than the
aten call inductor makes for PyTorch's own conv (results/h200/compile_probe.txt). Where the pick is
the vendor library, that call is all the op does: here each op's decomposition, which inductor
applies while it traces the graph, poses the traced call's problem (from the fake tensors' shapes,
strides and dtype) and, where the default dispatcher picks the vendor for it, gives the aten op
PyTorch's compile would have given (conv's forward and both gradients, GEMM's 2-D product, an
attention forward that SDPA can pose and that keeps no LSE); inductor then lowers it as its own
(cuDNN's conv, cuBLAS's mm, SDPA's attention).
Without CUDA graphs the compiled graph is launched from the host, and a kept call costs it more than
inductor's aten call does (`calibration.compiled_call_host_s`), so conv's forward and GEMM's product
also become aten where the pick is not expected to save that much device time (`saves_its_call`).
Conv's gradients are not weighed here (eager calls weigh them: core.hostcost): no compiled training
step has been profiled, and cuDNN's known cliff there (a 3-D depthwise backward-weight of 50 ms
where a kernel of ours takes 85 us) is in the estimates as one fitted stretch only.
Any other pick, a forced kernel, another dispatcher or symbolic sizes keep the custom op, whose
kernel selects at run time as before.

Each op's library module registers its decomposition here (`decomposes`); the first trace of any op
(its fake implementation, `register`) hands them all to inductor's table. Importing inductor's table
costs a second, which only a process that compiles pays, once. Decisions are memoised per traced
signature in the dispatcher's memo, as the eager paths' are. Inductor's caches key on the graph,
not on the picks: a compiled graph taken from them keeps the decision it was compiled with (the
same result either way) until they are cleared. (Whether CUDA graphs are on is in their key.)
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from ..core.dispatcher import dispatcher_or_default
from ..core.hostcost import weighed

_DECOMPOSITIONS: dict[Any, Callable] = {}  # op overload -> its decomposition
_REGISTERED = threading.Event()
_LOCK = threading.Lock()
VENDOR_DTYPES = (torch.float16, torch.bfloat16)  # fp32's TF32 choice is the vendor family's own


def decomposes(op) -> Callable[[Callable], Callable]:
    """Registers the decorated function as `op`'s decomposition for inductor: it returns the aten
    call that stands for a traced call of `op`, or NotImplemented to keep `op`."""
    def register_decomposition(fn: Callable) -> Callable:
        _DECOMPOSITIONS[op._opoverload if hasattr(op, "_opoverload") else op] = fn
        return fn
    return register_decomposition


def register() -> None:
    """Hands every op's decomposition to inductor's table, once a process (a fake implementation
    calls it: every trace passes through one before inductor lowers the graph)."""
    if _REGISTERED.is_set():
        return
    from torch.utils._python_dispatch import _disable_current_modes

    with _LOCK, _disable_current_modes():  # a trace's fake mode must not see the import's tensors
        if _REGISTERED.is_set():
            return
        try:
            from torch._inductor import decomposition, lowering
        except ImportError:  # a PyTorch without inductor: nothing lowers these ops
            _REGISTERED.set()
            return
        for op, fn in _DECOMPOSITIONS.items():
            decomposition.decompositions.setdefault(op, fn)
            if op not in lowering.lowerings:  # a call the decomposition keeps stays the op (see _fallback)
                _fallback(lowering, op)
        # Inductor hands aot_autograd a copy of its table made at its first compile in the process
        # (`fast_random_decomps`, memoised): one made before this registration (a compile of a model
        # without our ops) would never see ours. Dropping the copy makes the next compile take a new one.
        cached_copy = getattr(decomposition, "fast_random_decomps", None)
        if hasattr(cached_copy, "cache_clear"):
            cached_copy.cache_clear()
        _REGISTERED.set()


def _fallback(lowering, op) -> None:
    """Declares `op` a fallback of inductor's, as it makes one for a custom op it meets (an extern call
    with the op's default layout constraint), but beside a decomposition: inductor's implicit
    fallback refuses an op that has both, and ours returns the op wherever the pick is not the
    vendor's."""
    try:
        from torch._library.utils import get_layout_constraint_tag

        constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
    except (ImportError, AttributeError, TypeError):  # another PyTorch's names: no constraint, as before 2.5
        constraint = None
    lowering.make_fallback(op, layout_constraint=constraint, warn=False, override_decomp=True)


def static_metas(*tensors) -> tuple | None:
    """(shape, strides, dtype) of each tensor (None stays None) where every size and stride is a
    plain integer, else None: a symbolic size stands for many problems, which one pick cannot."""
    metas = []
    for t in tensors:
        if t is None:
            metas.append(None)
            continue
        shape, stride = tuple(t.shape), tuple(t.stride())
        if not all(type(v) is int for v in (*shape, *stride)):
            return None
        metas.append((shape, stride, t.dtype))
    return tuple(metas)


def picks_vendor(key: tuple, like: torch.Tensor, problem_of: Callable[[list], Any], *, weigh_host: bool = True) -> bool:
    """Whether the traced call becomes the vendor's aten op: the default dispatcher of `like`'s device
    picks the vendor for the problem `problem_of(meta tensors)` poses (`key[1]` holds the metas), or,
    where `weigh_host` and the compiled graph runs without CUDA graphs, its pick is not expected to
    save the host time a kept call costs (`saves_its_call`). Memoised under `key` and that mode. The
    meta tensors are made outside the trace's modes: they are the problem's, not the graph's."""
    from torch.utils._python_dispatch import _disable_current_modes

    dispatcher = dispatcher_or_default(None, like)
    device = like.device
    host_bound = weigh_host and not _cuda_graphs()

    def decide() -> bool:
        with _disable_current_modes():
            tensors = [None if m is None else torch.empty_strided(m[0], m[1], dtype=m[2], device="meta")
                       for m in key[1]]
            problem = problem_of(tensors)
            if problem is None:
                return False
            spec = dispatcher.select(problem, device=device)
            return spec.is_vendor or host_bound and not saves_its_call(dispatcher, problem, spec)
    return dispatcher.memo(("inductor-vendor", host_bound, *key), decide)


def saves_its_call(dispatcher, problem, spec) -> bool:
    """Whether `spec`, a pick that is not the vendor's, is expected to save more device time than a call
    of our op costs the host inside a compiled graph over inductor's aten call
    (`calibration.compiled_call_host_s`; results/h200/model_step_profile_compile_rules.txt): without
    CUDA graphs a compiled graph launches from the host, and the CNNs and decoders measured are bound
    by it there (PyTorch's own compile of resnet50: 2.0 ms of wall time for 1.65 ms of GPU work).
    The weighing is core.hostcost's."""
    return weighed(dispatcher, problem, spec, dispatcher.arch.calibration.compiled_call_host_s) is spec


def _cuda_graphs() -> bool:
    """Whether inductor is compiling for CUDA graphs (mode="reduce-overhead"), which replay the
    graph's launches with no host time."""
    try:
        from torch._inductor import config
    except ImportError:
        return False
    return bool(getattr(getattr(config, "triton", None), "cudagraphs", False))
