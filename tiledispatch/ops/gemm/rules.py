"""The one validity predicate for GEMM configs, its auto-corrector, and `supports`.

Each rule is a member of `GemmRule`, so an error names the rule it breaks and tests can check
for exactly that rule. `validate`, `supports`, `auto_correct`, `shared_memory_bytes` and
`accumulator_registers` ask the config's family (``families/``); the rules every Triton family
shares (the tile's bounds, shared memory and registers, dtypes, what tensor descriptors need,
the problem's signature) are the helpers below, which the families call.
"""

from __future__ import annotations

import enum
import math
from dataclasses import replace
from typing import Iterable, Iterator, Mapping, Sequence

from ...arch import Feature
from ...core import family as core_family
from ...core.dtypes import DType
from ...core.validation import Correction, Finding, Severity, ValidationResult
from .config import AnyGemmConfig, GemmConfig
from .family import FAMILIES
from .problem import GemmLayout, GemmProblem, Layout

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


def error(rule: GemmRule, message: str, fix: str | None = None) -> Finding:
    return Finding(rule, Severity.ERROR, message, fix)


def warning(rule: GemmRule, message: str, fix: str | None = None) -> Finding:
    return Finding(rule, Severity.WARNING, message, fix)


# --- the op's functions: each asks the config's family ---------------------------------------

def validate(config: AnyGemmConfig, arch) -> ValidationResult:
    return ValidationResult(tuple(FAMILIES.of(config).validate(config, arch)))


def supports(config: AnyGemmConfig, problem: GemmProblem) -> str | None:
    """None if this kernel computes `problem`; else why not, in words."""
    return FAMILIES.of(config).supports(config, problem)


def support_key(config: AnyGemmConfig) -> tuple:
    """What `supports` reads of a config: its family (whose check it is), realign, split_k (its
    workspace) and its signature. Configs of one key take or refuse every problem alike."""
    return (config.family, getattr(config, "realign", False), getattr(config, "split_k", 1), config.types,
            config.epilogue, config.layout)


def shared_memory_bytes(config: GemmConfig) -> int:
    """Bytes of shared memory the software pipeline holds: one A and one B tile per stage,
    and for TMA stores the staging buffer of one C slice."""
    return FAMILIES.of(config).shared_memory_bytes(config)


def accumulator_registers(config: GemmConfig) -> int:
    """32-bit registers per thread that the accumulator tile needs."""
    return FAMILIES.of(config).accumulator_registers(config)


# Fields the corrector may move, with how far a step of one power of two "costs".
TUNABLE = {"block_m": 1.0, "block_n": 1.0, "block_k": 1.0, "num_warps": 1.0, "num_stages": 0.5}
CHOICES = {"block_m": BLOCK_CHOICES, "block_n": BLOCK_CHOICES, "block_k": BLOCK_CHOICES,
           "num_warps": WARP_CHOICES, "num_stages": STAGE_CHOICES}
# Rules no tile change can fix: they are about what is computed, not how.
SEMANTIC = frozenset({GemmRule.DTYPE_ARCH, GemmRule.TF32, GemmRule.ACCUMULATOR, GemmRule.OUTPUT_DTYPE,
                      GemmRule.FAMILY_ARCH, GemmRule.LAYOUT, GemmRule.PERSISTENT_OPTIONS})
_CORRECTED = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m", "split_k")


def auto_correct(config: AnyGemmConfig, arch) -> tuple[AnyGemmConfig, tuple[Correction, ...]]:
    """The valid config nearest to `config` (fewest powers of two moved), and what changed.

    Rules about what is computed (dtypes, accumulator, tf32) cannot be corrected by
    changing the tile; they raise InvalidConfigError naming the rule, as does the vendor
    path, which has nothing to tune.
    """
    return core_family.auto_correct(config, arch, validate=validate, semantic=SEMANTIC,
                                    space=FAMILIES.of(config).correction(config), fields=_CORRECTED)


def tile_correction(config: GemmConfig, choices: Mapping[str, Sequence[int]] = CHOICES,
                    split_k: int | None = None) -> core_family.CorrectionSpace:
    """The corrector's space for a tile: `choices` for the tunable fields, group_m at least 1,
    split_k within 1..MAX_SPLIT_K (or fixed at `split_k`)."""
    split = min(max(config.split_k, 1), MAX_SPLIT_K) if split_k is None else split_k
    base = replace(config, group_m=max(config.group_m, 1), split_k=split)
    return core_family.CorrectionSpace(base, {name: choices[name] for name in TUNABLE}, TUNABLE)


