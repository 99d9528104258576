"""The one validity predicate for attention configs, its auto-corrector, and `supports`; and the
rules the Triton families share (their tiles, their tensor descriptors, their warpgroups).

Each rule is a member of `AttentionRule`, so an error names the rule it breaks and tests
can check for exactly that rule. `validate`, `auto_correct`, `supports` and
`shared_memory_bytes` ask the config's family (`config.FAMILIES`); a family's module
(``families/``) holds its own rules and calls the shared ones below.
"""

from __future__ import annotations

import enum
import math

from ...arch import Feature
from ...core import family as core_family
from ...core.arith import next_power_of_2
from ...core.dtypes import DType
from ...core.errors import InvalidConfigError
from ...core.family import CorrectionSpace
from ...core.validation import Correction, Finding, Severity, ValidationResult
from .config import FAMILIES, AnyAttentionConfig, AttentionConfig
from .problem import DTYPES, FP8_DTYPES, HEAD_DIMS, AttentionProblem, Direction, UserMask

BLOCK_CHOICES = (16, 32, 64, 128, 256)
WARP_CHOICES = (1, 2, 4, 8, 16)
STAGE_CHOICES = tuple(range(1, 6))
REGISTER_RESERVE = 48
FEATURE_BYTES = 4096  # bias, mask and row statistics staged beside the tiles (sm_90 compiles: +4 KiB)
TMA_DTYPES = (DType.FP16, DType.BF16, DType.FP8E4M3)  # fp8: Q K^T on fp8 tensor cores (kernels/forward_tma.py)
# The warp-specialised (Gluon) families: fp16 and bf16, and their mbarriers beside the tiles.
WS_DTYPES = (DType.FP16, DType.BF16)
WS_BARRIER_BYTES = 1024  # fwd-ws stages no bias or mask (sm_90 compiles: tiles + 364 B)


class AttentionRule(enum.Enum):
    TILE_POWER_OF_TWO = "tile-power-of-two"
    TENSOR_CORE_MINIMUM = "tensor-core-minimum"
    TILE_MAXIMUM = "tile-maximum"
    HEAD_DIM = "head-dim"
    WARPS = "warps"
    STAGES = "stages"
    SHARED_MEMORY = "shared-memory"
    REGISTER_BUDGET = "register-budget"
    DTYPE_ARCH = "dtype-arch"
    FAMILY_ARCH = "family-arch"
    FAMILY_DIRECTION = "family-direction"
    FAMILY_DTYPE = "family-dtype"
    FAMILY_HEAD_DIM = "family-head-dim"
    WARPGROUP_ROWS = "warpgroup-rows"


def padded(d: int) -> int:
    """The head dim as a tile: the next power of two (80 -> 128, 192 -> 256)."""
    return next_power_of_2(d)


def power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def error(rule: AttentionRule, message: str, fix: str | None = None) -> Finding:
    return Finding(rule, Severity.ERROR, message, fix)


# -- the model of a tile's resources -----------------------------------------------------------
def forward_shared_bytes(config: AttentionConfig, extra: int) -> int:
    """A forward's software pipeline: the Q tile, plus a K and a V tile per stage, and `extra`
    (what the family stages beside them)."""
    size = config.dtype.itemsize
    qk, dv = padded(config.head_dim_qk), padded(config.head_dim_v)
    stages = max(config.num_stages, 1)
    return size * (config.block_m * qk + stages * config.block_n * (qk + dv)) + extra


def backward_shared_bytes(config: AttentionConfig, dq_staging: int) -> int:
    """A backward's: both its kernels (dK/dV owns K and V and streams Q and dO, dQ owns Q and dO
    and streams K and V) also stage P and dS (block_m x block_n) for the dots that read them
    transposed; `dq_staging` is what a family stages for dQ besides."""
    size = config.dtype.itemsize
    qk, dv = padded(config.head_dim_qk), padded(config.head_dim_v)
    stages = max(config.num_stages, 1)
    return size * (config.block_n * (qk + dv) + stages * config.block_m * (qk + dv)
                   + 2 * config.block_m * config.block_n) + dq_staging + FEATURE_BYTES


