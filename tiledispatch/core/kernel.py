"""The kernel step: a spec's compiled artifacts, from the cache or compiled into it.

Compilation is ahead of time through ``triton.compile`` for a named target, so it needs
no GPU (Triton ships ptxas). Loading wraps the cached cubin in Triton's CompiledKernel
and keeps its bound launcher, so a launch afterwards is a single call.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib
import logging
import multiprocessing
import os
import shutil
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import function_keys, jitkey, jsonio, runtime
from .cache import CacheEntry, KernelCache, StaleEntryError
from .errors import BuildError
from .op import KernelUnit, UnitKind
from .spec import KernelSpec

CACHE_FORMAT = "triton-cubin-1"
METADATA_FILE = "kernel.json"
BINARY_FILE = "kernel.cubin"
PTX_FILE = "kernel.ptx"
LOADED_FILES = (METADATA_FILE, BINARY_FILE)  # what CudaLauncher reads: an entry must list both
LOAD_ATTEMPTS = 3  # an entry pruned or replaced between its verification and its load is built again

log = logging.getLogger("tiledispatch.kernel")


def function_key(unit: KernelUnit, cache: KernelCache | None = None) -> str:
    """What the unit's compiled code depends on in source: its function's name and Triton's cache
    key of it (its source and, transitively, every jit function it calls: `jitkey`). With a cache,
    the key a process computed before for the same sources is read from it (`function_keys`)."""
    name = f"{unit.module}.{unit.function}"
    if cache is None:
        return f"{name}:{jitkey.cache_key(_function(unit))}"
    return f"{name}:{function_keys.stored_key(cache, name, lambda: jitkey.cache_key(_function(unit)))}"


@functools.lru_cache(maxsize=1)
def toolchain() -> dict[str, str]:
    import triton

    return {
        "format": CACHE_FORMAT,
        "triton": triton.__version__,
        "ptxas": os.environ.get("TRITON_PTXAS_PATH", "bundled"),
    }


def _specialization(spec: KernelSpec, specialization: Any | None) -> Any:
    return spec.definition.specializations[0] if specialization is None else specialization


def units(spec: KernelSpec, specialization: Any | None = None) -> tuple[KernelUnit, ...]:
    """What `spec` compiles and runs, specialised so, on the arch it is built for."""
    from .. import arch

    return spec.definition.kernel_units(spec.config, _specialization(spec, specialization), arch.load(spec.arch))


def compiles(spec: KernelSpec, specialization: Any | None = None) -> bool:
    """Whether `spec` has anything of its own to compile: not every unit a Python call (the
    vendor's, or one into another op, which builds its own kernels when it runs)."""
    return any(unit.kind.compiled for unit in units(spec, specialization))


def unit_key(spec: KernelSpec, unit: KernelUnit, specialization: Any | None = None,
             cache: KernelCache | None = None) -> str:
    """Kernel name, specialisation and stage, plus the hash of the function's key (`function_key`),
    of the unit itself and of the toolchain. The unit's own fields (signature, constexprs, warps,
    stages, divisibility, cap) are what the compiler is handed: a constant of a plan module that
    feeds them (a reduction's block) is not in the kernel's sources, and without them an edit there
    would load a binary built for the old value."""
    name = f"{spec.name}.{_specialization(spec, specialization).tag}.{unit.stage}"
    if unit.max_registers is not None:  # a compile option the name does not spell
        name += f".r{unit.max_registers}"
    compiled_as = hashlib.sha256(repr(unit).encode()).hexdigest()
    return KernelCache.make_key(name, f"{function_key(unit, cache)}:{compiled_as}", toolchain())


def _function(unit: KernelUnit):
    """The unit's kernel, whose parameters its signature lists in order: the interpreter binds
    the launch's arguments by position, constexprs included, so an order the compiler (which
    binds by name) accepts would hand the interpreted kernel one constexpr's value for another."""
    fn = getattr(importlib.import_module(unit.module), unit.function)
    names = [name for name, _ in unit.signature]
    params = list(getattr(fn, "arg_names", names))
    if names != params:
        raise BuildError(f"{unit.module}.{unit.function}: the unit's signature lists {names}, the kernel's "
                         f"parameters are {params}; list them in the kernel's order")
    return fn


def _source(unit: KernelUnit):
    if unit.kind is UnitKind.GLUON:
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source

    fn = _function(unit)
    divisors = {**{name: 16 for name in unit.divisible_by_16}, **dict(unit.divisibility)}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", d]] for name, d in divisors.items() if d > 1}
    return Source(fn, dict(unit.signature), constexprs=dict(unit.constexprs), attrs=attrs)


def _options(unit: KernelUnit) -> dict[str, Any]:
    options = {"num_warps": unit.num_warps, "num_stages": unit.num_stages}
    if unit.max_registers is not None:
        options["maxnreg"] = unit.max_registers
    return options


def check_shared_memory(unit: KernelUnit, shared_bytes: int, arch_facts) -> None:
    """Refuses a compiled unit that asks for more shared memory than one block may have.

    Validation estimates a config's shared memory before compiling; the compiled kernel
    says what it really takes. Triton compiles past the limit and only the launch fails, so
    the check lives here: the artifact is never cached, and the dispatcher moves on to its
    next candidate instead of failing on the user's call.
    """
    limit = arch_facts.shared_memory_per_block_optin
    if shared_bytes > limit:
        raise BuildError(
            f"{unit.function} ({unit.stage}) compiled for {arch_facts.name} takes {shared_bytes} B of shared memory "
            f"a block; {arch_facts.name} allows {limit} B: use smaller blocks or fewer stages")


# Triton reads its cache directory (knobs.cache.dir, else $TRITON_CACHE_DIR, else
# ~/.triton/cache) each time triton.compile makes a cache manager, and returns a hit from it
# without compiling: a cubin planted there would be copied into a tiledispatch entry and
# checksummed as ours. So a build compiles with Triton's cache in a fresh directory of its
# own (inside the entry's private staging directory), with the file cache manager, no
# override directory and always_compile on. The knobs are process-wide, so builds in one
# process take turns (a lock), and Triton's knobs.*.scope() restores them and the
# environment variables they mirror afterwards. A JIT compile in another thread of the
# process during that window uses the private directory too: it compiles afresh, and
# its cache entry is removed with the directory.
_TRITON_CACHE_LOCK = threading.Lock()
TRITON_CACHE_SUBDIR = ".triton-cache"


@contextlib.contextmanager
def private_triton_cache(directory: Path):
    """Triton's cache in `directory` (created empty, removed on exit) for the duration."""
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    with _TRITON_CACHE_LOCK, knobs.cache.scope(), knobs.compilation.scope():
        directory.mkdir(mode=0o700)
        try:
            knobs.cache.dir = str(directory)
            knobs.cache.manager_class = FileCacheManager
            knobs.compilation.override = False
            knobs.compilation.always_compile = True
            yield directory
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def compile_unit(unit: KernelUnit, arch_name: str, out_dir: Path) -> dict[str, Any]:
    """Compiles one unit for `arch_name` and writes its cubin, PTX and metadata to out_dir.

    A full disk (ENOSPC, EDQUOT) passes through as OSError, for the cache to say so; any
    other failure of the compiler is a BuildError.
    """
    import triton
    from triton.runtime.jit import JITFunction

    from .. import arch

    if not isinstance(_function(unit), JITFunction):
        raise BuildError(
            f"{unit.module}.{unit.function} was imported under TRITON_INTERPRET=1 and cannot be compiled "
            "in this process; `tiledispatch build` compiles in worker processes"
        )
    target = arch.load(arch_name).triton_target()
    with runtime.INTERPRETER_LOCK, private_triton_cache(out_dir / TRITON_CACHE_SUBDIR):
        try:
            compiled = triton.compile(_source(unit), target=target, options=_options(unit))
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise BuildError(f"compiling {unit.function} ({unit.stage}) for {arch_name} failed: {e}") from e
        except Exception as e:
            raise BuildError(f"compiling {unit.function} ({unit.stage}) for {arch_name} failed: {e}") from e
        check_shared_memory(unit, compiled.metadata.shared, arch.load(arch_name))
        if not compiled.asm["cubin"].startswith(b"\x7fELF"):
            raise BuildError(f"compiling {unit.function} ({unit.stage}) for {arch_name} gave no ELF cubin")
        metadata_path = next(Path(p) for name, p in compiled.metadata_group.items() if name.endswith(".json"))
        shutil.copyfile(metadata_path, out_dir / METADATA_FILE)
    (out_dir / BINARY_FILE).write_bytes(compiled.asm["cubin"])
    (out_dir / PTX_FILE).write_text(compiled.asm["ptx"])
    return {
        "stage": unit.stage,
        "function": unit.function,
        "arch": arch_name,
        "shared_bytes": compiled.metadata.shared,
        "num_warps": unit.num_warps,
        "num_stages": unit.num_stages,
        "hash": compiled.hash,
    }


def build(spec: KernelSpec, cache: KernelCache, specialization: Any | None = None) -> dict[str, CacheEntry]:
    """Every unit of `spec` from the cache, compiling (once, under the key's lock) what is missing."""
    entries = {}
    for unit in units(spec, specialization):
        if not unit.kind.compiled:
            continue  # nothing to compile
        entries[unit.stage] = cache.get_or_build(
            unit_key(spec, unit, specialization, cache), functools.partial(compile_unit, unit, spec.arch),
            required=LOADED_FILES)
    return entries


class CudaLauncher:
    """A cached cubin, loaded once, with Triton's launcher bound to it."""

    def __init__(self, unit: KernelUnit, entry: CacheEntry) -> None:
        compiled = loaded_kernel(_source(unit), entry)
        run = compiled.run  # loads the module and builds the launcher
        function, packed = compiled.function, compiled.packed_metadata
        if _needs_no_scratch(run):
            # Straight to the compiled C launcher: Triton's Python wrapper around it only
            # allocates scratch memory, which this kernel does not use (about 1 us a call).
            launch, cooperative, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
            self.launch = lambda grid, args, stream: launch(grid[0], grid[1], grid[2], stream, function, cooperative,
                                                            pdl, None, None, packed, None, None, None, *args)
        else:
            self.launch = lambda grid, args, stream: run(grid[0], grid[1], grid[2], stream, function, packed,
                                                         None, None, None, *args)

    def __call__(self, grid: tuple[int, int, int], args: tuple, stream: int) -> None:
        """`launch` behind one more frame: the fast path of a bound call holds `launch` itself."""
        self.launch(grid, args, stream)


def loaded_kernel(src, entry: CacheEntry):
    """Triton's CompiledKernel of a verified entry, holding exactly the verified bytes.

    CompiledKernel reads the metadata and the cubin through their paths, so what it read
    is compared with the bytes the cache verified through its checked descriptors (the
    cubin byte for byte, the metadata by value): a file replaced or removed after the
    verification is never launched, it raises StaleEntryError and the caller looks the
    entry up again.
    """
    from triton.compiler.compiler import CompiledKernel

    want_binary = entry.read_bytes(BINARY_FILE)  # CacheError if the entry does not list it
    stale = f"cache entry {entry.key} changed or vanished while it was loaded; look it up again"
    try:
        want = jsonio.loads(entry.read_bytes(METADATA_FILE).decode())
        group = {METADATA_FILE: str(entry.files[METADATA_FILE]), BINARY_FILE: str(entry.files[BINARY_FILE])}
        compiled = CompiledKernel(src, group, entry.metadata.get("hash", ""))
        got = compiled.metadata._asdict()
        target, want_target = got.pop("target"), want.pop("target")
        same = (compiled.kernel == want_binary and got == want
                and (target.backend, target.arch, target.warp_size)
                == (want_target["backend"], want_target["arch"], want_target["warp_size"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise StaleEntryError(f"{stale} ({type(e).__name__}: {e})") from e
    if not same:
        raise StaleEntryError(stale)
    return compiled


def build_launcher(unit: KernelUnit, entry: CacheEntry) -> None:
    """Triton's C launcher for the unit, compiled into Triton's own cache without loading the kernel.

    Triton compiles one small C module per kernel signature with the host's C compiler (about a
    second) the first time a process on the machine loads such a kernel; a build worker makes it
    here, so that the process that loads the kernel finds it built. A host without the CUDA
    driver (a CPU build host) loads nothing and builds none; a launcher that fails to build is
    left to the loading process, which says why."""
    from triton.backends.nvidia.driver import CudaLauncher, libcuda_dirs

    try:
        libcuda_dirs()
    except AssertionError:  # Triton's word for no libcuda.so on this host
        return
    try:
        compiled = loaded_kernel(_source(unit), entry)
        CudaLauncher(compiled.src, compiled.metadata)
    except Exception:  # noqa: BLE001 - an optimisation of the first load, which builds it anyway
        log.warning("Triton's launcher for %s (%s) did not build ahead", unit.function, unit.stage, exc_info=True)


def _needs_no_scratch(run) -> bool:
    """Whether Triton's launcher object (3.6's CudaLauncher) can be bypassed for this kernel."""
    try:
        return (run.global_scratch_size == 0 and run.profile_scratch_size == 0
                and callable(run.launch) and hasattr(run, "launch_pdl"))
    except AttributeError:  # another Triton: keep its generic entry point
        return False


class PythonLauncher:
    """A plain function stage (the vendor library): called with the plan's arguments."""

    def __init__(self, unit: KernelUnit) -> None:
        self._fn = _function(unit)

    def __call__(self, grid: tuple[int, int, int], args: tuple, stream: int | None) -> None:
        self._fn(*args)


class InterpretedLauncher:
    """The same kernel source, run on the CPU by Triton's interpreter, one launch at a time in
    the process (`runtime.interpreter_session`: the interpreter patches Triton module-wide)."""

    def __init__(self, unit: KernelUnit) -> None:
        if unit.kind is UnitKind.GLUON:  # validation keeps Gluon families off the interpreter arch
            raise BuildError(f"{unit.function} is a Gluon kernel: Triton's interpreter cannot run it")
        self._fn = runtime.interpreted(_function(unit))

    def __call__(self, grid: tuple[int, int, int], args: tuple, stream: int | None) -> None:
        with runtime.interpreter_session():
            self._fn[grid](*args)


def load(spec: KernelSpec, cache: KernelCache | None, specialization: Any | None = None) -> dict[str, Any]:
    """Launchers by stage for `spec` (specialised so): interpreted where it is built for the
    interpreter arch, else compiled for its GPU arch."""
    from .. import arch

    todo = units(spec, specialization)
    launchers = {unit.stage: PythonLauncher(unit) for unit in todo if not unit.kind.compiled}
    compiled = [unit for unit in todo if unit.kind.compiled]
    if arch.load(spec.arch).is_interpreter:
        return {**launchers, **{unit.stage: InterpretedLauncher(unit) for unit in compiled}}
    if compiled:
        launchers.update(_cuda_launchers(spec, compiled, cache if cache is not None else KernelCache(),
                                         specialization))
    return launchers


def _cuda_launchers(spec: KernelSpec, compiled: list[KernelUnit], cache: KernelCache,
                    specialization: Any | None) -> dict[str, CudaLauncher]:
    """The compiled stages' launchers; an entry that changes or vanishes between its
    verification and its load (a concurrent prune or clear) is looked up again, and rebuilt."""
    def attempt() -> dict[str, CudaLauncher]:
        entries = build(spec, cache, specialization)  # its hashing and compiling hold runtime's lock
        return {unit.stage: CudaLauncher(unit, entries[unit.stage]) for unit in compiled}

    for tried in range(1, LOAD_ATTEMPTS):
        try:
            return attempt()
        except StaleEntryError as e:
            log.warning("loading %s: %s (attempt %d of %d)", spec.name, e, tried, LOAD_ATTEMPTS)
    return attempt()


# -- ahead-of-time builds in worker processes ------------------------------------------
@dataclass(frozen=True)
class BuildResult:
    name: str
    ok: bool
    seconds: float
    error: str | None = None


def _worker_build(spec: KernelSpec, cache_root: str, specializations: tuple | None) -> BuildResult:
    start = time.perf_counter()
    try:
        for specialization in specializations or spec.definition.specializations:
            entries = build(spec, KernelCache(cache_root), specialization)
            for unit in units(spec, specialization):
                if unit.stage in entries:
                    build_launcher(unit, entries[unit.stage])
        return BuildResult(spec.name, True, time.perf_counter() - start)
    except Exception as e:  # reported per kernel; one bad config must not stop a build
        return BuildResult(spec.name, False, time.perf_counter() - start, f"{type(e).__name__}: {e}")


@contextlib.contextmanager
def environment(**values: str):
    """os.environ with `values` while the block runs, restored after: what a spawned child takes
    at its start (a compile worker, a sweep's worker)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def build_all(specs: Iterable[KernelSpec], cache: KernelCache, jobs: int,
              on_done: Callable[[BuildResult], None] | None = None,
              specializations: tuple | None = None) -> list[BuildResult]:
    """Compiles every spec, in `specializations` (default: its op's ahead-of-time ones), into `cache`.

    Workers are spawned processes with `jobs` at most: no GPU state is shared.
    """
    return build_each(((spec, specializations) for spec in specs), cache, jobs, on_done)


def build_each(work: Iterable[tuple[KernelSpec, tuple | None]], cache: KernelCache, jobs: int,
               on_done: Callable[[BuildResult], None] | None = None,
               deadline: float | None = None) -> list[BuildResult]:
    """Compiles each (spec, specializations) pair into `cache` through one pool of `jobs` spawned
    processes. One pool for all: a spawned worker pays its imports once (seconds on a GPU host), and
    no group of pairs waits for the slowest compile of the one before it. Past `deadline` (a
    `time.perf_counter()` time) the compiles not yet started are dropped: the results are those
    finished, what was left compiles where it is first needed."""
    work = list(work)
    results = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(work))), mp_context=context) as pool:
        # Workers compile real kernels: they must import Triton without the interpreter, and
        # select for the GPU whatever device they run on (a plan's constexprs follow the
        # backend); a spawned process takes the environment of the moment it starts.
        with environment(TRITON_INTERPRET="0", TILEDISPATCH_BACKEND="cuda"):
            futures = [pool.submit(_worker_build, spec, str(cache.root), specializations)
                       for spec, specializations in work]
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        seen: set = set()

        def take(future) -> None:
            seen.add(future)
            results.append(future.result())
            if on_done is not None:
                on_done(results[-1])

        try:
            for future in as_completed(futures, timeout=left):
                take(future)
        except TimeoutError:  # the deadline: the compiles running finish, the queued ones are dropped
            pool.shutdown(wait=True, cancel_futures=True)
            for future in futures:
                if future not in seen and future.done() and not future.cancelled():
                    take(future)
        except BaseException:  # Ctrl-C or a stopped sweep: the queued compiles are dropped, not waited for
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return sorted(results, key=lambda r: r.name)