# --- rules every Triton family shares ----------------------------------------------------------

def _power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def tensor_core_minimum(config: GemmConfig) -> list[Finding]:
    """A tensor-core MMA's smallest tile: 16x16x16 (x32 in fp8)."""
    t = config.types
    min_k = 32 if t.a.is_fp8 or t.b.is_fp8 else 16
    if config.block_m < 16 or config.block_n < 16 or config.block_k < min_k:
        return [error(GemmRule.TENSOR_CORE_MINIMUM,
                      f"tile {config.block_m}x{config.block_n}x{config.block_k} is below the tensor-core minimum "
                      f"16x16x{min_k} for {t.a.value}", f"block_m, block_n >= 16 and block_k >= {min_k}")]
    return []


def tile_findings(config: GemmConfig, minimum: Iterable[Finding], work: int, work_name: str) -> Iterator[Finding]:
    """The tile's bounds: powers of two, the family's `minimum` findings, the maxima, warps for
    `work` elements a program (`work_name` in words), stages, group_m and split_k."""
    blocks = {"block_m": config.block_m, "block_n": config.block_n, "block_k": config.block_k}
    for name, value in blocks.items():
        if not _power_of_two(value):
            yield error(GemmRule.TILE_POWER_OF_TWO, f"{name}={value} is not a power of two (tl.arange needs one)",
                        f"use one of {BLOCK_CHOICES}")
    yield from minimum
    if max(config.block_m, config.block_n) > 256 or config.block_k > MAX_BLOCK_K:
        yield error(GemmRule.TILE_MAXIMUM, f"tile {config.block_m}x{config.block_n}x{config.block_k} does not fit one "
                    f"program", f"block_m and block_n <= 256, block_k <= {MAX_BLOCK_K}")
    if config.num_warps not in WARP_CHOICES:
        yield error(GemmRule.WARPS, f"num_warps={config.num_warps} is not one of {WARP_CHOICES}")
    elif work < config.num_warps * 512:
        yield warning(GemmRule.WARPS_FOR_TILE, f"{config.num_warps} warps share a {work_name}: most would idle",
                      "use fewer warps or a larger tile")
    if config.num_stages not in STAGE_CHOICES:
        yield error(GemmRule.STAGES, f"num_stages={config.num_stages} must be within 1..{STAGE_CHOICES[-1]}")
    if config.group_m < 1:
        yield error(GemmRule.GROUP_M, f"group_m={config.group_m} must be at least 1")
    if not 1 <= config.split_k <= MAX_SPLIT_K:
        yield error(GemmRule.SPLIT_K, f"split_k={config.split_k} must be within 1..{MAX_SPLIT_K}")


def output_tile_findings(config: GemmConfig, minimum: Iterable[Finding]) -> Iterator[Finding]:
    """`tile_findings` for a family whose program computes a block_m x block_n output tile."""
    return tile_findings(config, minimum, config.block_m * config.block_n,
                         f"{config.block_m}x{config.block_n} tile")


def pointer_options(config: GemmConfig) -> Iterator[Finding]:
    """A pointer family (no tensor descriptors) has no C slices to store and no pipeline across tiles."""
    if config.epilogue_split != 1 or config.flatten:
        yield error(GemmRule.PERSISTENT_OPTIONS, "epilogue_split and flatten belong to the tma-persistent family",
                    f"leave them at 1 and False for the {config.family.value} family")


def shared_memory_findings(config: GemmConfig, arch) -> Iterator[Finding]:
    smem = shared_memory_bytes(config)
    if smem > arch.shared_memory_per_block_optin:
        yield error(GemmRule.SHARED_MEMORY,
                    f"{config.num_stages} stages of {config.block_m}x{config.block_k} and {config.block_k}x"
                    f"{config.block_n} tiles need {smem} B of shared memory; {arch.name} allows "
                    f"{arch.shared_memory_per_block_optin} B per block", "fewer stages or a smaller block_k")


