"""The one validity predicate for conv configs, its auto-corrector, and `supports`.

Each rule is a member of `ConvRule`, so an error names the rule it breaks and tests
can check for exactly that rule. The op-level functions look up the config's family
(`FAMILIES`) and ask it; what several families check alike (the signature, warps and
split) is here, as helpers they call.
"""

from __future__ import annotations

import enum
import math
from dataclasses import fields

from ...core import family as kernel_family
from ...core.dtypes import DType
from ...core.validation import Correction, Finding, Severity, ValidationResult
from .problem import ConvProblem, Direction
from .signature import FAMILIES, ConvSignature, SplitMode

BLOCK_CHOICES = (16, 32, 64, 128, 256)
WARP_CHOICES = (1, 2, 4, 8, 16)
STAGE_CHOICES = tuple(range(1, 9))
MAX_SPLIT_K = 64
REGISTER_RESERVE = 64  # registers for addresses, operands and loop state besides the accumulator
# Why no Triton or Gluon kernel takes a problem with `wide_offsets`: their index arithmetic is
# 32-bit, and an offset past it wraps to an address outside the tensor.
WIDE_OFFSETS = ("element offsets past 2**31 need 64-bit indexing, and the Triton kernels index in 32 bits; "
                "the vendor path (cuDNN through PyTorch, on a GPU) takes it, or pass tensors that span less memory "
                "(a contiguous copy, or a smaller batch)")


class ConvRule(enum.Enum):
    TILE_POWER_OF_TWO = "tile-power-of-two"
    TENSOR_CORE_MINIMUM = "tensor-core-minimum"
    TILE_MAXIMUM = "tile-maximum"
    WARPS = "warps"
    WARPS_FOR_TILE = "warps-for-tile"
    STAGES = "stages"
    GROUP_M = "group-m"
    SPLIT_K = "split-k"
    WINDOW = "window"
    SPLIT_MODE = "split-mode"
    GROUP_MERGE = "group-merge"
    SHARED_MEMORY = "shared-memory"
    REGISTER_BUDGET = "register-budget"
    REGISTER_A_PIPELINE = "register-a-pipeline"
    VECTOR_WIDTH = "vector-width"
    DTYPE_ARCH = "dtype-arch"
    TF32 = "tf32"
    EPILOGUE_DIRECTION = "epilogue-direction"
    FAMILY_ARCH = "family-arch"
    FAMILY_DIRECTION = "family-direction"
    FAMILY_DTYPE = "family-dtype"
    PAD_CHANNELS = "pad-channels"


# Rules about what is computed, not how: no tile change fixes them.
SEMANTIC = frozenset({ConvRule.DTYPE_ARCH, ConvRule.TF32, ConvRule.EPILOGUE_DIRECTION, ConvRule.FAMILY_ARCH,
                      ConvRule.WINDOW, ConvRule.FAMILY_DIRECTION, ConvRule.FAMILY_DTYPE})


class Findings(list):
    """A family's findings in the order it checks them: `error` and `warning` add one."""

    def error(self, rule: ConvRule, message: str, fix: str | None = None) -> None:
        self.append(Finding(rule, Severity.ERROR, message, fix))

    def warning(self, rule: ConvRule, message: str, fix: str | None = None) -> None:
        self.append(Finding(rule, Severity.WARNING, message, fix))


def pipeline_shared_bytes(num_stages: int, block_m: int, block_n: int, block_k: int, item: int) -> int:
    """Shared memory of a software pipeline: one block_m x block_k and one block_k x block_n tile per stage."""
    return max(num_stages, 1) * (block_m + block_n) * block_k * item


def registers_for(elements: int, num_warps: int) -> int:
    """32-bit registers per thread that `elements` fp32 accumulators spread over the program's threads need."""
    return math.ceil(elements / (num_warps * 32))


def registers_a_thread(threads_an_sm: int, registers_per_sm: int) -> int:
    """The most registers a thread that let an SM hold `threads_an_sm` threads (ptxas allocates in 8s)."""
    return registers_per_sm // threads_an_sm // 8 * 8


def power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def signature_findings(sig: ConvSignature, arch, out: Findings) -> None:
    """What every Triton family checks first: the dtype on this arch, tf32, and an epilogue off forward."""
    t = sig.types
    if t.dtype is not DType.FP32 and not arch.supports_dtype(t.dtype):
        where = "Triton's interpreter has no " + t.dtype.value if arch.is_interpreter else f"{arch.name} lacks it"
        out.error(ConvRule.DTYPE_ARCH, f"{t.dtype.value} convolution: {where}", "use fp16 or fp32")
    if t.allow_tf32 and t.dtype is not DType.FP32:
        out.error(ConvRule.TF32, f"allow_tf32 applies to fp32 only, not {t.dtype.value}")
    if sig.direction is not Direction.FORWARD and not sig.epilogue.plain:
        out.error(ConvRule.EPILOGUE_DIRECTION,
                  f"epilogue {sig.epilogue.name} on {sig.direction.value}: bias, activation and residual are forward "
                  "only", "use no epilogue")


