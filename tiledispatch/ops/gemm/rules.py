"""The one validity predicate for GEMM configs, its auto-corrector, and `supports`.

Each rule is a member of `GemmRule`, so an error names the rule it breaks and tests
can check for exactly that rule.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import replace

from ...core.dtypes import DType
from ...core.errors import InvalidConfigError
from ...core.validation import Correction, Finding, Severity, ValidationResult
from . import vendor
from ...arch import Feature
from .config import AnyGemmConfig, Family, GemmConfig, VendorConfig
from .problem import Activation, GemmProblem, Layout

BLOCK_CHOICES = (16, 32, 64, 128, 256)
WARP_CHOICES = (1, 2, 4, 8, 16)
STAGE_CHOICES = tuple(range(1, 9))
# A K step longer than the output tile is wide pays where A has a few rows: each program then
# streams B in long runs of each column (tiled 16x32x512, gemv 1x2x2048); shared memory and
# registers bound the rest.
MAX_BLOCK_K = 2048
TMA_BOX_MAXIMUM = 256  # elements along each dim of one tensor-descriptor copy
MAX_SPLIT_K = 128
MAX_SPLIT_WORKSPACE_BYTES = 2 * 2**30  # split-K partial sums in fp32: beyond this the output is too large to need splits
# Registers left for addresses, operands and loop state besides the accumulator.
REGISTER_RESERVE = 64
WS_BARRIER_BYTES = 1024  # ws-persistent's ring barriers (sm_90 compiles: the tiles and staging + 240 B)
# The warp-specialised families' epilogue runs in the MMA warpgroups' registers: with bias and GELU,
# 128x256 tiles (128 accumulator registers a thread) spilled 208 B and ran 0.71-0.85x cuBLAS plus
# PyTorch's steps, where 128x128 tiles (64) ran 1.07-1.29x
# (results/h100/gemm_epilogue_spilling_tiles.csv).
WS_EPILOGUE_REGISTERS = 64
# A stream-K owner loads another program's fp32 partial tile beside its accumulator: on sm_90
# (ptxas, Triton 3.6) accumulators of 64 registers per thread compiled to 192-222 registers,
# those of 128 (128x128 over 4 warps, 128x256 over 8) spilled 100-190 bytes.
STREAM_K_MAX_ACCUMULATOR_REGISTERS = 64
# Why no Triton kernel takes a problem with `wide_offsets`: their pointer arithmetic is 32-bit,
# and an offset past it wraps to an address outside the tensor.
WIDE_OFFSETS = ("element offsets past 2**31 need 64-bit indexing, and the Triton kernels index in 32 bits; "
                "the vendor path (torch.matmul, on a GPU) takes it, or split the call into smaller tensors")


class GemmRule(enum.Enum):
    TILE_POWER_OF_TWO = "tile-power-of-two"
    TENSOR_CORE_MINIMUM = "tensor-core-minimum"
    TILE_MAXIMUM = "tile-maximum"
    WARPS = "warps"
    WARPS_FOR_TILE = "warps-for-tile"
    STAGES = "stages"
    GROUP_M = "group-m"
    SPLIT_K = "split-k"
    SHARED_MEMORY = "shared-memory"
    REGISTER_BUDGET = "register-budget"
    DTYPE_ARCH = "dtype-arch"
    TF32 = "tf32"
    ACCUMULATOR = "accumulator"
    OUTPUT_DTYPE = "output-dtype"
    FAMILY_ARCH = "family-arch"
    LAYOUT = "layout"
    PERSISTENT_OPTIONS = "persistent-options"
    GEMV_OPTIONS = "gemv-options"
    WS_OPTIONS = "ws-options"


def shared_memory_bytes(config: GemmConfig) -> int:
    """Bytes of shared memory the software pipeline holds: one A and one B tile per stage,
    and for TMA stores the staging buffer of one C slice."""
    t = config.types
    if config.family is Family.GEMV:  # its steps are loaded into registers (the final sum's scratch is small)
        return 0
    per_stage = config.block_m * config.block_k * t.a.itemsize + config.block_k * config.block_n * t.b.itemsize
    staging = 0
    if config.family.uses_tma:  # split-K stages fp32 partial sums
        c_bytes = 4 if config.split_k > 1 else t.c.itemsize
        staging = config.block_m * config.block_n // config.epilogue_split * c_bytes
    if config.family is Family.WS_PINGPONG:  # each warpgroup stages a whole tile of its own
        staging *= 2
    if config.family.warp_specialised:
        staging += WS_BARRIER_BYTES
    return max(config.num_stages, 1) * per_stage + staging


def accumulator_registers(config: GemmConfig) -> int:
    """32-bit registers per thread that the accumulator tile needs (gemv's holds a K step per column,
    beside the `num_stages` steps of B it loads ahead)."""
    if config.family is Family.GEMV:
        threads = config.num_warps * 32
        loaded = config.num_stages * config.block_n * config.block_k * config.types.b.itemsize / 4
        return math.ceil(config.block_n * config.block_k / threads) + math.ceil(loaded / threads)
    words = config.block_m * config.block_n * max(config.types.acc.itemsize, 4) // 4
    warps = 4 if config.family is Family.WS_PINGPONG else config.num_warps  # one warpgroup holds a whole tile
    return math.ceil(words / (warps * 32))


def _power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def validate(config: AnyGemmConfig, arch) -> ValidationResult:
    if isinstance(config, VendorConfig):
        return vendor.validate(config, arch)
    out: list[Finding] = []

    def error(rule, message, fix=None):
        out.append(Finding(rule, Severity.ERROR, message, fix))

    def warning(rule, message, fix=None):
        out.append(Finding(rule, Severity.WARNING, message, fix))

    t = config.types
    blocks = {"block_m": config.block_m, "block_n": config.block_n, "block_k": config.block_k}
    for field, value in blocks.items():
        if not _power_of_two(value):
            error(GemmRule.TILE_POWER_OF_TWO, f"{field}={value} is not a power of two (tl.arange needs one)",
                  f"use one of {BLOCK_CHOICES}")
    min_k = 32 if t.a.is_fp8 or t.b.is_fp8 else 16
    gemv = config.family is Family.GEMV  # no tensor cores: its work per program is a K step of each column
    if gemv:
        out.extend(_gemv_findings(config))
    elif config.block_m < 16 or config.block_n < 16 or config.block_k < min_k:
        error(GemmRule.TENSOR_CORE_MINIMUM,
              f"tile {config.block_m}x{config.block_n}x{config.block_k} is below the tensor-core minimum "
              f"16x16x{min_k} for {t.a.value}", f"block_m, block_n >= 16 and block_k >= {min_k}")
    if max(config.block_m, config.block_n) > 256 or config.block_k > MAX_BLOCK_K:
        error(GemmRule.TILE_MAXIMUM, f"tile {config.block_m}x{config.block_n}x{config.block_k} does not fit one "
              f"program", f"block_m and block_n <= 256, block_k <= {MAX_BLOCK_K}")
    if config.num_warps not in WARP_CHOICES:
        error(GemmRule.WARPS, f"num_warps={config.num_warps} is not one of {WARP_CHOICES}")
    elif config.block_m * config.block_n * (config.block_k if gemv else 1) < config.num_warps * 512:
        warning(GemmRule.WARPS_FOR_TILE,
                f"{config.num_warps} warps share a "
                + (f"{config.block_n}x{config.block_k} step" if gemv else f"{config.block_m}x{config.block_n} tile")
                + ": most would idle",
                "use fewer warps or a larger tile")
    if config.num_stages not in STAGE_CHOICES:
        error(GemmRule.STAGES, f"num_stages={config.num_stages} must be within 1..{STAGE_CHOICES[-1]}")
    if config.group_m < 1:
        error(GemmRule.GROUP_M, f"group_m={config.group_m} must be at least 1")
    if not 1 <= config.split_k <= MAX_SPLIT_K:
        error(GemmRule.SPLIT_K, f"split_k={config.split_k} must be within 1..{MAX_SPLIT_K}")

    if config.family.uses_tma:
        out.extend(_persistent_findings(config, arch))
    if config.family.warp_specialised:
        out.extend(_ws_findings(config, arch))
    if config.family is Family.STREAM_K and (config.split_k != 1 or config.epilogue_split != 1 or config.flatten):
        error(GemmRule.PERSISTENT_OPTIONS, "stream-k splits K by its own schedule and stores whole C tiles",
              "leave split_k, epilogue_split and flatten at 1, 1 and False (or use tma-persistent)")
    elif config.family in (Family.TILED, Family.GEMV) and (config.epilogue_split != 1 or config.flatten):
        error(GemmRule.PERSISTENT_OPTIONS, "epilogue_split and flatten belong to the tma-persistent family",
              f"leave them at 1 and False for the {config.family.value} family")

    smem = shared_memory_bytes(config)
    if smem > arch.shared_memory_per_block_optin:
        error(GemmRule.SHARED_MEMORY,
              f"{config.num_stages} stages of {config.block_m}x{config.block_k} and {config.block_k}x"
              f"{config.block_n} tiles need {smem} B of shared memory; {arch.name} allows "
              f"{arch.shared_memory_per_block_optin} B per block", "fewer stages or a smaller block_k")
    regs = accumulator_registers(config)
    if config.family is Family.STREAM_K and regs > STREAM_K_MAX_ACCUMULATOR_REGISTERS:
        error(GemmRule.REGISTER_BUDGET,
              f"stream-k adds fp32 partial tiles beside the accumulator: {regs} registers per thread for the "
              f"{config.block_m}x{config.block_n} accumulator over {config.num_warps} warps would spill",
              f"at most {STREAM_K_MAX_ACCUMULATOR_REGISTERS}: more warps or a smaller tile")
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    if regs > budget:
        error(GemmRule.REGISTER_BUDGET,
              f"the {config.block_m}x{config.block_n} accumulator needs {regs} registers per thread over "
              f"{config.num_warps} warps; at most {budget} fit beside the operands",
              "more warps or a smaller tile")
    elif regs > budget // 2 + 32:
        warning(GemmRule.REGISTER_BUDGET, f"the accumulator takes {regs} registers per thread: occupancy is 1 block")

    for role, dtype in (("A", t.a), ("B", t.b)):
        if dtype is DType.FP32:
            continue  # plain fp32 uses FMA where tensor cores lack it; tf32 is checked below
        if not arch.supports_dtype(dtype):
            error(GemmRule.DTYPE_ARCH, f"{role} dtype {dtype.value} has no tensor-core support on {arch.name}",
                  "use fp16, or a newer arch" if dtype.is_fp8 else "use fp16")
    if t.allow_tf32 and t.a is not DType.FP32:
        error(GemmRule.TF32, f"allow_tf32 applies to fp32 inputs only, not {t.a.value}")
    if t.acc not in (DType.FP32, DType.FP16) or (t.acc is DType.FP16 and {t.a, t.b, t.c} != {DType.FP16}):
        error(GemmRule.ACCUMULATOR, f"accumulator {t.acc.value} with {t.name}: use fp32 (fp16 only for all-fp16)")
    if t.c.is_fp8 or t.c is DType.FP64:
        error(GemmRule.OUTPUT_DTYPE, f"output dtype {t.c.value} is not supported", "use bf16, fp16 or fp32")
    elif not (t.a.is_fp8 or t.c in (t.a, DType.FP32)):
        error(GemmRule.OUTPUT_DTYPE, f"output dtype {t.c.value} with {t.a.value} inputs",
              f"use {t.a.value} or fp32")
    return ValidationResult(tuple(out))


def _gemv_findings(config: GemmConfig) -> list[Finding]:
    """gemv computes one row with CUDA-core FMAs over whole columns of B: no tensor-core minimum,
    but one row and no split."""
    out = []
    if config.block_m != 1 or config.split_k != 1 or config.block_k < 16:
        out.append(Finding(GemmRule.GEMV_OPTIONS, Severity.ERROR,
                           f"gemv reduces one row of A over the whole of K in steps of >= 16: block_m=1, "
                           f"split_k=1, not {config.block_m}x{config.block_n}x{config.block_k} with "
                           f"split_k={config.split_k}", "block_m=1, split_k=1, block_k >= 16 (or the tiled family)"))
    return out


def _persistent_findings(config: GemmConfig, arch) -> list[Finding]:
    """What the TMA families need: TMA, and descriptors with a unit-stride last dim."""
    out = []
    t, layout, family = config.types, config.layout, config.family.value
    if not arch.has(Feature.TMA):
        out.append(Finding(GemmRule.FAMILY_ARCH, Severity.ERROR,
                           f"{family} needs the tensor memory accelerator (sm_90+); {arch.name} has none",
                           "use the tiled family"))
    if Layout.STRIDED in (layout.a, layout.b) or layout.c is not Layout.ROW:
        out.append(Finding(GemmRule.LAYOUT, Severity.ERROR,
                           f"{family} reads A and B row- or column-major and writes C row-major, "
                           f"not {layout.name}", "use the tiled family for other strides"))
    elif (t.a.is_fp8 or t.a is DType.FP32) and (layout.a, layout.b) != (Layout.ROW, Layout.COL):
        out.append(Finding(GemmRule.LAYOUT, Severity.ERROR,
                           f"{t.a.value} tensor-core MMA reads both operands K-major: layout rcr, not {layout.name}"))
    if max(config.block_m, config.block_n, config.block_k) > TMA_BOX_MAXIMUM:
        out.append(Finding(GemmRule.TILE_MAXIMUM, Severity.ERROR,
                           f"a TMA copy moves at most {TMA_BOX_MAXIMUM} elements along each dim, not the "
                           f"{config.block_m}x{config.block_n}x{config.block_k} tile's",
                           f"block dims <= {TMA_BOX_MAXIMUM}, or the tiled family"))
    if config.epilogue_split not in (1, 2) or config.block_n // config.epilogue_split < 16:
        out.append(Finding(GemmRule.PERSISTENT_OPTIONS, Severity.ERROR,
                           f"epilogue_split={config.epilogue_split} must be 1 or 2 and leave slices of >= 16 "
                           f"columns (block_n={config.block_n})"))
    return out


def _ws_findings(config: GemmConfig, arch) -> list[Finding]:
    """The warp-specialised families are Gluon written for sm_90's warpgroup MMA: two warpgroups
    of 4 warps, on half of each tile's rows (ws-persistent: 64 or 128 each) or on tiles of their
    own (ws-pingpong: 64 or 128 rows), A and B K-major (nn.Linear's weight is), 16-bit or fp8
    operands into fp32, and every epilogue but a residual (bias and activation on 128x128 tiles)."""
    out = []
    t, family = config.types, config.family.value
    rows = (64, 128) if config.family is Family.WS_PINGPONG else (128, 256)
    if not arch.has(Feature.WGMMA):
        out.append(Finding(GemmRule.FAMILY_ARCH, Severity.ERROR,
                           f"{family} is written for Hopper's warpgroup MMA (sm_90); {arch.name} has none",
                           "use tma-persistent or the tiled family"))
    if (config.layout.a, config.layout.b) != (Layout.ROW, Layout.COL):
        out.append(Finding(GemmRule.LAYOUT, Severity.ERROR,
                           f"{family} reads A and B K-major (layout rcr), not {config.layout.name}",
                           "use tma-persistent"))
    if t.a is DType.FP32 or t.acc is not DType.FP32:
        out.append(Finding(GemmRule.PERSISTENT_OPTIONS, Severity.ERROR,
                           f"{family} computes 16-bit or fp8 products into fp32, not {t.name}",
                           "use tma-persistent (tf32) or the tiled family"))
    if config.epilogue.residual:
        out.append(Finding(GemmRule.PERSISTENT_OPTIONS, Severity.ERROR,
                           f"{family} adds no residual: beside a warpgroup's accumulator its addresses spill "
                           "(sm_90, 128x256 tiles: 2.8 KB a thread with bias and GELU)", "use tma-persistent"))
    regs = accumulator_registers(config)
    if (config.epilogue.bias or config.epilogue.activation is not Activation.NONE) and regs > WS_EPILOGUE_REGISTERS:
        out.append(Finding(GemmRule.REGISTER_BUDGET, Severity.ERROR,
                           f"{family} applies bias and activation beside the accumulator: {regs} registers a thread "
                           f"for the {config.block_m}x{config.block_n} tile spill (at most {WS_EPILOGUE_REGISTERS})",
                           "a 128x128 tile"))
    if config.split_k != 1 or config.epilogue_split != 1 or config.flatten:
        out.append(Finding(GemmRule.PERSISTENT_OPTIONS, Severity.ERROR,
                           f"{family} stores whole tiles by warpgroup, over the whole of K",
                           "leave split_k, epilogue_split and flatten at 1, 1 and False"))
    if config.num_warps != 8 or config.block_m not in rows:
        out.append(Finding(GemmRule.WS_OPTIONS, Severity.ERROR,
                           f"{family} runs two MMA warpgroups of 4 warps: num_warps=8 and block_m {rows[0]} or "
                           f"{rows[1]}, not {config.num_warps} warps on {config.block_m} rows",
                           f"num_warps=8, block_m={rows[0]} or {rows[1]}"))
    return out


# Fields the corrector may move, with how far a step of one power of two "costs".
_TUNABLE = {"block_m": 1.0, "block_n": 1.0, "block_k": 1.0, "num_warps": 1.0, "num_stages": 0.5}
_CHOICES = {"block_m": BLOCK_CHOICES, "block_n": BLOCK_CHOICES, "block_k": BLOCK_CHOICES,
            "num_warps": WARP_CHOICES, "num_stages": STAGE_CHOICES}
_GEMV_CHOICES = {**_CHOICES, "block_m": (1,), "block_n": (1, 2, 4, 8, 16, 32, 64),
                 "block_k": (16, 32, 64, 128, 256, 512, MAX_BLOCK_K)}
# Rules no tile change can fix: they are about what is computed, not how.
_SEMANTIC = {GemmRule.DTYPE_ARCH, GemmRule.TF32, GemmRule.ACCUMULATOR, GemmRule.OUTPUT_DTYPE,
             GemmRule.FAMILY_ARCH, GemmRule.LAYOUT, GemmRule.PERSISTENT_OPTIONS}


def _distance(old: GemmConfig, new: GemmConfig) -> float:
    total = 0.0
    for field, weight in _TUNABLE.items():
        a, b = max(getattr(old, field), 1), getattr(new, field)
        total += weight * abs(math.log2(b) - math.log2(a))
    return total


def auto_correct(config: AnyGemmConfig, arch) -> tuple[AnyGemmConfig, tuple[Correction, ...]]:
    """The valid config nearest to `config` (fewest powers of two moved), and what changed.

    Rules about what is computed (dtypes, accumulator, tf32) cannot be corrected by
    changing the tile; they raise InvalidConfigError naming the rule.
    """
    result = validate(config, arch)
    if result.ok:
        return config, ()
    semantic = result.broken_rules() & _SEMANTIC
    if semantic or isinstance(config, VendorConfig):  # the vendor path has nothing to tune
        semantic = semantic or result.broken_rules()
        raise InvalidConfigError(
            f"{config.name} cannot be corrected on {arch.name}: "
            + "; ".join(str(f) for f in result.errors if f.rule in semantic)
        )
    gemv = config.family is Family.GEMV
    base = replace(config, group_m=max(config.group_m, 1),
                   split_k=1 if gemv else min(max(config.split_k, 1), MAX_SPLIT_K))
    choices = _GEMV_CHOICES if gemv else _CHOICES
    best, best_distance = None, math.inf
    for values in itertools.product(*(choices[f] for f in _TUNABLE)):
        candidate = replace(base, **dict(zip(_TUNABLE, values)))
        distance = _distance(config, candidate)
        if distance < best_distance and validate(candidate, arch).ok:
            best, best_distance = candidate, distance
    if best is None:
        raise InvalidConfigError(f"no valid config near {config.name} on {arch.name}: {result.errors[0]}")
    rules = tuple(sorted(r.value for r in result.broken_rules()))
    corrections = tuple(
        Correction(field, getattr(config, field), getattr(best, field), rules)
        for field in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m", "split_k")
        if getattr(config, field) != getattr(best, field)
    )
    return best, corrections


def supports(config: AnyGemmConfig, problem: GemmProblem) -> str | None:
    """None if this kernel computes `problem`; else why not, in words."""
    if isinstance(config, VendorConfig):
        return vendor.supports(config, problem)
    if problem.wide_offsets:  # first: every Triton kernel refuses for this one reason, whatever else differs
        return WIDE_OFFSETS
    if config.types != problem.types:
        return f"built for {config.types.name}, the problem is {problem.types.name}"
    if config.epilogue != problem.epilogue:
        return f"built for epilogue {config.epilogue.name}, the problem needs {problem.epilogue.name}"
    for role in ("a", "b", "c"):
        want, have = getattr(config.layout, role), getattr(problem.layout, role)
        if want is not Layout.STRIDED and want is not have:
            return f"built for layout {config.layout.name}, the problem is {problem.layout.name}"
    if config.family is Family.GEMV and problem.m != 1:
        return f"gemv computes one row of A (M = 1); this problem has M={problem.m}: use the tiled family"
    if config.split_k > 1:
        workspace = problem.batch * config.split_k * problem.m * problem.n * 4
        if workspace > MAX_SPLIT_WORKSPACE_BYTES:
            return (f"split_k={config.split_k} needs a {workspace / 2**30:.1f} GiB fp32 workspace for this "
                    f"{problem.m}x{problem.n} output, over the {MAX_SPLIT_WORKSPACE_BYTES / 2**30:.0f} GiB limit; "
                    "split-K pays on small outputs: use fewer splits or split_k=1")
    unaligned = problem.alignment.unaligned_operands
    if config.realign and not unaligned:
        return "every operand is 16-byte aligned: nothing to realign (its twin without realign takes it as it is)"
    if config.realign and Layout.STRIDED in (problem.layout.a, problem.layout.b, problem.layout.c):
        return f"realign copies row- or column-major operands, not layout {problem.layout.name}"
    if config.family.uses_tma and unaligned and not config.realign:
        # TMA's rule, in bytes: a 16-byte aligned base and strides that are multiples of 16
        # bytes (Align.BYTES16 or better): rows of 1000 bf16 (2000 bytes) qualify.
        return (f"{config.family.value} needs 16-byte aligned base pointers and strides that are multiples of "
                f"16 bytes; {', '.join(unaligned)} {'is' if len(unaligned) == 1 else 'are'} not "
                "(its realign variant copies them into aligned buffers first)")
    return None