def register_findings(config: GemmConfig, arch) -> Iterator[Finding]:
    regs = accumulator_registers(config)
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    if regs > budget:
        yield error(GemmRule.REGISTER_BUDGET,
                    f"the {config.block_m}x{config.block_n} accumulator needs {regs} registers per thread over "
                    f"{config.num_warps} warps; at most {budget} fit beside the operands",
                    "more warps or a smaller tile")
    elif regs > budget // 2 + 32:
        yield warning(GemmRule.REGISTER_BUDGET,
                      f"the accumulator takes {regs} registers per thread: occupancy is 1 block")


def dtype_findings(config: GemmConfig, arch) -> Iterator[Finding]:
    """What the arch's tensor cores take, and which accumulator and output go with the inputs."""
    t = config.types
    for role, dtype in (("A", t.a), ("B", t.b)):
        if dtype is DType.FP32:
            continue  # plain fp32 uses FMA where tensor cores lack it; tf32 is checked below
        if not arch.supports_dtype(dtype):
            yield error(GemmRule.DTYPE_ARCH, f"{role} dtype {dtype.value} has no tensor-core support on {arch.name}",
                        "use fp16, or a newer arch" if dtype.is_fp8 else "use fp16")
    if t.allow_tf32 and t.a is not DType.FP32:
        yield error(GemmRule.TF32, f"allow_tf32 applies to fp32 inputs only, not {t.a.value}")
    if t.acc not in (DType.FP32, DType.FP16) or (t.acc is DType.FP16 and {t.a, t.b, t.c} != {DType.FP16}):
        yield error(GemmRule.ACCUMULATOR, f"accumulator {t.acc.value} with {t.name}: use fp32 (fp16 only for all-fp16)")
    if t.c.is_fp8 or t.c is DType.FP64:
        yield error(GemmRule.OUTPUT_DTYPE, f"output dtype {t.c.value} is not supported", "use bf16, fp16 or fp32")
    elif not (t.a.is_fp8 or t.c in (t.a, DType.FP32)):
        yield error(GemmRule.OUTPUT_DTYPE, f"output dtype {t.c.value} with {t.a.value} inputs",
                    f"use {t.a.value} or fp32")


def resource_and_dtype_findings(config: GemmConfig, arch) -> Iterator[Finding]:
    """Shared memory, registers and dtypes: the rules that close every Triton family's list."""
    yield from shared_memory_findings(config, arch)
    yield from register_findings(config, arch)
    yield from dtype_findings(config, arch)


def pipeline_bytes(config: GemmConfig, staging: int = 0) -> int:
    """Shared memory of a software pipeline: one A and one B tile per stage, plus `staging`."""
    t = config.types
    per_stage = config.block_m * config.block_k * t.a.itemsize + config.block_k * config.block_n * t.b.itemsize
    return max(config.num_stages, 1) * per_stage + staging


def c_staging_bytes(config: GemmConfig) -> int:
    """A TMA store's staging buffer: one slice of the C tile (split-K stages fp32 partial sums)."""
    c_bytes = 4 if config.split_k > 1 else config.types.c.itemsize
    return config.block_m * config.block_n // config.epilogue_split * c_bytes


def tile_registers(config: GemmConfig, warps: int) -> int:
    """32-bit registers per thread for a block_m x block_n accumulator held by `warps` warps."""
    words = config.block_m * config.block_n * max(config.types.acc.itemsize, 4) // 4
    return math.ceil(words / (warps * 32))


# --- tensor descriptors (the TMA families) ----------------------------------------------------

_K_MAJOR = GemmLayout.parse("rcr")


