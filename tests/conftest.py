"""Test set-up: runs before anything imports tiledispatch or Triton.

Without a GPU the kernels run under Triton's interpreter; on a GPU the same tests run
natively (and the bf16 ones, which the interpreter cannot do, run too). The kernel
cache goes to a private temporary directory, never the user's.
"""

import os
import tempfile

import pytest

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
if "TILEDISPATCH_CACHE_DIR" not in os.environ:
    os.environ["TILEDISPATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="tiledispatch-test-cache-")

from tiledispatch.core.runtime import interpreter_problem  # noqa: E402  (after the environment above)


def on_gpu() -> bool:
    return os.environ.get("TRITON_INTERPRET") != "1"


requires_gpu = pytest.mark.skipif(not on_gpu(), reason="needs a CUDA GPU (bf16 tl.dot is not in the interpreter)")
# Tests that run Triton's interpreter: refused where it cannot run (Triton 3.6 with numpy 2.3 or later).
requires_interpreter = pytest.mark.skipif(
    interpreter_problem() is not None, reason="Triton's interpreter cannot run here (Triton 3.6, numpy 2.3 or later)")
# Tests of behaviour that exists in an interpreter process only (CPU tensors run, compiling is refused).
interpreter_only = pytest.mark.skipif(on_gpu(), reason="runs kernels on CPU tensors: an interpreter process only")


@pytest.fixture(scope="session")
def private_cache(tmp_path_factory):
    """Makes kernel caches for the compile tests, each in a fresh directory of its own that only
    this user can write to: KernelCache refuses one that group or others can, and pytest's
    temporary directories follow the umask."""
    from tiledispatch.core.cache import KernelCache

    def make(name: str) -> "KernelCache":
        root = tmp_path_factory.mktemp(name)
        os.chmod(root, 0o700)
        return KernelCache(root / "cache")

    return make
