"""Families `bwd` and `bwd-atomic`: FlashAttention-2's backward with pointer loads (kernels/backward.py).
Every arch, every stride, every feature. After the preprocess (delta = rowsum(dO * O)), a dK/dV
program owns block_n keys and steps block_m queries; then `bwd` runs a dQ program per block_n
queries (no atomics: deterministic), while `bwd-atomic` adds dQ into an fp32 buffer from the
dK/dV kernel (its ATOMIC_DQ constexpr) and converts it after.

One module for both: they are one kernel file, share the preprocess and the dK/dV kernel, and
differ only in how dQ is made (`DqStage`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ....core.arith import cdiv
from ....core.launch import Launch, Plan
from ....core.op import KernelUnit, Score
from ..config import FAMILIES, AttentionConfig, AttentionFamily, Family
from ..operands import AttentionOperands
from ..plan import (
    BACKWARD_MODULE,
    CU_SEQLENS,
    FEATURE_STRIDES,
    PREPROCESS_BLOCK_M,
    RUNTIME,
    BackwardStart,
    backward_start,
    bhs,
    block,
    bound_values,
    dot_precision,
    feature_constexprs,
    feature_pointers,
    make_unit,
    named,
    pointer,
    preprocess_unit,
    strides,
)
from ..problem import AttentionProblem, AttentionVariant, Direction
from ..ranking import tile_score
from ..rules import backward_shared_bytes, padded, tile_correction, tile_findings, tile_supports

# Of the dense tensor-core peak: bwd ran 352 TFLOP/s (backward FLOPs, 2.5x the forward's) at d=128
# S4096, 64x128 w8 s3; the atomic dQ variant's best ran 301 there (benchmarks/results/h200/attention_sweep.csv).
BWD_FRACTION = 0.36
BWD_ATOMIC_FRACTION = 0.31


def _inputs(config: AttentionConfig) -> list[tuple[str, str]]:
    t = pointer(config.dtype)
    return [("Q", t), ("K", t), ("V", t), ("DO", t), ("LSE", "*fp32"), ("DELTA", "*fp32")]


_INPUT_STRIDES = strides("q") + strides("k") + strides("v") + strides("do") + strides("l", "bh")
_DBIAS = [("DBIAS", "*fp32")]
_DBIAS_STRIDES = strides("db", "bhm")


def _dkdv_unit(config: AttentionConfig, variant: AttentionVariant, atomic: bool) -> KernelUnit:
    t = pointer(config.dtype)
    args = (_inputs(config) + [("DK", t), ("DV", t), ("DQ_ACC", "*fp32")] + _DBIAS + feature_pointers(config, variant)
            + CU_SEQLENS + _INPUT_STRIDES + strides("dk") + strides("dv") + strides("dq") + _DBIAS_STRIDES
            + list(FEATURE_STRIDES) + RUNTIME)
    return make_unit("dkdv", BACKWARD_MODULE, "attention_bwd_dkdv", args,
                     {**feature_constexprs(config, variant), "ATOMIC_DQ": atomic, "HAS_DBIAS": variant.bias_grad,
                      "DOT_PRECISION": dot_precision(config)}, config, variant)


def _dq_unit(config: AttentionConfig, variant: AttentionVariant) -> KernelUnit:
    args = (_inputs(config) + [("DQ", pointer(config.dtype))] + _DBIAS + feature_pointers(config, variant)
            + CU_SEQLENS + _INPUT_STRIDES + strides("dq") + _DBIAS_STRIDES + list(FEATURE_STRIDES) + RUNTIME)
    # The dQ kernel owns block_n query rows and steps block_m keys: the long side stays on chip.
    return make_unit("dq", BACKWARD_MODULE, "attention_bwd_dq", args,
                     {**feature_constexprs(config, variant), "BLOCK_M": config.block_n, "BLOCK_N": config.block_m,
                      "HAS_DBIAS": variant.bias_grad, "DOT_PRECISION": dot_precision(config)}, config, variant)


def _convert_unit(config: AttentionConfig, variant: AttentionVariant) -> KernelUnit:
    args = ([("DQ_ACC", "*fp32"), ("DQ", pointer(config.dtype))] + strides("a") + strides("dq") + CU_SEQLENS
            + [("seqlen_q", "i32"), ("seqlen_kv", "i32")])
    return make_unit("convert", BACKWARD_MODULE, "attention_bwd_convert", args,
                     {"BLOCK_M": PREPROCESS_BLOCK_M, "HEAD_QK": config.head_dim_qk,
                      "BLOCK_QK": block(config.head_dim_qk), "VARLEN": variant.varlen},
                     config, variant, num_warps=4, num_stages=1)


def _dq_launch(config: AttentionConfig, ops: AttentionOperands, start: BackwardStart, dq_acc) -> Launch:
    p = ops.problem
    return Launch("dq", (cdiv(p.seqlen_q, config.block_n), p.heads_q, p.batch),
                  bound_values(start.units["dq"], start.common))


def _convert_launch(config: AttentionConfig, ops: AttentionOperands, start: BackwardStart, dq_acc) -> Launch:
    p, varlen = ops.problem, ops.problem.variant.varlen
    convert = {**start.common, **named("a", bhs(dq_acc, varlen)), **named("dq", bhs(start.grads.dq, varlen))}
    return Launch("convert", (cdiv(p.seqlen_q, PREPROCESS_BLOCK_M), p.heads_q, p.batch),
                  bound_values(start.units["convert"], convert))


@dataclass(frozen=True)
class DqStage:
    """How a family makes dQ: by atomics into an fp32 buffer (`atomic`) converted by a last stage,
    or by its own dQ stage; its unit and launch, and the fraction of the peak the family reaches."""

    family: Family
    atomic: bool
    unit: Callable[[AttentionConfig, AttentionVariant], KernelUnit]
    launch: Callable[..., Launch]
    fraction: float


def _family(stage: DqStage) -> AttentionFamily:
    def shared_memory(config: AttentionConfig) -> int:
        # The atomic dK/dV kernel stages the fp32 dQ block it adds (sm_90 compiles: +64 KiB at d=256 and
        # 64 query rows, which took it to 257 KiB, past the 227 KiB limit, where the estimate without it
        # said 212 KiB).
        return backward_shared_bytes(config, 4 * config.block_m * padded(config.head_dim_qk) if stage.atomic else 0)

    def validate(config: AttentionConfig, arch) -> list:
        return tile_findings(config, arch, shared_memory(config))

    def supports(config: AttentionConfig, problem: AttentionProblem) -> str | None:
        refusal = tile_supports(config, problem)
        if refusal is None and stage.atomic and problem.deterministic:
            return "dQ by atomics is not deterministic; the problem asks for deterministic gradients"
        return refusal

    def score(config: AttentionConfig, problem: AttentionProblem, arch) -> Score:
        return tile_score(config, problem, arch, stage.fraction)

    def kernel_units(config: AttentionConfig, variant: AttentionVariant, arch) -> tuple[KernelUnit, ...]:
        return preprocess_unit(config, variant), _dkdv_unit(config, variant, stage.atomic), stage.unit(config, variant)

    def plan(config: AttentionConfig, ops: AttentionOperands) -> Plan:
        p = ops.problem
        dq_acc = (torch.zeros((*ops.q.shape[:-1], p.head_dim_qk), dtype=torch.float32, device=ops.device)
                  if stage.atomic else None)
        start = backward_start(config, ops, dq_acc)
        dkdv = Launch("dkdv", (cdiv(p.seqlen_kv, config.block_n), p.heads_kv, p.batch),
                      bound_values(start.units["dkdv"], start.common))
        return start.plan(dkdv, stage.launch(config, ops, start, dq_acc))

    return FAMILIES.register(AttentionFamily(
        op="attention", name=stage.family.value, config_type=AttentionConfig, direction=Direction.BACKWARD,
        shared_memory=shared_memory, validate=validate, supports=supports, score=score,
        kernel_units=kernel_units, plan=plan, correction=tile_correction,
    ))


BWD = _family(DqStage(Family.BWD, atomic=False, unit=_dq_unit, launch=_dq_launch, fraction=BWD_FRACTION))
BWD_ATOMIC = _family(DqStage(Family.BWD_ATOMIC, atomic=True, unit=_convert_unit, launch=_convert_launch,
                             fraction=BWD_ATOMIC_FRACTION))