def shared_memory_bytes(config: AttentionConfig) -> int:
    """Shared memory the software pipeline of `config` holds (its family's `shared_memory`)."""
    return FAMILIES.of(config).shared_memory(config)


def accumulator_registers(config: AttentionConfig) -> int:
    """32-bit registers per thread for the fp32 tiles held across the loop.

    Forward: O (block_m x d_v) and the score block (block_m x block_n). Backward dK/dV:
    dK and dV (block_n x d), and the score and dP blocks.
    """
    qk, dv = padded(config.head_dim_qk), padded(config.head_dim_v)
    if config.direction is Direction.FORWARD:
        words = config.block_m * dv + config.block_m * config.block_n
    else:
        words = config.block_n * (qk + dv) + 2 * config.block_m * config.block_n
    return math.ceil(words / (config.num_warps * 32))


# -- the rules every Triton family keeps ---------------------------------------------------------
def tile_findings(config: AttentionConfig, arch, shared_bytes: int, takes_fp8: bool = False) -> list[Finding]:
    """What a Triton family's tile must be on `arch`: powers of two within the tensor cores' range,
    head dims, warps and stages, `shared_bytes` within the arch's shared memory, the fp32 tiles
    within the registers, and a dtype the arch (and, for fp8, the family: `takes_fp8`) runs."""
    out = []
    for field in ("block_m", "block_n"):
        value = getattr(config, field)
        if not power_of_two(value):
            out.append(error(AttentionRule.TILE_POWER_OF_TWO, f"{field}={value} is not a power of two (tl.arange "
                             "needs one)", f"use one of {BLOCK_CHOICES}"))
    if config.dtype in FP8_DTYPES and not takes_fp8:
        out.append(error(AttentionRule.FAMILY_DTYPE, f"{config.dtype.value} attention runs in the fwd-tma family "
                         f"only, not {config.family.value}", "use fwd-tma (sm_90+), or bf16 inputs"))
    if min(config.block_m, config.block_n) < 16:
        out.append(error(AttentionRule.TENSOR_CORE_MINIMUM, f"tile {config.block_m}x{config.block_n} is below the "
                         "tensor-core minimum 16x16", "block_m, block_n >= 16"))
    if max(config.block_m, config.block_n) > 256:
        out.append(error(AttentionRule.TILE_MAXIMUM, f"a block above 256 ({config.block_m}x{config.block_n})",
                         "use <= 256"))
    for field in ("head_dim_qk", "head_dim_v"):
        if getattr(config, field) not in HEAD_DIMS:
            out.append(error(AttentionRule.HEAD_DIM, f"{field}={getattr(config, field)} is not one of {HEAD_DIMS}"))
    if config.num_warps not in WARP_CHOICES:
        out.append(error(AttentionRule.WARPS, f"num_warps={config.num_warps} is not one of {WARP_CHOICES}"))
    if config.num_stages not in STAGE_CHOICES:
        out.append(error(AttentionRule.STAGES,
                         f"num_stages={config.num_stages} must be within 1..{STAGE_CHOICES[-1]}"))
    return out + _resource_findings(config, arch, shared_bytes)


def _resource_findings(config: AttentionConfig, arch, smem: int) -> list[Finding]:
    out = []
    if smem > arch.shared_memory_per_block_optin:
        out.append(error(AttentionRule.SHARED_MEMORY,
                         f"{config.num_stages} stages of {config.block_m}x{config.block_n} tiles with head dims "
                         f"{config.head_dim_qk}/{config.head_dim_v} need {smem} B of shared memory; {arch.name} "
                         f"allows {arch.shared_memory_per_block_optin} B per block", "fewer stages or smaller blocks"))
    regs = accumulator_registers(config)
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    if regs > budget:
        out.append(error(AttentionRule.REGISTER_BUDGET,
                         f"the fp32 tiles of {config.block_m}x{config.block_n} with head dims {config.head_dim_qk}/"
                         f"{config.head_dim_v} need {regs} registers per thread over {config.num_warps} warps; at "
                         f"most {budget} fit", "more warps or smaller blocks"))
    if config.dtype is not DType.FP32 and not arch.supports_dtype(config.dtype):
        where = "the interpreter (no bf16 tl.dot)" if arch.is_interpreter else arch.name
        out.append(error(AttentionRule.DTYPE_ARCH, f"{config.dtype.value} attention cannot run on {where}",
                         "use fp16"))
    if config.dtype not in DTYPES + FP8_DTYPES:
        out.append(error(AttentionRule.DTYPE_ARCH, f"{config.dtype.value} is not an attention dtype",
                         "use fp16 or bf16"))
    return out


