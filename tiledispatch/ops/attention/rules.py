"""The one validity predicate for attention configs, its auto-corrector, and `supports`.

Each rule is a member of `AttentionRule`, so an error names the rule it breaks and tests
can check for exactly that rule.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import replace

import triton

from ...arch import Feature
from ...core.dtypes import DType
from ...core.errors import InvalidConfigError
from ...core.validation import Correction, Finding, Severity, ValidationResult
from . import vendor
from .config import AnyAttentionConfig, AttentionConfig, Family, VendorConfig
from .problem import DTYPES, FP8_DTYPES, HEAD_DIMS, AttentionProblem, Direction, UserMask

BLOCK_CHOICES = (16, 32, 64, 128, 256)
WARP_CHOICES = (1, 2, 4, 8, 16)
STAGE_CHOICES = tuple(range(1, 6))
REGISTER_RESERVE = 48
FEATURE_BYTES = 4096  # bias, mask and row statistics staged beside the tiles (sm_90 compiles: +4 KiB)
TMA_DTYPES = (DType.FP16, DType.BF16, DType.FP8E4M3)  # fp8: Q K^T on fp8 tensor cores (kernels/forward_tma.py)
# fwd-ws (kernels/forward_ws.py): one warpgroup per 64 query rows, and O staged in Q's buffer.
WS_DTYPES = (DType.FP16, DType.BF16)
WS_HEAD_DIMS = (64, 128, 256)  # 256: 128 x 64 tiles over 2 stages only (shared memory)
WS_BARRIER_BYTES = 1024  # its mbarriers; it stages no bias or mask (sm_90 compiles: tiles + 364 B)
# bwd-ws (kernels/backward_ws.py): dK and dV of 64 keys a warpgroup stay in registers, with the
# score blocks of block_m query rows: at d=128 and 64 rows ptxas spilled 500 B, at 32 none
# (sm_90 compiles); 64 rows at d=64 do not spill. At d=256 one warpgroup cannot hold both: the
# two split by role over 64 keys (kernels/backward_ws_wide.py), one holding dV, the other dK.
# At d=64 and 128 the role split ran 0.72-0.89x the kernel above (timed in turns on the H100),
# so it serves d=256 alone.
BWD_WS_HEAD_DIMS = (64, 128, 256)
BWD_WS_WIDE_HEAD_DIMS = (256,)
BWD_WS_QUERY_BLOCKS = (32, 64)
# Its dQ stage owns 128 query rows (64 a warpgroup, with S, dP and dQ in registers) and steps
# keys by head dim: at d=128, 128 keys would hold 192 accumulator registers a thread. At d=64,
# where 128 fit, they ran within 1 % of 64 (timed in turns on the H100), and 32 at d=128 0.6 %
# slower. At d=256, 32: dQ is 128 registers, and Q and dO take 128 KiB of shared memory.
BWD_WS_DQ_ROWS = 128


def bwd_ws_keys(config: AttentionConfig) -> int:
    """Keys a bwd-ws dK/dV program owns: two warpgroups' 64, or at wide heads 64 shared by both."""
    return 64 if config.head_dim_qk in BWD_WS_WIDE_HEAD_DIMS else 128


def bwd_ws_dq_keys(config: AttentionConfig) -> int:
    """Keys a bwd-ws dQ program steps (see BWD_WS_DQ_ROWS)."""
    return 32 if config.head_dim_qk > 128 else 64


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
    return triton.next_power_of_2(d)


