"""Families `sdpa-cudnn` and `sdpa-flash`: PyTorch SDPA's cuDNN and FlashAttention-2 backends as
candidates (their calls: vendor.py). One module for both: they share the config type
(`VendorConfig`), the features they refuse, the model and the plan; what differs is each
backend's facts (`Backend`) and its rows of the model's tables.

The model: time = ideal / (fraction * head-dim factor * mask factor) + the host's call; no tile
terms, since the library picks its own kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ....core.dtypes import DType
from ....core.launch import Launch, Plan
from ....core.op import Score
from ....core.validation import Finding
from ....heuristics.roofline import dram_bytes_per_s
from .. import vendor
from ..config import FAMILIES, AttentionFamily, Family, VendorConfig
from ..operands import AttentionOperands
from ..plan import AttentionGrads, AttentionResult, python_unit
from ..problem import AttentionProblem, Direction, MaskKind, UserMask
from ..ranking import problem_ideal_seconds
from ..rules import AttentionRule, error

# The SDPA backends, measured on the H200 (torch 2.11, cuDNN 9.19; benchmarks/results/h200/
# attention.csv, bf16, of 989 TFLOP/s): the fraction at D=128 without a mask on large
# problems, a factor per head dim, and one for a causal mask. Backward figures are derived
# from forward+backward less the forward: cuDNN 533 fwd+bwd and 660 fwd at S4096 give a
# backward of 495 (a standalone cuDNN backward ran 524 at B4 H32 S2048); flash 306 and 338
# give 295. Flash's backward is refused (`supports`); its figure is kept for explain.
VENDOR_FRACTION = {
    (Family.SDPA_CUDNN, Direction.FORWARD): 0.66,  # 660 TFLOP/s (mha_S4096_D128; 603 at S1024)
    (Family.SDPA_CUDNN, Direction.BACKWARD): 0.50,  # 495
    (Family.SDPA_FLASH, Direction.FORWARD): 0.34,  # 338
    (Family.SDPA_FLASH, Direction.BACKWARD): 0.30,  # 295
}
# Throughput at a head dim relative to D=128, from the same run: D=64 (mha_S2048_D64) and
# D=256 (d256_S2048). Head dims between are read at the tabulated dim above them, times
# their share of it (80 -> 128's factor * 80/128): the libraries' tiles pad them.
VENDOR_HEAD_DIM_FACTOR = {
    (Family.SDPA_CUDNN, Direction.FORWARD): {64: 0.70, 128: 1.0, 256: 1.0},  # 460, 660, 663
    (Family.SDPA_CUDNN, Direction.BACKWARD): {64: 0.82, 128: 1.0, 256: 0.67},  # 408, 495, 331
    (Family.SDPA_FLASH, Direction.FORWARD): {64: 0.87, 128: 1.0, 256: 0.92},  # 295, 338, 312
    (Family.SDPA_FLASH, Direction.BACKWARD): {64: 0.83, 128: 1.0, 256: 0.76},  # 246, 295, 223
}
# A causal (or any band) mask: the triangle's edge blocks and its uneven work per query
# block. cuDNN 593/660 forward and 444/495 backward at S4096; flash 294/338 and 271/295.
VENDOR_MASK_FACTOR = 0.90
VENDOR_CALL_SECONDS = 8e-6  # SDPA's dispatch and checks on the host
MASK_NOTE = " (sdpa-cudnn takes one in an inference forward, without the LSE)"
FLASH_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class Backend:
    """What one SDPA backend takes: the arch it needs (`arch_refusal`: the finding's message and fix,
    or None), the directions it is called for here (`refused_direction` says why not the others),
    its head dims (`head_dims`: the limit and a note on it) and its own refusals past the shared ones."""

    family: Family
    arch_refusal: Callable[[object], tuple[str, str | None] | None]
    directions: tuple[Direction, ...]
    refused_direction: str
    head_dims: Callable[[], tuple[int, str]]
    refusal: Callable[[AttentionProblem], str | None]
    takes_mask: Callable[[AttentionProblem], bool] = lambda p: False  # a mask tensor, as an additive bias


def _shared_refusal(config: VendorConfig, p: AttentionProblem, backend: Backend) -> str | None:
    """What neither backend takes here, in either direction."""
    v = p.variant
    if config.dtype is not p.dtype:
        return f"built for {config.dtype.value}, the problem is {p.dtype.value}"
    if p.head_dim_qk != p.head_dim_v:
        return f"SDPA's {config.family.value} needs equal Q/K and V head dims, got {p.head_dim_qk}/{p.head_dim_v}"
    limit, why = backend.head_dims()
    if p.head_dim_qk > limit:
        return f"{config.family.value} takes head dims up to {limit}{why}"
    masked = v.user_mask is not UserMask.NONE and not backend.takes_mask(p)
    features = [name for name, on in (("bias", v.bias), ("ALiBi", v.alibi), ("soft-cap", v.softcap),
                                      ("sinks", v.sinks), ("dropout", v.dropout), ("varlen", v.varlen),
                                      ("a mask tensor" + MASK_NOTE, masked)) if on]
    if features:
        return f"SDPA's {config.family.value} path here takes none of: {', '.join(features)}"
    if p.mask is MaskKind.SLIDING_WINDOW:
        return "SDPA has no sliding window"
    if p.mask is not MaskKind.NONE and p.seqlen_q != p.seqlen_kv:
        return "SDPA's fused backends take is_causal only with seqlen_q == seqlen_kv"
    return None


def _validate(backend: Backend) -> Callable[[VendorConfig, object], list[Finding]]:
    def validate(config: VendorConfig, arch) -> list[Finding]:
        out = []
        refused = (("the SDPA backends are GPU libraries; the interpreter target runs Triton kernels",
                    "use a GPU arch") if arch.is_interpreter else backend.arch_refusal(arch))
        if refused is not None:
            out.append(error(AttentionRule.FAMILY_ARCH, *refused))
        if config.dtype not in (DType.FP16, DType.BF16):
            out.append(error(AttentionRule.DTYPE_ARCH,
                             f"the SDPA backends take fp16 and bf16, not {config.dtype.value}"))
        return out

    return validate


def _supports(backend: Backend) -> Callable[[VendorConfig, AttentionProblem], str | None]:
    def supports(config: VendorConfig, problem: AttentionProblem) -> str | None:
        if config.direction is not problem.direction:
            return f"a {config.direction.value} kernel, the problem is {problem.direction.value}"
        if config.direction not in backend.directions:
            return backend.refused_direction
        return _shared_refusal(config, problem, backend) or backend.refusal(problem)

    return supports


def vendor_head_dim_factor(family: Family, direction: Direction, head_dim: int) -> float:
    """Throughput at `head_dim` relative to D=128 (VENDOR_HEAD_DIM_FACTOR, padded dims scaled down)."""
    table = VENDOR_HEAD_DIM_FACTOR[(family, direction)]
    above = min((d for d in table if d >= head_dim), default=max(table))
    return table[above] * min(1.0, head_dim / above)


def vendor_score(config: VendorConfig, problem: AttentionProblem, arch) -> Score:
    """time = ideal / (fraction * head-dim factor * mask factor) + the host's call."""
    ideal = problem_ideal_seconds(problem, arch)
    fraction = VENDOR_FRACTION[(config.family, problem.direction)]
    head_dim = vendor_head_dim_factor(config.family, problem.direction, problem.head_dim_qk)
    mask = VENDOR_MASK_FACTOR if problem.variant.band else 1.0
    modelled = ideal / (fraction * head_dim * mask) + VENDOR_CALL_SECONDS + mask_bias_seconds(problem, arch)
    return Score(ideal / modelled, {"fraction": fraction, "head_dim": head_dim, "mask": mask,
                                    "modelled_us": modelled * 1e6})


