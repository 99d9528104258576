"""NVIDIA's nvMatmulHeuristics (nvMMH) as a GEMM picker, judged offline beside ours (issue 41).

nvMMH is an analytic GEMM runtime model that runs on the CPU from predefined GPU descriptors, so
a sweep's table is all it needs. It ranks only the Triton tiles of our candidates that it can
express (`kernel_of`): tiled, tma-persistent and ws-persistent. It never picks cuBLAS (the vendor
candidate: no tile to describe), gemv (no tensor-core tile), stream-k (its Triton target models
split-K reduced in place, not a last wave shared over SMs) or ws-pingpong (two warpgroups on
tiles of their own: no one CTA tile).

The mapping, and what it assumes:
- Target TRITON for every family, so every estimate has one calibration (its CUTLASS3 target
  predicts the same tile 1.8x faster: mixing targets would rank targets, not tiles). Persistence
  and warp specialisation are not modelled: a persistent kernel runs the same waves of tiles.
- Warp tile: the Triton target reads only the warp count (its backend property
  REQUIRES_WARP_CONFIG is 0), but refuses a warp tile under one m16n8 MMA. `warp_tile` splits the
  warps as Triton's Hopper MMA layout does (along M, 16 rows a warp, then along N), kept at or
  above 16 x 8.
- Instruction tile 16x8x16, CTA order row-major and cluster 1x1: what nvMMH's own Triton target
  answers on Hopper. Our group_m is its gridSwizzle (the same grouped order as Triton's), our
  split_k its splitK (its Triton target reduces in place; ours in a second pass).
- The estimate ranked is RUNTIME_RELATIVE_FAST_S, which nvMMH's header recommends for ordering
  kernels (its plain runtime estimate, `Metric.RUNTIME`, ranks our tiles worse: docs/selection.md).
- An estimate of 0 is nvMMH refusing the config (a warp's accumulator past its register budget):
  that candidate is not ranked.
- In 0.1.0.27 the estimate does not change with loadStages, the CTA's K or the layout, so tiles
  that differ only there tie, and the rules' order breaks the tie.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..core.dtypes import DType
from ..core.runtime import installed_version
from ..ops.gemm.config import Family
from ..ops.gemm.problem import GemmLayout, GemmProblem, GemmTypes, Layout

PACKAGE = "nvidia-matmul-heuristics"
MAPPED = frozenset({Family.TILED, Family.TMA_PERSISTENT, Family.WS_PERSISTENT})
INSTR_TILE = (16, 8, 16)
MIN_WARP_TILE = (16, 8)  # rows x columns: one m16n8 MMA; nvMMH refuses smaller warp tiles
_LETTER = {DType.FP16: "H", DType.BF16: "T", DType.FP32: "S"}  # nvMMH's precision letters


class MatmulLayout(enum.IntEnum):
    """nvMMH's nvmmhMatmulLayout_t: T is an operand stored transposed (B as N x K: our "c")."""

    NN_ROW = 0
    NT_ROW = 1
    TN_ROW = 2
    TT_ROW = 3
    NN_COL = 4
    NT_COL = 5
    TN_COL = 6
    TT_COL = 7


@dataclass(frozen=True)
class NvProblem:
    m: int
    n: int
    k: int
    batch: int
    layout: MatmulLayout
    precision: str  # A&B, compute, C&D: "TST" is bf16 in, fp32 accumulation, bf16 out


@dataclass(frozen=True)
class NvKernel:
    cta: tuple[int, int, int]
    warp: tuple[int, int, int]
    split_k: int
    stages: int
    swizzle: int
    instr: tuple[int, int, int] = INSTR_TILE


Estimator = Callable[[NvProblem, NvKernel], float]  # seconds; 0 or less: nvMMH refuses the config


class Unavailable(Exception):
    """No nvMMH estimates here; the message says why (it goes in the report's `skipped`)."""