def shared_memory_bytes(config: AttentionConfig) -> int:
    """Shared memory the software pipeline holds.

    Forward: the Q tile, plus a K and a V tile per stage. Backward (dK/dV): the K and V
    tiles, plus a Q and a dO tile per stage; `bwd-atomic` also stages the fp32 dQ block it
    adds atomically (sm_90 compiles: +64 KiB at d=256 and 64 query rows, which took its dK/dV
    kernel to 257 KiB, past the 227 KiB limit, where the estimate without it said 212 KiB).
    """
    size = config.dtype.itemsize
    qk, dv = padded(config.head_dim_qk), padded(config.head_dim_v)
    stages = max(config.num_stages, 1)
    if config.direction is Direction.FORWARD:
        extra = WS_BARRIER_BYTES if config.family is Family.FWD_WS else FEATURE_BYTES
        return size * (config.block_m * qk + stages * config.block_n * (qk + dv)) + extra
    # The backward (both its kernels: dK/dV owns K and V and streams Q and dO, dQ owns Q and
    # dO and streams K and V) also stages P and dS (block_m x block_n) for the dots that
    # read them transposed.
    if config.family is Family.BWD_WS:  # rows of one side stay, blocks of the other stream; P, dS in registers
        dkdv = size * (config.block_n + stages * config.block_m) * (qk + dv)
        if config.head_dim_qk in BWD_WS_WIDE_HEAD_DIMS:  # P^T handed between the warpgroups, fp32 a stage
            dkdv += stages * config.block_n * config.block_m * 4
        dq = size * (BWD_WS_DQ_ROWS + stages * bwd_ws_dq_keys(config)) * (qk + dv)
        return max(dkdv, dq) + WS_BARRIER_BYTES
    dq_staging = 4 * config.block_m * qk if config.family is Family.BWD_ATOMIC else 0
    return size * (config.block_n * (qk + dv) + stages * config.block_m * (qk + dv)
                   + 2 * config.block_m * config.block_n) + dq_staging + FEATURE_BYTES


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


def _power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def validate(config: AnyAttentionConfig, arch) -> ValidationResult:
    if isinstance(config, VendorConfig):
        return vendor.validate(config, arch)
    out: list[Finding] = []

    def error(rule, message, fix=None):
        out.append(Finding(rule, Severity.ERROR, message, fix))

    if config.family.direction is None:
        error(AttentionRule.FAMILY_DIRECTION, f"{config.family.value} is a vendor family; use VendorConfig")
        return ValidationResult(tuple(out))
    for field in ("block_m", "block_n"):
        value = getattr(config, field)
        if not _power_of_two(value):
            error(AttentionRule.TILE_POWER_OF_TWO, f"{field}={value} is not a power of two (tl.arange needs one)",
                  f"use one of {BLOCK_CHOICES}")
    if config.dtype in FP8_DTYPES and config.family is not Family.FWD_TMA:
        error(AttentionRule.FAMILY_DTYPE, f"{config.dtype.value} attention runs in the fwd-tma family only, not "
              f"{config.family.value}", "use fwd-tma (sm_90+), or bf16 inputs")
    if min(config.block_m, config.block_n) < 16:
        error(AttentionRule.TENSOR_CORE_MINIMUM, f"tile {config.block_m}x{config.block_n} is below the "
              "tensor-core minimum 16x16", "block_m, block_n >= 16")
    if max(config.block_m, config.block_n) > 256:
        error(AttentionRule.TILE_MAXIMUM, f"a block above 256 ({config.block_m}x{config.block_n})", "use <= 256")
    for field in ("head_dim_qk", "head_dim_v"):
        if getattr(config, field) not in HEAD_DIMS:
            error(AttentionRule.HEAD_DIM, f"{field}={getattr(config, field)} is not one of {HEAD_DIMS}")
    if config.num_warps not in WARP_CHOICES:
        error(AttentionRule.WARPS, f"num_warps={config.num_warps} is not one of {WARP_CHOICES}")
    if config.num_stages not in STAGE_CHOICES:
        error(AttentionRule.STAGES, f"num_stages={config.num_stages} must be within 1..{STAGE_CHOICES[-1]}")
    smem = shared_memory_bytes(config)
    if smem > arch.shared_memory_per_block_optin:
        error(AttentionRule.SHARED_MEMORY,
              f"{config.num_stages} stages of {config.block_m}x{config.block_n} tiles with head dims "
              f"{config.head_dim_qk}/{config.head_dim_v} need {smem} B of shared memory; {arch.name} allows "
              f"{arch.shared_memory_per_block_optin} B per block", "fewer stages or smaller blocks")
    regs = accumulator_registers(config)
    budget = arch.registers_per_thread_max - REGISTER_RESERVE
    if regs > budget:
        error(AttentionRule.REGISTER_BUDGET,
              f"the fp32 tiles of {config.block_m}x{config.block_n} with head dims {config.head_dim_qk}/"
              f"{config.head_dim_v} need {regs} registers per thread over {config.num_warps} warps; at most "
              f"{budget} fit", "more warps or smaller blocks")
    if config.dtype is not DType.FP32 and not arch.supports_dtype(config.dtype):
        where = "the interpreter (no bf16 tl.dot)" if arch.is_interpreter else arch.name
        error(AttentionRule.DTYPE_ARCH, f"{config.dtype.value} attention cannot run on {where}", "use fp16")
    if config.dtype not in DTYPES + FP8_DTYPES:
        error(AttentionRule.DTYPE_ARCH, f"{config.dtype.value} is not an attention dtype", "use fp16 or bf16")
    if config.family.uses_tma:
        _tma_findings(config, arch, error)
    if config.family.warp_specialised:
        _ws_findings(config, arch, error)
    return ValidationResult(tuple(out))