def mask_bias_seconds(problem: AttentionProblem, arch) -> float:
    """The launch and traffic of making a mask tensor's bias (vendor.mask_bias): a bool mask of one
    head read and its bias written; none without a mask."""
    if problem.variant.user_mask is UserMask.NONE:
        return 0.0
    cells = problem.batch * problem.seqlen_q * problem.seqlen_kv  # a mask tensor is never varlen
    return arch.calibration.launch_s + cells * (1 + problem.dtype.itemsize) / dram_bytes_per_s(arch)


_UNITS = {
    Direction.FORWARD: python_unit(vendor.__name__, "forward",
                                   ("family", "q", "k", "v", "result", "scale", "causal", "needs_lse", "mask")),
    Direction.BACKWARD: python_unit(vendor.__name__, "backward", ("family", "grads", "grad_out", "q", "k", "v", "out",
                                                                  "lse", "scale", "causal")),
}


def kernel_units(config: VendorConfig, variant, arch) -> tuple:
    return (_UNITS[config.direction],)


def plan(config: VendorConfig, ops: AttentionOperands) -> Plan:
    p = ops.problem
    causal = p.mask is not MaskKind.NONE
    if p.direction is Direction.FORWARD:
        result = AttentionResult(None, None)
        args = (config.family, ops.q, ops.k, ops.v, result, ops.scale, causal, p.needs_lse, ops.mask)
        return Plan((Launch("vendor", (1, 1, 1), args),), result)
    # The library allocates dQ/dK/dV itself (in Q's and K/V's layouts) and the stage hands
    # them over; the LSE goes as ours, (batch, heads_q, seqlen_q), from whichever forward.
    grads = AttentionGrads(None, None, None, None, None)
    args = (config.family, grads, ops.grad_out, ops.q, ops.k, ops.v, ops.out, ops.lse, ops.scale, causal)
    return Plan((Launch("vendor", (1, 1, 1), args),), grads)