def layout_of(layout: GemmLayout) -> MatmulLayout | None:
    """Our A, B, C letters as nvMMH's layout; None for strided operands, which it cannot describe.
    With C row-major an operand is transposed when column-major (rcr, F.linear, is NT_ROW); with C
    column-major the BLAS convention holds, where a row-major operand is the transposed one."""
    if Layout.STRIDED in (layout.a, layout.b, layout.c):
        return None
    stored_t = Layout.ROW if layout.c is Layout.COL else Layout.COL
    index = 2 * (layout.a is stored_t) + (layout.b is stored_t) + (4 if layout.c is Layout.COL else 0)
    return MatmulLayout(index)


def precision_of(types: GemmTypes) -> str | None:
    """nvMMH's precision string for fp16 or bf16 operands accumulated in fp32; None otherwise."""
    if types.a is not types.b or types.a not in (DType.FP16, DType.BF16) or types.acc is not DType.FP32:
        return None
    return _LETTER[types.a] + "S" + _LETTER[types.c] if types.c in _LETTER else None


def problem_of(problem: GemmProblem) -> NvProblem | None:
    """Our problem as nvMMH's; None where it has no layout or precision for it."""
    layout, precision = layout_of(problem.layout), precision_of(problem.types)
    if layout is None or precision is None:
        return None
    return NvProblem(problem.m, problem.n, problem.k, problem.batch, layout, precision)


def warp_tile(block_m: int, block_n: int, block_k: int, num_warps: int) -> tuple[int, int, int] | None:
    """The tile one warp computes: warps along M while each keeps 16 rows, then along N; None when
    `num_warps` is no power of two or a warp would get fewer than 8 columns."""
    rows, cols = 1, 1
    while rows * cols < num_warps:
        if block_m >= 2 * rows * MIN_WARP_TILE[0]:
            rows *= 2
        else:
            cols *= 2
    if rows * cols != num_warps or block_n < cols * MIN_WARP_TILE[1]:
        return None
    return block_m // rows, block_n // cols, block_k


def kernel_of(config: Any) -> NvKernel | None:
    """Our config as nvMMH's kernel configuration; None for a family it cannot express."""
    if getattr(config, "family", None) not in MAPPED:
        return None
    warp = warp_tile(config.block_m, config.block_n, config.block_k, config.num_warps)
    if warp is None:
        return None
    return NvKernel((config.block_m, config.block_n, config.block_k), warp, config.split_k, config.num_stages,
                    config.group_m)


def estimate(problem: GemmProblem, config: Any, estimator: Estimator) -> float | None:
    """nvMMH's estimate of `config` on `problem` (seconds, in the estimator's metric); None where it
    has none: a config or problem it cannot express, or one it refuses."""
    nv_problem, kernel = problem_of(problem), kernel_of(config)
    if nv_problem is None or kernel is None:
        return None
    seconds = float(estimator(nv_problem, kernel))
    return seconds if seconds > 0 and math.isfinite(seconds) else None


def pick(candidates: Sequence[Any], problem: GemmProblem, configs: Sequence[Any], estimator: Estimator) -> Any:
    """The candidate of least estimate among those nvMMH can express, ties in `candidates`' order
    (the rules'); None when it can express none of them."""
    best, best_s = None, math.inf
    for candidate, config in zip(candidates, configs):
        seconds = estimate(problem, config, estimator)
        if seconds is not None and seconds < best_s:
            best, best_s = candidate, seconds
    return best


@dataclass(frozen=True)
class Descriptor:
    """nvMMH's predefined GPU for device names (torch's, as a sweep's `gpu` column holds them)."""

    pattern: str  # searched in the device name, first match wins
    gpu: str | None  # a NvMatmulHeuristicsNvidiaGpu member; None: nvMMH has none for this card
    arch: str


DESCRIPTORS = (Descriptor(r"H200 NVL", None, "sm_90"), Descriptor(r"H200", "H200_SXM", "sm_90"),
               Descriptor(r"H100 PCIe", "H100_PCIE", "sm_90"), Descriptor(r"H100 NVL", "H100_NVL", "sm_90"),
               Descriptor(r"H100", "H100_SXM", "sm_90"), Descriptor(r"H20\b", "H20_SXM", "sm_90"))