def split_k_findings(config, out: Findings) -> None:
    """split_k within range, and above 1 for backward-weight only (its reduction over pixels)."""
    if not 1 <= config.split_k <= MAX_SPLIT_K:
        out.error(ConvRule.SPLIT_K, f"split_k={config.split_k} must be within 1..{MAX_SPLIT_K}")
    elif config.split_k > 1 and config.signature.direction is not Direction.BWD_WEIGHT:
        out.error(ConvRule.SPLIT_K, f"split_k={config.split_k} on {config.signature.direction.value}: only "
                  "backward-weight splits its reduction (over pixels) across programs", "use split_k=1")


def program_findings(config, out: Findings, split_mode: bool) -> None:
    """The warps and the split of a pointer or TMA kernel's program (`split_mode`: the config has one)."""
    if config.num_warps not in WARP_CHOICES:
        out.error(ConvRule.WARPS, f"num_warps={config.num_warps} is not one of {WARP_CHOICES}")
    split_k_findings(config, out)
    if split_mode and config.split_mode is SplitMode.ATOMIC and config.split_k == 1:
        out.error(ConvRule.SPLIT_MODE, "split_mode atomic with split_k=1: there is nothing to add up",
                  "use split_mode workspace, or split_k > 1")


def corrected_split(config) -> int:
    """The split the corrector keeps: within 1..MAX_SPLIT_K, and 1 off backward-weight."""
    split = min(max(config.split_k, 1), MAX_SPLIT_K)
    return split if config.signature.direction is Direction.BWD_WEIGHT else 1


def signature_refusal(config, problem: ConvProblem) -> str | None:
    """Why a Triton kernel of `config` cannot compute `problem` whatever its family (None: nothing yet)."""
    if problem.wide_offsets:  # first: every Triton kernel refuses for this one reason, whatever else differs
        return WIDE_OFFSETS
    want = ConvSignature.of(problem)
    sig = config.signature
    if sig.direction is not want.direction:
        return f"built for {sig.direction.value}, the problem is {want.direction.value}"
    if sig.types != want.types:
        return f"built for {sig.types.name}, the problem is {want.types.name}"
    if sig.epilogue != want.epilogue:
        return f"built for epilogue {sig.epilogue.name}, the problem needs {want.epilogue.name}"
    return None


def validate(config, arch) -> ValidationResult:
    """Every finding of `config` on `arch`, by its family's rules."""
    return ValidationResult(tuple(FAMILIES.of(config).validate(config, arch)))


def auto_correct(config, arch) -> tuple[object, tuple[Correction, ...]]:
    """The valid config nearest to `config` (fewest powers of two moved), and what changed.

    Rules about what is computed (dtype on this arch, tf32, an epilogue off forward)
    cannot be corrected by a tile change; they raise InvalidConfigError naming the rule.
    """
    space = FAMILIES.of(config).correction(config)
    return kernel_family.auto_correct(config, arch, validate=validate, semantic=SEMANTIC, space=space,
                                      fields=tuple(f.name for f in fields(config)))


def supports(config, problem: ConvProblem) -> str | None:
    """None if this kernel computes `problem`; else why not, in words."""
    return FAMILIES.of(config).supports(config, problem)


# The fields beside the signature that some family's `supports` reads: direct's window, its stride
# and band (`window_refusal`), igemm's merged groups and channel padding, igemm-tma's block_in and
# toeplitz's filter rows. A field a config lacks reads as None.
_SUPPORT_FIELDS = ("window", "window_stride", "band", "groups_per_tile", "pad_channels", "block_in", "filter_rows")


def support_key(config) -> tuple:
    """What `supports` reads of a config (`OpDefinition.support_key`): configs of one key take or
    refuse every problem alike, so a ranking asks once per key (a forward class's 111 kernels
    have 29 keys). block_k counts only where groups merge (their channels must fit one block),
    tile_h only as more than one row (a 1-D conv takes one)."""
    merged = getattr(config, "groups_per_tile", 1) > 1
    return (type(config), config.family, config.signature, *(getattr(config, f, None) for f in _SUPPORT_FIELDS),
            config.block_k if merged else None, getattr(config, "tile_h", 1) > 1)