def _ws_findings(config: AttentionConfig, arch, error) -> None:
    """What the warp-specialised families need: Hopper's warpgroup MMA, and a warpgroup per 64 rows
    of the side a program owns (queries forward, keys backward)."""
    name = config.family.value
    forward = config.direction is Direction.FORWARD
    if not arch.has(Feature.WGMMA):
        error(AttentionRule.FAMILY_ARCH, f"{name} is written for Hopper's warpgroup MMA (sm_90); {arch.name} has "
              "none", "use fwd-tma or fwd" if forward else "use bwd")
    if config.dtype not in WS_DTYPES:
        error(AttentionRule.FAMILY_DTYPE, f"{name} takes fp16 and bf16, not {config.dtype.value}",
              "use fwd-tma for fp8")
    head_dims = WS_HEAD_DIMS if forward else BWD_WS_HEAD_DIMS
    if config.head_dim_qk != config.head_dim_v or config.head_dim_qk not in head_dims:
        error(AttentionRule.FAMILY_HEAD_DIM, f"{name} takes equal head dims of {head_dims}, not "
              f"{config.head_dim_qk}/{config.head_dim_v}", "use fwd-tma" if forward else "use bwd")
    # One MMA warpgroup (64 rows over 4 warps) is correct, but in fwd-ws's first version on the
    # H100 it ran 0.79-0.83x of two (an A/B during bring-up, not kept), so the rule asks for two.
    owned, field = (config.block_m, "block_m") if forward else (config.block_n, "block_n")
    rows = 128 if forward else bwd_ws_keys(config)
    if (config.num_warps, owned) != (8, rows):
        error(AttentionRule.WARPGROUP_ROWS, f"{name} runs two MMA warpgroups owning {rows} rows at "
              f"d={config.head_dim_qk}: {field}={owned} over {config.num_warps} warps", f"{field}={rows} over 8 warps")
    most_rows = 64 if config.head_dim_qk <= 64 else 32
    if not forward and (config.block_m not in BWD_WS_QUERY_BLOCKS or config.block_m > most_rows):
        error(AttentionRule.WARPGROUP_ROWS, f"bwd-ws steps 32 query rows, or 64 at d=64, not {config.block_m} at "
              f"d={config.head_dim_qk}: the score blocks and dK, dV outgrow a warpgroup's registers",
              "block_m=32")
    if config.num_stages < 2:
        error(AttentionRule.STAGES, f"{name}'s loader runs num_stages - 1 blocks ahead of the MMA warps: "
              f"num_stages={config.num_stages} leaves it none", "num_stages=2")


def _tma_findings(config: AttentionConfig, arch, error) -> None:
    """What the tensor-descriptor forward needs: TMA, half inputs, power-of-two head dims."""
    name = config.family.value
    if not arch.has(Feature.TMA):
        error(AttentionRule.FAMILY_ARCH, f"{name} needs the tensor memory accelerator (sm_90+); {arch.name} has "
              "none", "use the fwd family")
    if config.dtype not in TMA_DTYPES:
        error(AttentionRule.FAMILY_DTYPE,
              f"{name} takes {', '.join(d.value for d in TMA_DTYPES)}, not {config.dtype.value}",
              "use the fwd family for fp32")
    for field in ("head_dim_qk", "head_dim_v"):
        d = getattr(config, field)
        if not _power_of_two(d):
            error(AttentionRule.FAMILY_HEAD_DIM, f"{name} loads whole head dims: {field}={d} is not a power of "
                  "two", "use the fwd family (it pads the head dim)")


