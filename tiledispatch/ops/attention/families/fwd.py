"""Family `fwd`: the online-softmax forward with pointer loads (kernels/forward.py). Every arch,
every stride, every feature (masks and bias, ALiBi, soft-cap, sinks, dropout, varlen)."""

from __future__ import annotations

from ....core.op import KernelUnit, Score
from ..config import FAMILIES, AttentionConfig, AttentionFamily, Family
from ..operands import AttentionOperands
from ..plan import (
    CU_SEQLENS,
    FEATURE_STRIDES,
    KERNELS,
    RUNTIME,
    bhs,
    dot_precision,
    feature_constexprs,
    feature_pointers,
    features,
    forward_start,
    lse_strides,
    make_unit,
    named,
    pointer,
    runtime_args,
    strides,
)
from ..problem import AttentionProblem, AttentionVariant, Direction
from ..ranking import tile_score
from ..rules import FEATURE_BYTES, forward_shared_bytes, tile_correction, tile_findings, tile_supports

MODULE = f"{KERNELS}.forward"
# Of the dense tensor-core peak: the H200 sweep at d=128 S4096, kernels timed in turns
# (benchmarks/results/h200/attention_sweep.csv): fwd's best tile ran 447 TFLOP/s (128x64 w8 s3).
FRACTION = 0.46


def shared_memory(config: AttentionConfig) -> int:
    return forward_shared_bytes(config, FEATURE_BYTES)


def validate(config: AttentionConfig, arch) -> list:
    return tile_findings(config, arch, shared_memory(config))


def score(config: AttentionConfig, problem: AttentionProblem, arch) -> Score:
    return tile_score(config, problem, arch, FRACTION)


def kernel_units(config: AttentionConfig, variant: AttentionVariant, arch) -> tuple[KernelUnit, ...]:
    t = pointer(config.dtype)
    args = ([("Q", t), ("K", t), ("V", t), ("O", t), ("LSE", "*fp32"), *feature_pointers(config, variant),
             ("SINKS", "*fp32"), *CU_SEQLENS]
            + strides("q") + strides("k") + strides("v") + strides("o") + strides("l", "bh")
            + list(FEATURE_STRIDES) + RUNTIME)
    constexprs = {**feature_constexprs(config, variant), "HAS_SINKS": variant.sinks, "MASKS_ROWS": variant.masks_rows,
                  "DOT_PRECISION": dot_precision(config)}
    return (make_unit("fwd", MODULE, "attention_fwd", args, constexprs, config, variant),)


def plan(config: AttentionConfig, ops: AttentionOperands):
    start = forward_start(config, ops)
    varlen = ops.problem.variant.varlen
    out, lse, k = start.out, start.lse, start.k
    return start.plan({"Q": ops.q, "K": k, "V": ops.v, "O": out, "LSE": lse,
                       "SINKS": ops.sinks if ops.sinks is not None else lse, **features(ops, lse),
                       **named("q", bhs(ops.q, varlen)), **named("k", bhs(k, varlen)),
                       **named("v", bhs(ops.v, varlen)), **named("o", bhs(out, varlen)), **lse_strides(lse, varlen),
                       **runtime_args(ops)})


FAMILY = FAMILIES.register(AttentionFamily(
    op="attention", name=Family.FWD.value, config_type=AttentionConfig, direction=Direction.FORWARD,
    shared_memory=shared_memory, validate=validate, supports=tile_supports, score=score,
    kernel_units=kernel_units, plan=plan, correction=tile_correction,
))