def gpu_of(names: Sequence[str], arch: str) -> str:
    """The nvMMH GPU of a key's device names; Unavailable unless they are one known card of `arch`
    (an arch alone names no card: sm_90 is H100 or H200)."""
    if len(names) != 1:
        raise Unavailable(f"the table's gpu column names {len(names)} devices ({', '.join(names) or 'none'}) for "
                          f"{arch}; nvMMH ranks for one GPU: evaluate one --arch with one gpu")
    found = next((d for d in DESCRIPTORS if re.search(d.pattern, names[0], re.IGNORECASE)), None)
    if found is None or found.gpu is None or found.arch != arch:
        raise Unavailable(f"nvMMH has no descriptor for {names[0]!r} on {arch}; known: "
                          + ", ".join(d.pattern for d in DESCRIPTORS if d.gpu))
    return found.gpu


def version() -> str | None:
    return installed_version(PACKAGE)


class Metric(enum.IntEnum):
    """nvMMH's nvmmhSiliconMetric_t values this module ranks by."""

    RUNTIME = 0  # its runtime estimate, as estimateRuntime gives it
    RELATIVE = 14  # RUNTIME_RELATIVE_FAST_S: "tuned for relative comparison", which its header recommends for ranking


class _Library:
    """nvMMH's estimate through its C API. The wrapper's estimateRuntime and estimateSiliconMetric
    (0.1.0.27) fail (a base method that does not exist; a target passed where the C function takes
    a backend), so this calls the C function the wrapper loads, with a TRITON backend."""

    def __init__(self, gpu: str, metric: Metric) -> None:
        try:
            import nvMatmulHeuristics as nv

            self.api = nv.NvMatmulHeuristicsInterfaceEx(backend=nv.NvMatmulHeuristicsTarget.TRITON,
                                                        load_discovery_implicitly=False,
                                                        gpu=nv.NvMatmulHeuristicsNvidiaGpu[gpu])
            self.backend = self.api.createBackend(nv.NvMatmulHeuristicsTarget.TRITON)
        except (ImportError, OSError, AssertionError, KeyError, RuntimeError) as e:  # missing, unloadable, other ABI
            raise Unavailable(f"nvMMH is not usable here ({type(e).__name__}: {e}); install the extra: "
                              "pip install 'tiledispatch[nvmmh]'") from None
        self.metric, self.loaded = metric, set()

    def __call__(self, problem: NvProblem, kernel: NvKernel) -> float:
        if (problem.precision, problem.layout) not in self.loaded:  # its calibration of this slice
            self.api.loadInternalDiscoverySet(int(problem.layout), precision=problem.precision)
            self.loaded.add((problem.precision, problem.layout))
        nv_problem = self.api.makeNvMatmulHeuristicsProblem(problem.m, problem.n, problem.k, int(problem.layout),
                                                            problem.batch)
        config = self.api.nvmmhKernelConfiguration()
        config.cta[:], config.warp[:], config.instr[:] = kernel.cta, kernel.warp, kernel.instr
        config.splitK, config.loadStages, config.gridSwizzle = kernel.split_k, kernel.stages, kernel.swizzle
        config.ctaOrder, config.cluster[:] = 0, (1, 1)
        return self.api.nvMatmulHeuristicsEstimateSiliconMetricEx(
            self.api.handle, problem.precision.encode("ascii"), self.backend, ctypes.byref(nv_problem),
            ctypes.byref(config), ctypes.c_int(self.metric), self.api.hardware_descriptor)


@functools.lru_cache(maxsize=None)
def library(gpu: str, metric: Metric = Metric.RELATIVE) -> Estimator:
    """nvMMH's estimator for predefined GPU `gpu` (H200_SXM, ...); raises Unavailable. It ranks by
    the metric nvMMH's header recommends for ordering kernels; Metric.RUNTIME is its plain estimate."""
    return _Library(gpu, Metric(metric))


def estimator_for(op: str, arch: str, gpus: Sequence[str],
                  load: Callable[[str], Estimator] | None = None) -> tuple[Estimator | None, str | None]:
    """The estimator that ranks a key's problems (`load`, default `library`, gives it for an nvMMH
    GPU), or None and why there is none."""
    if op != "gemm":
        return None, f"nvMMH ranks GEMM tiles only, not {op}"
    try:
        return (load or library)(gpu_of(sorted(set(map(str, gpus))), arch)), None
    except Unavailable as e:
        return None, str(e)
