"""The backend per call (core/runtime.py): importing tiledispatch sets nothing, after Triton too;
CPU tensors run under the interpreter, CUDA tensors compiled; TILEDISPATCH_BACKEND forces one;
an interpreted JITFunction leaves Triton as it found it, so the process can still compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from tiledispatch import arch
from tiledispatch.core import runtime
from tiledispatch.core.dispatcher import default_dispatcher, dispatcher_or_default
from tiledispatch.core.errors import InvalidProblemError, TiledispatchError
from tiledispatch.core.runtime import Backend

from ..conftest import requires_interpreter

# A process as a user starts it: no TRITON_INTERPRET (tests/conftest.py sets it for this one).
PLAIN_ENV = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", runtime.ENV_BACKEND)}
PLAIN_ENV["CUDA_VISIBLE_DEVICES"] = ""  # CPU tensors decide wherever this runs

TRITON_FIRST = textwrap.dedent("""
    import json, os, sys
    import triton, triton.language as tl  # Triton first, without TRITON_INTERPRET
    import torch
    before = dict(os.environ)
    import tiledispatch
    from triton.runtime.jit import JITFunction
    from tiledispatch.ops.gemm.kernels import tiled
    changed = sorted(set(os.environ.items()) ^ set(before.items()))
    torch.manual_seed(int(sys.argv[1]))
    a = torch.randn(37, 29, dtype=torch.float16)
    b = torch.randn(29, 23, dtype=torch.float16)
    c = tiledispatch.gemm(a, b)
    error = (c.double() - a.double() @ b.double()).abs().max().item()
    kernels = [v for v in vars(tiled).values() if isinstance(v, JITFunction)]
    print(json.dumps({"changed": changed, "error": error, "shape": list(c.shape), "dtype": str(c.dtype),
                      "jit_kernels": len(kernels), "interpret": os.environ.get("TRITON_INTERPRET")}))