def _cudnn_head_dims() -> tuple[int, str]:
    limit = vendor.cudnn_max_head_dim()
    why = (f" (cuDNN >= 9.10 takes {vendor.CUDNN_HOPPER_MAX_HEAD_DIM} on sm_90; not this runtime)"
           if limit < vendor.CUDNN_HOPPER_MAX_HEAD_DIM else "")
    return limit, why


def _cudnn_refusal(p: AttentionProblem) -> str | None:
    if p.seqlen_kv == 1:
        return "cuDNN attention does not take a key/value length of 1"
    if not p.variant.aligned:
        return "cuDNN wants 16-byte aligned bases and strides (multiples of 16 elements); these operands are not"
    if p.direction is Direction.BACKWARD and p.deterministic:
        return "cuDNN's backward is not deterministic; the problem asks for deterministic gradients"
    return None


def _flash_refusal(p: AttentionProblem) -> str | None:
    if p.needs_lse and p.heads_q != p.heads_kv:
        return "flash's forward that keeps the LSE takes equal head counts only (GQA/MQA: sdpa-cudnn or Triton)"
    return None


CUDNN = Backend(
    Family.SDPA_CUDNN,
    arch_refusal=lambda arch: (("SDPA's cuDNN attention needs sm_90 or newer", "use sdpa-flash")
                               if arch.sm is not None and arch.sm < 90 else None),
    directions=(Direction.FORWARD, Direction.BACKWARD), refused_direction="", head_dims=_cudnn_head_dims,
    refusal=_cudnn_refusal,
    # Inference only: cuDNN's LSE of a row that sees no key, and its backward with a bias, are not
    # checked against ours; training with a mask runs the Triton kernels.
    takes_mask=lambda p: p.direction is Direction.FORWARD and not p.needs_lse)
FLASH = Backend(
    Family.SDPA_FLASH,
    arch_refusal=lambda arch: ("FlashAttention-2 needs sm_80 or newer", None) if arch.sm is not None and arch.sm < 80
    else None,
    # Its backward is reachable only through a private ATen op, which refused a standalone call on
    # the H200 (torch 2.11: "batch size must be positive" without its forward's offsets).
    directions=(Direction.FORWARD,),
    refused_direction="SDPA's flash backward is not callable apart from its own forward here; cuDNN's or Triton's runs",
    head_dims=lambda: (FLASH_MAX_HEAD_DIM, ""), refusal=_flash_refusal)

SDPA_FAMILIES = tuple(FAMILIES.register(AttentionFamily(
    op="attention", name=backend.family.value, config_type=VendorConfig, validate=_validate(backend),
    supports=_supports(backend), score=vendor_score, kernel_units=kernel_units, plan=plan,
)) for backend in (CUDNN, FLASH))