def tma_findings(config: GemmConfig, arch) -> Iterator[Finding]:
    """What the TMA families need: TMA, and descriptors with a unit-stride last dim."""
    t, layout, family = config.types, config.layout, config.family.value
    if not arch.has(Feature.TMA):
        yield error(GemmRule.FAMILY_ARCH,
                    f"{family} needs the tensor memory accelerator (sm_90+); {arch.name} has none",
                    "use the tiled family")
    if Layout.STRIDED in (layout.a, layout.b) or layout.c is not Layout.ROW:
        yield error(GemmRule.LAYOUT, f"{family} reads A and B row- or column-major and writes C row-major, "
                    f"not {layout.name}", "use the tiled family for other strides")
    elif (t.a.is_fp8 or t.a is DType.FP32) and (layout.a, layout.b) != (Layout.ROW, Layout.COL):
        yield error(GemmRule.LAYOUT,
                    f"{t.a.value} tensor-core MMA reads both operands K-major: layout rcr, not {layout.name}")
    if max(config.block_m, config.block_n, config.block_k) > TMA_BOX_MAXIMUM:
        yield error(GemmRule.TILE_MAXIMUM, f"a TMA copy moves at most {TMA_BOX_MAXIMUM} elements along each dim, not "
                    f"the {config.block_m}x{config.block_n}x{config.block_k} tile's",
                    f"block dims <= {TMA_BOX_MAXIMUM}, or the tiled family")
    if config.epilogue_split not in (1, 2) or config.block_n // config.epilogue_split < 16:
        yield error(GemmRule.PERSISTENT_OPTIONS, f"epilogue_split={config.epilogue_split} must be 1 or 2 and leave "
                    f"slices of >= 16 columns (block_n={config.block_n})")


def tma_fits(config: GemmConfig) -> bool:
    """The signatures a TMA family is bound to: a contiguous last dim (no `s`), and for fp8 and
    tf32 MMAs, which read K-major operands, layout rcr."""
    if config.types.a.is_fp8 or config.types.a is DType.FP32:
        return config.layout == _K_MAJOR
    return "s" not in config.layout.name


def tma_alignment_reason(config: GemmConfig, problem: GemmProblem) -> str | None:
    """TMA's rule, in bytes: a 16-byte aligned base and strides that are multiples of 16 bytes
    (Align.BYTES16 or better): rows of 1000 bf16 (2000 bytes) qualify."""
    unaligned = problem.alignment.unaligned_operands
    if unaligned:
        return (f"{config.family.value} needs 16-byte aligned base pointers and strides that are multiples of "
                f"16 bytes; {', '.join(unaligned)} {'is' if len(unaligned) == 1 else 'are'} not "
                "(its realign variant copies them into aligned buffers first)")
    return None


# --- what a Triton config computes, against a problem ------------------------------------------

def signature_reason(config: AnyGemmConfig, problem: GemmProblem) -> str | None:
    """Why a config built for other types or another epilogue cannot compute `problem`."""
    if config.types != problem.types:
        return f"built for {config.types.name}, the problem is {problem.types.name}"
    if config.epilogue != problem.epilogue:
        return f"built for epilogue {config.epilogue.name}, the problem needs {problem.epilogue.name}"
    return None


def triton_reason(config: GemmConfig, problem: GemmProblem) -> str | None:
    """What every Triton kernel needs of a problem: 32-bit offsets, its signature, and its
    layout (a strided config takes any)."""
    if problem.wide_offsets:  # first: every Triton kernel refuses for this one reason, whatever else differs
        return WIDE_OFFSETS
    reason = signature_reason(config, problem)
    if reason is not None:
        return reason
    for role in ("a", "b", "c"):
        want, have = getattr(config.layout, role), getattr(problem.layout, role)
        if want is not Layout.STRIDED and want is not have:
            return f"built for layout {config.layout.name}, the problem is {problem.layout.name}"
    return None


def split_reason(config: GemmConfig, problem: GemmProblem) -> str | None:
    """Split-K's fp32 workspace must stay within MAX_SPLIT_WORKSPACE_BYTES."""
    if config.split_k > 1:
        workspace = problem.batch * config.split_k * problem.m * problem.n * 4
        if workspace > MAX_SPLIT_WORKSPACE_BYTES:
            return (f"split_k={config.split_k} needs a {workspace / 2**30:.1f} GiB fp32 workspace for this "
                    f"{problem.m}x{problem.n} output, over the {MAX_SPLIT_WORKSPACE_BYTES / 2**30:.0f} GiB limit; "
                    "split-K pays on small outputs: use fewer splits or split_k=1")
    return None


def tile_reason(config: GemmConfig, problem: GemmProblem) -> str | None:
    """`triton_reason`, then `split_reason`: what a tile family with no rule of its own checks."""
    return triton_reason(config, problem) or split_reason(config, problem)


def tma_tile_reason(config: GemmConfig, problem: GemmProblem) -> str | None:
    """`tile_reason`, then TMA's alignment: what a TMA family with no rule of its own checks."""
    return tile_reason(config, problem) or tma_alignment_reason(config, problem)