""")


def _last_json(script: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script, *args], env=PLAIN_ENV, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@requires_interpreter
def test_triton_imported_first_then_a_cpu_gemm_runs_on_the_interpreter():
    got = _last_json(TRITON_FIRST, str(torch.randint(0, 2**31, ()).item()))
    assert got["changed"] == [] and got["interpret"] is None
    assert got["jit_kernels"] > 0  # compilable kernels, interpreted on demand
    assert got["shape"] == [37, 23] and got["dtype"] == "torch.float16"
    assert got["error"] < 0.05  # fp16 result of a K=29 product of unit normals, against float64


def test_importing_tiledispatch_leaves_triton_and_filelock_to_their_first_use():
    """Triton's import is a fifth of a second and filelock's (asyncio) 60 ms: `import tiledispatch`
    pays neither (the plans' integer helpers are core.arith's; kernel modules are imported where a
    kernel is built or run, filelock where the cache builds an entry)."""
    script = textwrap.dedent("""
        import json, sys
        import tiledispatch, tiledispatch.cli.main
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "filelock"))))
    """)
    assert _last_json(script) == []


def test_importing_tiledispatch_changes_no_environment_variable():
    script = textwrap.dedent("""
        import json, os
        before = dict(os.environ)
        import tiledispatch, tiledispatch.cli.main
        print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))
    """)
    assert _last_json(script) == []
    env_with = _last_json(script.replace("import json, os", "import json, os\nimport triton"))
    assert env_with == []


# --- the backend of a call ------------------------------------------------------------------


@pytest.fixture
def auto(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(runtime.ENV_BACKEND, raising=False)
    return monkeypatch


def test_the_tensors_device_decides(auto):
    assert runtime.forced_backend() is None
    assert runtime.backend_for(torch.device("cpu")) is Backend.INTERPRETER
    assert runtime.backend_for(torch.device("cuda", 1)) is Backend.CUDA
    assert runtime.backend_for("cuda:0") is Backend.CUDA
    with pytest.raises(InvalidProblemError, match="meta.*CPU or a GPU"):
        runtime.backend_for(torch.device("meta"))


@pytest.mark.parametrize("value", ["interpreter", "CPU-interpreter", " cpu "])
def test_forcing_the_interpreter_refuses_cuda_tensors(auto, value):
    auto.setenv(runtime.ENV_BACKEND, value)
    assert runtime.forced_backend() is Backend.INTERPRETER and runtime.default_backend() is Backend.INTERPRETER
    assert runtime.current_arch().is_interpreter
    assert runtime.backend_for(torch.device("cpu")) is Backend.INTERPRETER
    with pytest.raises(InvalidProblemError, match=f"{runtime.ENV_BACKEND}=.*cpu tensors only.*move them to cpu"):
        runtime.backend_for(torch.device("cuda"))


def test_forcing_cuda_refuses_cpu_tensors(auto):
    auto.setenv(runtime.ENV_BACKEND, "cuda")
    assert runtime.default_backend() is Backend.CUDA
    with pytest.raises(InvalidProblemError, match=f"{runtime.ENV_BACKEND}=cuda runs kernels on cuda tensors only"):
        runtime.backend_for(torch.device("cpu"))


def test_triton_interpret_forces_the_interpreter(auto):
    auto.setenv("TRITON_INTERPRET", "1")
    assert runtime.forced_backend() is Backend.INTERPRETER
    with pytest.raises(InvalidProblemError, match="TRITON_INTERPRET=1"):
        runtime.backend_for(torch.device("cuda"))
    auto.setenv(runtime.ENV_BACKEND, "auto")  # an explicit auto does not lift it: the kernels are interpreted
    assert runtime.forced_backend() is Backend.INTERPRETER


def test_a_backend_that_does_not_exist_is_named(auto):
    auto.setenv(runtime.ENV_BACKEND, "tpu")
    with pytest.raises(TiledispatchError, match=f"{runtime.ENV_BACKEND}='tpu'.*'interpreter'.*'cuda'.*'auto'"):
        runtime.backend_for(torch.device("cpu"))


def test_a_dispatcher_for_a_gpu_refuses_cpu_tensors(auto):
    with pytest.raises(InvalidProblemError, match="cpu.*for sm_90: pass dispatcher=None"):
        runtime.check_device(torch.device("cpu"), arch.load("sm_90"))
    assert runtime.check_device(torch.device("cpu"), arch.load("interpreter")) is Backend.INTERPRETER
    with pytest.raises(InvalidProblemError, match="for interpreter"):
        runtime.check_device(torch.device("cuda"), arch.load("interpreter"))


def test_the_default_dispatcher_follows_the_tensor(auto):
    chosen = dispatcher_or_default(None, torch.empty(2))
    assert chosen.arch.is_interpreter and chosen is default_dispatcher(backend=Backend.INTERPRETER)
    assert dispatcher_or_default(None) is default_dispatcher()  # no tensor: the process's default


# --- a JITFunction under the interpreter ---------------------------------------------------
# Made as JITFunctions whatever TRITON_INTERPRET says: what `triton.jit` gives a user's process.

def _twice_plus(x, y):
    return x * 2 + tl.cdiv(y, 3)


def _larger(a, b):
    return tl.maximum(a, b)


TWICE_PLUS = JITFunction(_twice_plus)
LARGER = JITFunction(_larger)


def _kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(X + offs, mask=inside, other=0.0)
    top = x.sum(axis=0) * 0 + tl.max(x, axis=0) - tl.reduce(x, 0, LARGER)  # 0: a member, a library call, a combine
    tl.store(Y + offs, TWICE_PLUS(x, 7) + top + tl.sigmoid(x) * 0, mask=inside)


KERNEL = JITFunction(_kernel)

# The same in a plain process, where Triton's own library (`tl.cdiv`, `tl.max`, `x.sum`) is
# JITFunctions too: interpreted, Triton put back as it was, then the kernel compiled for sm_90.
PLAIN_PROCESS = textwrap.dedent("""
    import json, sys
    import torch, triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction
    from tiledispatch.core import runtime
    sys.path.insert(0, sys.argv[1])
    from kernels import KERNEL

    def state():  # submodules aside: compiling imports some (triton.language.semantic), which patches nothing
        return {f"{owner.__name__}.{name}": value for owner in (tl, tl.core, tl.core.tensor, tl.core.dtype, JITFunction)
                for name, value in vars(owner).items() if type(value) is not type(sys)}

    before = state()
    torch.manual_seed(int(sys.argv[2]))
    x = torch.randn(100)
    y = torch.full((100,), float("nan"))
    with runtime.interpreter_session():
        runtime.interpreted(KERNEL)[(4,)](x, y, 100, BLOCK=32)
    source = ASTSource(KERNEL, {"X": "*fp32", "Y": "*fp32", "n": "i32"}, constexprs={"BLOCK": 32})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    print(json.dumps({"library_is_jit": isinstance(tl.cdiv, JITFunction) and isinstance(tl.max, JITFunction),
                      "exact": torch.equal(y, x * 2 + 3), "changed": sorted(k for k in set(before) | set(state()) if before.get(k) is not state().get(k)),
                      "elf": compiled.asm["cubin"].startswith(b"\\x7fELF")}))
