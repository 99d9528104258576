"""What the ops' custom-op modules (ops/<op>/library.py) share: the dispatcher token, the
test of whether a call inside a backward may take the fast path, and each op's eager twin.

An eager call that autograd records runs the op's twin, an autograd.Function made of the
op's own kernel, setup and backward: it records the same graph for a fraction of the custom
op's dispatch (the torch.library autograd wrapper and two trips through the dispatcher),
which costs more than a replayed call's whole host time. torch.compile's trace, and tensors
that are not plain (fake or functional ones, subclasses), go through the custom op itself.

A schema takes tensors and plain scalars only, so a dispatcher travels as a token: 0 for the
default one, else the id of a Dispatcher held here (weakly) for as long as the caller holds
it. torch.compile traces the default dispatcher only: a graph keeps its arguments as
constants and would keep a token whose dispatcher is gone.

Each op's kernel is also registered at the CPU and CUDA keys directly (`custom_op` here): the
custom op's own registration wraps every call in an aliasing check that cost 30-50 us a call
from inductor's code on the H200's host (`benchmarks/studies/compile_probe.py`), more than
the whole of PyTorch's conv call. opcheck's schema test checks the aliasing instead.
"""

from __future__ import annotations

import weakref

import torch

from ..core.dispatcher import dispatcher_or_default
from ..core.errors import UnsupportedError

NAMESPACE = "tiledispatch"
DEFAULT_DISPATCHER = 0
_DISPATCHERS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
# The tensor types whose memory the kernels read; a fake or functional tensor (a trace) is
# neither, and goes through the custom op.
_REAL = (torch.Tensor, torch.nn.Parameter)
_BACKENDS = torch.library.Library(NAMESPACE, "IMPL")


def custom_op(name: str, kernel):
    """tiledispatch::`name`, the custom op whose schema, fake and autograd come from `kernel`
    and torch.library, with `kernel` itself at the CPU and CUDA keys (see the module's docstring)."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=())(kernel)
    for key in ("CPU", "CUDA"):
        _BACKENDS.impl(name, kernel, key)
    return op


def dispatcher_token(dispatcher) -> int:
    """The schema's stand-in for the `dispatcher` argument (see the module's docstring)."""
    if dispatcher is None:
        return DEFAULT_DISPATCHER
    if torch.compiler.is_dynamo_compiling():
        raise UnsupportedError(
            "dispatcher: torch.compile traces tiledispatch's ops with the default dispatcher only (a compiled "
            "graph holds its arguments as constants); pass dispatcher=None there, or call the op outside "
            "torch.compile (TILEDISPATCH_STRATEGY sets the default dispatcher's strategy)")
    dispatcher = dispatcher_or_default(dispatcher)
    _DISPATCHERS[id(dispatcher)] = dispatcher
    return id(dispatcher)


def dispatcher_of(token: int):
    """The Dispatcher a token stands for (None: the default one)."""
    if token == DEFAULT_DISPATCHER:
        return None
    dispatcher = _DISPATCHERS.get(token)
    if dispatcher is None:
        raise UnsupportedError(
            f"dispatcher token {token} names no live tiledispatch.Dispatcher: the custom ops take 0 (the default "
            "dispatcher) or a token from tiledispatch.library.dispatcher_token(d) while d is alive")
    return dispatcher


def eager_twin(name: str, kernel, setup_context, backward) -> type[torch.autograd.Function]:
    """The autograd.Function that runs a custom op's kernel, setup_context and backward (the
    functions its registration takes) on an eager call that autograd records.

    Its forward takes ctx and calls the setup itself: a Function that defines setup_context
    instead binds its arguments to forward's signature through inspect on every call, which
    costs 25 us of a 6 us apply on the CPU machine."""
    def forward(ctx, *args):
        output = kernel(*args)
        setup_context(ctx, args, output)
        return output

    return type(name, (torch.autograd.Function,), {
        "__doc__": f"The eager twin of the custom op whose kernel is {kernel.__qualname__}.",
        "forward": staticmethod(forward), "backward": staticmethod(backward)})


def records_eagerly(*tensors) -> bool:
    """Whether a call that autograd records may run the op's eager twin: no trace under way, and
    plain tensors only (a fake or functional tensor needs the custom op's fake)."""
    if torch.compiler.is_dynamo_compiling():
        return False
    for t in tensors:
        if t is not None and type(t) not in _REAL:
            return False
    return True


def runs_eagerly(*tensors) -> bool:
    """Whether a call inside a backward may take the fast path: real tensors, and no gradient of its
    own to record (a double backward, or a trace, goes through the custom op)."""
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _REAL or (grad and t.requires_grad)):
            return False
    return True
