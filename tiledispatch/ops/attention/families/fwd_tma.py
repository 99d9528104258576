"""Family `fwd-tma`: the forward with Q, K and V moved by tensor descriptors (kernels/forward_tma.py).
sm_90+, fp16, bf16 and fp8 (Q K^T on fp8 tensor cores, per-tensor scales), power-of-two head dims;
bands, soft-cap, sinks and GQA, on 16-byte aligned operands."""

from __future__ import annotations

from ....core.op import KernelUnit, Score
from ..config import FAMILIES, AttentionConfig, AttentionFamily, Family
from ..operands import AttentionOperands
from ..plan import KERNELS, bhs, forward_start, lse_strides, make_unit, named, pointer, runtime_args, softcap_code
from ..plan import strides, tensor_descriptor
from ..problem import FP8_DTYPES, FP8_OUTPUT, AttentionProblem, AttentionVariant, Direction
from ..ranking import tile_score
from ..rules import FEATURE_BYTES, forward_shared_bytes, tile_correction, tile_findings, tile_supports, tma_findings
from ..rules import tma_supports

MODULE = f"{KERNELS}.forward_tma"
# Of the dense tensor-core peak: the H200 sweep at d=128 S4096, kernels timed in turns
# (benchmarks/results/h200/attention_sweep.csv): fwd-tma's best tile ran 528 TFLOP/s (64x64 w4 s3),
# against fwd's 447; the rules pick that one.
FRACTION = 0.50


def shared_memory(config: AttentionConfig) -> int:
    return forward_shared_bytes(config, FEATURE_BYTES)


def validate(config: AttentionConfig, arch) -> list:
    return tile_findings(config, arch, shared_memory(config), takes_fp8=True) + tma_findings(config, arch)


def supports(config: AttentionConfig, problem: AttentionProblem) -> str | None:
    return tile_supports(config, problem) or tma_supports(config, problem, "fwd")


def score(config: AttentionConfig, problem: AttentionProblem, arch) -> Score:
    return tile_score(config, problem, arch, FRACTION)


def descriptor_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """The (batch, head, rows, d) block each 4-D descriptor moves: one head's rows, whole head dims."""
    return {"q_desc": (1, 1, config.block_m, config.head_dim_qk), "k_desc": (1, 1, config.block_n, config.head_dim_qk),
            "v_desc": (1, 1, config.block_n, config.head_dim_v)}


def kernel_units(config: AttentionConfig, variant: AttentionVariant, arch) -> tuple[KernelUnit, ...]:
    t = config.dtype.triton
    descriptors = [(name, f"tensordesc<{t}[{','.join(map(str, block))}]>")
                   for name, block in descriptor_blocks(config).items()]
    fp8 = config.dtype in FP8_DTYPES
    args = (descriptors + [("O", pointer(FP8_OUTPUT if fp8 else config.dtype)), ("LSE", "*fp32"),
                           ("SINKS", "*fp32"), ("SCALE_Q", "*fp32"), ("SCALE_K", "*fp32"), ("SCALE_V", "*fp32")]
            + strides("o") + strides("l", "bh") + [("seqlen_q", "i32"), ("seqlen_kv", "i32"), ("group", "i32"),
                                                   ("sm_scale", "fp32"), ("softcap", "fp32"), ("bottom_right", "i32"),
                                                   ("window_left", "i32"), ("window_right", "i32")])
    constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "HEAD_QK": config.head_dim_qk,
                  "HEAD_V": config.head_dim_v, "HAS_BAND": variant.band, "HAS_SOFTCAP": softcap_code(variant.softcap),
                  "HAS_SINKS": variant.sinks, "MASKS_ROWS": variant.masks_rows, "FP8": fp8}
    return (make_unit("fwd", MODULE, "attention_fwd_tma", args, constexprs, config, variant),)


def plan(config: AttentionConfig, ops: AttentionOperands):
    start = forward_start(config, ops)
    out, lse, blocks = start.out, start.lse, descriptor_blocks(config)
    return start.plan({"q_desc": tensor_descriptor(ops.q, blocks["q_desc"]),
                       "k_desc": tensor_descriptor(start.k, blocks["k_desc"]),
                       "v_desc": tensor_descriptor(ops.v, blocks["v_desc"]), "O": out, "LSE": lse,
                       "SINKS": ops.sinks if ops.sinks is not None else lse, **named("o", bhs(out, False)),
                       **{name: getattr(ops, name.lower()) if ops.scale_q is not None else lse
                          for name in ("SCALE_Q", "SCALE_K", "SCALE_V")},
                       **lse_strides(lse, False), **runtime_args(ops)})


FAMILY = FAMILIES.register(AttentionFamily(
    op="attention", name=Family.FWD_TMA.value, config_type=AttentionConfig, direction=Direction.FORWARD,
    shared_memory=shared_memory, validate=validate, supports=supports, score=score,
    kernel_units=kernel_units, plan=plan, correction=tile_correction,
))