""")


@requires_interpreter
def test_a_jit_kernel_runs_interpreted_then_compiles_in_a_plain_process(tmp_path):
    module = __import__("inspect").getsource(sys.modules[__name__])
    start, end = module.index("def _twice_plus"), module.index("# The same in a plain process")
    (tmp_path / "kernels.py").write_text("import triton.language as tl\nfrom triton.runtime.jit import JITFunction\n\n\n"
                                         + module[start:end])
    got = _last_json(PLAIN_PROCESS, str(tmp_path), str(torch.randint(0, 2**31, ()).item()))
    assert got == {"library_is_jit": True, "exact": True, "changed": [], "elf": True}


@requires_interpreter
def test_triton_is_put_back_after_a_session():
    before = _triton_state()
    x = torch.randn(70)
    y = torch.full((70,), float("nan"))
    with runtime.interpreter_session():
        runtime.interpreted(KERNEL)[(3,)](x, y, 70, BLOCK=32)
    assert torch.equal(y, x * 2 + 3)
    assert _triton_state() == before


def _triton_state() -> dict:
    from triton.runtime import interpreter

    return {"tl": dict(vars(tl)), "core": dict(vars(tl.core)), "tensor": dict(vars(tl.core.tensor)),
            "dtype": dict(vars(tl.core.dtype)), "jit": dict(vars(JITFunction)),
            "interpreter": {"_patch_lang": interpreter._patch_lang}}


@requires_interpreter
def test_a_session_patches_the_language_once_not_at_each_call(monkeypatch):
    """Inside a session a launch and each of its callees (a helper, `tl.cdiv`, a combine) find the
    language patched already: Triton's own patch of it (inspect.getmembers of three modules) is
    not repeated at each call, and the results are the same."""
    from triton.runtime import interpreter

    patches = []
    plain = interpreter._patch_builtin
    x = torch.randn(70)
    y = torch.full((70,), float("nan"))
    with runtime.interpreter_session():
        monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: patches.append(a[0]) or plain(*a))
        runtime.interpreted(KERNEL)[(3,)](x, y, 70, BLOCK=32)
    assert torch.equal(y, x * 2 + 3)
    assert patches == []


@requires_interpreter
def test_a_launch_in_the_interpreting_context_runs_interpreted():
    """`kernel[grid](...)` as the ops' debugging aids call it, inside `interpreting(device)`."""
    x = torch.randn(50)
    y = torch.zeros(50)
    with runtime.interpreting(torch.device("cpu")):
        KERNEL[(2,)](x, y, 50, BLOCK=32)
    assert torch.equal(y, x * 2 + 3)


@requires_interpreter
def test_another_thread_keeps_plain_jit_functions_during_a_session():
    seen = []

    def other():
        try:
            TWICE_PLUS(1, 2)
        except RuntimeError as e:  # Triton's own refusal, not the session's interpretation
            seen.append(str(e))

    with runtime.interpreter_session():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(seen) == 1 and "outside of the scope of a kernel" in seen[0]


def test_an_interpreter_that_cannot_run_here_is_refused_saying_why(monkeypatch):
    """Triton 3.6's interpreter fails inside its kernels with numpy 2.3 or later: a session says so
    (and what would work) before any kernel runs, rather than a raw interpreter traceback."""
    import numpy
    import triton

    runtime.interpreter_problem.cache_clear()
    monkeypatch.setattr(numpy, "__version__", "2.3.1")
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    try:
        with pytest.raises(TiledispatchError, match=r"numpy < 2.3.*numpy 2.3.1.*GPU"):
            with runtime.interpreter_session():
                pass
        monkeypatch.setattr(numpy, "__version__", "2.2.6")
        runtime.interpreter_problem.cache_clear()
        with runtime.interpreter_session():
            pass
    finally:
        monkeypatch.undo()
        runtime.interpreter_problem.cache_clear()