def tma_findings(config: AttentionConfig, arch) -> list[Finding]:
    """What a tensor-descriptor family needs: TMA, half (or fp8) inputs, power-of-two head dims."""
    name, out = config.family.value, []
    if not arch.has(Feature.TMA):
        out.append(error(AttentionRule.FAMILY_ARCH, f"{name} needs the tensor memory accelerator (sm_90+); "
                         f"{arch.name} has none", "use the fwd family"))
    if config.dtype not in TMA_DTYPES:
        out.append(error(AttentionRule.FAMILY_DTYPE,
                         f"{name} takes {', '.join(d.value for d in TMA_DTYPES)}, not {config.dtype.value}",
                         "use the fwd family for fp32"))
    for field in ("head_dim_qk", "head_dim_v"):
        d = getattr(config, field)
        if not power_of_two(d):
            out.append(error(AttentionRule.FAMILY_HEAD_DIM, f"{name} loads whole head dims: {field}={d} is not a "
                             "power of two", "use the fwd family (it pads the head dim)"))
    return out


def warpgroup_findings(config: AttentionConfig, arch, *, head_dims: tuple[int, ...], owned: str, rows: int,
                       arch_fix: str, head_dim_fix: str) -> list[Finding]:
    """What a warp-specialised (Gluon) family needs: Hopper's warpgroup MMA, fp16 or bf16, equal
    head dims of `head_dims`, and two MMA warpgroups owning `rows` rows of the side a program owns
    (`owned`: block_m forward, block_n backward). The fixes name the families to use instead."""
    name, out = config.family.value, []
    if not arch.has(Feature.WGMMA):
        out.append(error(AttentionRule.FAMILY_ARCH, f"{name} is written for Hopper's warpgroup MMA (sm_90); "
                         f"{arch.name} has none", arch_fix))
    if config.dtype not in WS_DTYPES:
        out.append(error(AttentionRule.FAMILY_DTYPE, f"{name} takes fp16 and bf16, not {config.dtype.value}",
                         "use fwd-tma for fp8"))
    if config.head_dim_qk != config.head_dim_v or config.head_dim_qk not in head_dims:
        out.append(error(AttentionRule.FAMILY_HEAD_DIM, f"{name} takes equal head dims of {head_dims}, not "
                         f"{config.head_dim_qk}/{config.head_dim_v}", head_dim_fix))
    # One MMA warpgroup (64 rows over 4 warps) is correct, but in fwd-ws's first version on the
    # H100 it ran 0.79-0.83x of two (an A/B during bring-up, not kept), so the rule asks for two.
    if (config.num_warps, getattr(config, owned)) != (8, rows):
        out.append(error(AttentionRule.WARPGROUP_ROWS, f"{name} runs two MMA warpgroups owning {rows} rows at "
                         f"d={config.head_dim_qk}: {owned}={getattr(config, owned)} over {config.num_warps} warps",
                         f"{owned}={rows} over 8 warps"))
    return out


def loader_stages_findings(config: AttentionConfig) -> list[Finding]:
    """A warp-specialised family's loader runs num_stages - 1 blocks ahead of its MMA warps."""
    if config.num_stages >= 2:
        return []
    return [error(AttentionRule.STAGES, f"{config.family.value}'s loader runs num_stages - 1 blocks ahead of the "
                  f"MMA warps: num_stages={config.num_stages} leaves it none", "num_stages=2")]


