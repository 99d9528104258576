"""A compiled unit's cache key follows the Triton functions it compiles (core.jitkey), not a list
of modules: a helper edited in another file changes the key of every kernel calling it, and the
key is the same in an interpreting process and in a compiling one, whatever either hashed first."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

from tiledispatch import Registry, arch
from tiledispatch.core import jitkey, kernel

HELPER = '''
import triton
import triton.language as tl

SCALE = tl.constexpr({scale})


@triton.jit
def helper(x):
    return x * {factor} + SCALE
'''
KERNEL = '''
import triton
import triton.language as tl

from {helper} import helper


@triton.jit
def kernel(X, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(X + offs, helper(tl.load(X + offs)))
'''


def _kernel_of(tmp_path, name: str, factor: int, scale: int):
    """A kernel module `td_jk_kernel_<name>` calling a helper of its own module `td_jk_helper_<name>`."""
    (tmp_path / f"td_jk_helper_{name}.py").write_text(HELPER.format(factor=factor, scale=scale))
    (tmp_path / f"td_jk_kernel_{name}.py").write_text(KERNEL.format(helper=f"td_jk_helper_{name}"))
    return importlib.import_module(f"td_jk_kernel_{name}").kernel


def test_a_helper_edit_in_another_file_changes_the_kernels_key(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        same = _kernel_of(tmp_path, "a", 2, 1), _kernel_of(tmp_path, "b", 2, 1)
        edited, constant = _kernel_of(tmp_path, "c", 3, 1), _kernel_of(tmp_path, "d", 2, 5)
        keys = [jitkey.cache_key(fn) for fn in (*same, edited, constant)]
        assert keys[0] == keys[1]  # the same code, in modules of other names: one key
        assert len(set(keys[1:])) == 3  # the helper's body, or a constexpr global it reads, moves it
    finally:
        for name in "abcd":
            sys.modules.pop(f"td_jk_kernel_{name}", None)
            sys.modules.pop(f"td_jk_helper_{name}", None)


# Units whose functions call helpers in other files: gemm's tiled kernel (epilogue, tile order),
# conv's flat implicit GEMM (another family's module), the attention forward and its Gluon
# twin and its Gluon backward (the scores helpers), gemm's Gluon kernel (the epilogue).
UNITS = {"gemm": ("tiled", "ws-persistent"), "conv": ("igemm-flat",), "attention": ("fwd", "fwd-ws", "bwd-ws")}

COMPILING = textwrap.dedent('''
    import json, sys
    import tiledispatch
    from triton.runtime.jit import JITFunction
    from tiledispatch.core import jitkey, kernel
    from tiledispatch.ops.attention.kernels import scores
    # Triton's own keys first, in its order: what a process that launched these would hold.
    for value in vars(scores).values():
        if isinstance(value, JITFunction):
            value.cache_key
    units = json.loads(sys.argv[1])
    print(json.dumps({f"{m}.{f}": jitkey.cache_key(getattr(__import__(m, fromlist=[f]), f)) for m, f in units}))
''')


def _units() -> list:
    found = []
    for op, families in UNITS.items():
        registry = Registry.from_rule_set(op, "default", arch.load("sm_90"))
        for family in families:
            spec = next(s for s in registry if s.family == family)
            found += [u for u in kernel.units(spec) if u.kind.compiled]
    return found


def test_the_key_is_the_same_in_an_interpreting_and_a_compiling_process():
    units = _units()
    assert {u.kind.value for u in units} == {"triton", "gluon"}
    here = {f"{u.module}.{u.function}": jitkey.cache_key(kernel._function(u)) for u in units}
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", COMPILING, json.dumps([(u.module, u.function) for u in units])],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here