_TUNABLE = ("block_m", "block_n", "num_warps", "num_stages")
_CHOICES = {"block_m": BLOCK_CHOICES, "block_n": BLOCK_CHOICES, "num_warps": WARP_CHOICES,
            "num_stages": STAGE_CHOICES}
# Rules no tile change can fix: they are about what is computed, not how.
_SEMANTIC = {AttentionRule.DTYPE_ARCH, AttentionRule.FAMILY_ARCH, AttentionRule.FAMILY_DIRECTION,
             AttentionRule.HEAD_DIM, AttentionRule.FAMILY_DTYPE, AttentionRule.FAMILY_HEAD_DIM}


def _distance(old: AttentionConfig, new: AttentionConfig) -> float:
    return sum(abs(math.log2(getattr(new, f)) - math.log2(max(getattr(old, f), 1))) for f in _TUNABLE)


def auto_correct(config: AnyAttentionConfig, arch) -> tuple[AnyAttentionConfig, tuple[Correction, ...]]:
    """The valid config nearest to `config` (fewest powers of two moved), and what changed.

    Rules about what is computed (dtype, head dim, family) raise InvalidConfigError naming the rule.
    """
    result = validate(config, arch)
    if result.ok:
        return config, ()
    semantic = result.broken_rules() & _SEMANTIC
    if semantic or isinstance(config, VendorConfig):
        semantic = semantic or result.broken_rules()
        raise InvalidConfigError(f"{config.name} cannot be corrected on {arch.name}: "
                                 + "; ".join(str(f) for f in result.errors if f.rule in semantic))
    best, best_distance = None, math.inf
    for values in itertools.product(*(_CHOICES[f] for f in _TUNABLE)):
        candidate = replace(config, **dict(zip(_TUNABLE, values)))
        distance = _distance(config, candidate)
        if distance < best_distance and validate(candidate, arch).ok:
            best, best_distance = candidate, distance
    if best is None:
        raise InvalidConfigError(f"no valid config near {config.name} on {arch.name}: {result.errors[0]}")
    rules = tuple(sorted(r.value for r in result.broken_rules()))
    return best, tuple(Correction(f, getattr(config, f), getattr(best, f), rules)
                       for f in _TUNABLE if getattr(config, f) != getattr(best, f))


def supports(config: AnyAttentionConfig, problem: AttentionProblem) -> str | None:
    """None if this kernel computes `problem`; else why not, in words."""
    if isinstance(config, VendorConfig):
        return vendor.supports(config, problem)
    if config.direction is not problem.direction:
        return f"a {config.direction.value} kernel, the problem is {problem.direction.value}"
    if config.dtype is not problem.dtype:
        return f"built for {config.dtype.value}, the problem is {problem.dtype.value}"
    if (config.head_dim_qk, config.head_dim_v) != (problem.head_dim_qk, problem.head_dim_v):
        return (f"built for head dims {config.head_dim_qk}/{config.head_dim_v}, the problem has "
                f"{problem.head_dim_qk}/{problem.head_dim_v}")
    if config.family is Family.BWD_ATOMIC and problem.deterministic:
        return "dQ by atomics is not deterministic; the problem asks for deterministic gradients"
    if config.family.uses_tma:
        return _tma_supports(config, problem)
    return None


def _tma_supports(config: AttentionConfig, problem: AttentionProblem) -> str | None:
    v = problem.variant
    name = config.family.value
    extras = [what for what, on in (("a mask tensor", v.user_mask is not UserMask.NONE), ("a bias", v.bias),
                                    ("ALiBi", v.alibi), ("dropout", v.dropout), ("varlen", v.varlen)) if on]
    if extras:
        fallback = "bwd" if config.direction is Direction.BACKWARD else "fwd"
        return f"{name} takes bands, soft-cap, sinks and GQA only, not {', '.join(extras)} (the {fallback} family does)"
    if not v.aligned:
        return f"{name} needs 16-byte aligned base pointers and strides (tensor descriptors); the operands are not"
    return None