def tile_supports(config: AttentionConfig, problem: AttentionProblem) -> str | None:
    """Why a Triton config cannot compute `problem` for its direction, dtype or head dims; else None."""
    if config.direction is not problem.direction:
        return f"a {config.direction.value} kernel, the problem is {problem.direction.value}"
    if config.dtype is not problem.dtype:
        return f"built for {config.dtype.value}, the problem is {problem.dtype.value}"
    if (config.head_dim_qk, config.head_dim_v) != (problem.head_dim_qk, problem.head_dim_v):
        return (f"built for head dims {config.head_dim_qk}/{config.head_dim_v}, the problem has "
                f"{problem.head_dim_qk}/{problem.head_dim_v}")
    return None


def tma_supports(config: AttentionConfig, problem: AttentionProblem, fallback: str) -> str | None:
    """What a tensor-descriptor family takes: bands, soft-cap, sinks and GQA, on 16-byte aligned
    operands. `fallback` names the pointer family that takes the rest."""
    v = problem.variant
    name = config.family.value
    extras = [what for what, on in (("a mask tensor", v.user_mask is not UserMask.NONE), ("a bias", v.bias),
                                    ("ALiBi", v.alibi), ("dropout", v.dropout), ("varlen", v.varlen)) if on]
    if extras:
        return f"{name} takes bands, soft-cap, sinks and GQA only, not {', '.join(extras)} (the {fallback} family does)"
    if not v.aligned:
        return f"{name} needs 16-byte aligned base pointers and strides (tensor descriptors); the operands are not"
    return None


TUNABLE = ("block_m", "block_n", "num_warps", "num_stages")
_CHOICES = {"block_m": BLOCK_CHOICES, "block_n": BLOCK_CHOICES, "num_warps": WARP_CHOICES,
            "num_stages": STAGE_CHOICES}
# Rules no tile change can fix: they are about what is computed, not how.
SEMANTIC = frozenset({AttentionRule.DTYPE_ARCH, AttentionRule.FAMILY_ARCH, AttentionRule.FAMILY_DIRECTION,
                      AttentionRule.HEAD_DIM, AttentionRule.FAMILY_DTYPE, AttentionRule.FAMILY_HEAD_DIM})


def tile_correction(config: AttentionConfig) -> CorrectionSpace:
    """A Triton family's correction space: every tile field over its choices, each power of two alike."""
    return CorrectionSpace(config, _CHOICES)


# -- the op's entry points: they ask the config's family -----------------------------------------
def validate(config: AnyAttentionConfig, arch) -> ValidationResult:
    try:
        family = FAMILIES.of(config)
    except InvalidConfigError as refusal:  # a family name on the other config type (a vendor's tile)
        return ValidationResult((error(AttentionRule.FAMILY_DIRECTION, str(refusal)),))
    return ValidationResult(tuple(family.validate(config, arch)))


def auto_correct(config: AnyAttentionConfig, arch) -> tuple[AnyAttentionConfig, tuple[Correction, ...]]:
    """The valid config nearest to `config` (fewest powers of two moved), and what changed.

    Rules about what is computed (dtype, head dim, family) raise InvalidConfigError naming the rule,
    as does a config its family cannot tune (the vendor's).
    """
    try:
        space = FAMILIES.of(config).correction(config)
    except InvalidConfigError:
        space = None
    return core_family.auto_correct(config, arch, validate=validate, semantic=SEMANTIC, space=space, fields=TUNABLE)


def supports(config: AnyAttentionConfig, problem: AttentionProblem) -> str | None:
    """None if this kernel computes `problem`; else why not, in words."""
    return FAMILIES.of(config).supports(config, problem)


def support_key(config: AnyAttentionConfig) -> tuple:
    """What `supports` reads of a config (`OpDefinition.support_key`): its family (whose check it
    is, and the direction it computes), dtype and head dims; a vendor config's direction. Configs
    of one key take or refuse every problem alike, so a ranking asks once per key (a class's 273
    kernels have 38): the tile never decides whether a kernel computes a problem."""
    return (type(config), config.family, config.dtype, config.direction, getattr(config, "head_dim_qk", None),
            getattr(config, "head_dim_v", None))
