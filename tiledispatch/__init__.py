"""tiledispatch: pick the fastest kernel for each GEMM, convolution and attention, and run it."""

import time as _time

# Before any of the package's modules: every module this process imports is read after this
# instant, so a source file last modified before it is the one running (core.function_keys).
_IMPORTED_AT = _time.time()

from .core.dispatcher import Dispatcher, Strategy, default_dispatcher, using
from .core.errors import (
    ArchError, BuildError, CacheError, InsecureCacheError, InvalidConfigError, InvalidProblemError,
    NoKernelError, RegistryFormatError, TiledispatchError, UnknownKernelError, UnsupportedError,
)
from .core.op import OpKind, RuleSet
from .core.registry import Registry
from .core.spec import KernelSpec
from .heuristics import autotune as _autotune  # noqa: F401  (sets the autotune strategy's policy)
from .heuristics import learned as _learned  # noqa: F401  (the shipped models: the model strategy's source)
from . import ops as _ops  # noqa: F401  (registers every op with the core)
from .ops.attention import attention
from .ops.conv import conv, conv_backward_data, conv_backward_weight
from .ops.gemm import gemm
from . import library  # noqa: E402  (registers the custom ops tiledispatch::*)
from .recording import warmup

__version__ = "0.1.0"

__all__ = [
    "gemm", "attention", "conv", "conv_backward_data", "conv_backward_weight", "warmup",
    "Dispatcher", "Strategy", "default_dispatcher", "using", "Registry", "KernelSpec", "OpKind", "RuleSet",
    "TiledispatchError", "InvalidProblemError", "UnsupportedError", "InvalidConfigError", "UnknownKernelError",
    "NoKernelError", "RegistryFormatError", "CacheError", "InsecureCacheError", "BuildError", "ArchError",
]
