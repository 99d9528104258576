"""Family `bwd-ws`: bwd's plan with Gluon dK/dV and dQ stages, warp-specialised as fwd-ws
(kernels/backward_ws.py; at d=256 the dK/dV stage of kernels/backward_ws_wide.py). sm_90, fp16 and
bf16, equal head dims 64, 128 and 256; bands, soft-cap, sinks and GQA."""

from __future__ import annotations

from dataclasses import replace

from ....core.arith import cdiv
from ....core.launch import Launch, Plan
from ....core.op import KernelUnit, Score
from ..config import FAMILIES, AttentionConfig, AttentionFamily, Family
from ..operands import AttentionOperands
from ..plan import KERNELS, backward_start, bound_values, gluon_unit, preprocess_unit, tensor_descriptor
from ..problem import AttentionProblem, AttentionVariant, Direction
from ..ranking import TileTerms, tile_score
from ..rules import WS_BARRIER_BYTES, AttentionRule, error, loader_stages_findings, padded, tile_correction
from ..rules import tile_findings, tile_supports, tma_findings, tma_supports, warpgroup_findings

MODULE = f"{KERNELS}.backward_ws"
WIDE_MODULE = f"{KERNELS}.backward_ws_wide"
# The dK and dV of 64 keys a warpgroup stay in registers, with the score blocks of block_m query
# rows: at d=128 and 64 rows ptxas spilled 500 B, at 32 none (sm_90 compiles); 64 rows at d=64 do
# not spill. At d=256 one warpgroup cannot hold both: the two split by role over 64 keys
# (kernels/backward_ws_wide.py), one holding dV, the other dK. At d=64 and 128 the role split ran
# 0.72-0.89x the kernel above (timed in turns on the H100), so it serves d=256 alone.
BWD_WS_HEAD_DIMS = (64, 128, 256)
BWD_WS_WIDE_HEAD_DIMS = (256,)
BWD_WS_QUERY_BLOCKS = (32, 64)
# Its dQ stage owns 128 query rows (64 a warpgroup, with S, dP and dQ in registers) and steps
# keys by head dim: at d=128, 128 keys would hold 192 accumulator registers a thread. At d=64,
# where 128 fit, they ran within 1 % of 64 (timed in turns on the H100), and 32 at d=128 0.6 %
# slower. At d=256, 32: dQ is 128 registers, and Q and dO take 128 KiB of shared memory.
BWD_WS_DQ_ROWS = 128
# Of the dense tensor-core peak. bwd-ws, timed in turns with bwd on the H100 (benchmarks/studies/
# attention_backward_ab.py; results/h100/attention_backward_ab.txt), with both its stages in Gluon:
# 32x128 w8 s3 ran 1.24-1.47x bwd's 64x128 w8 s3 at d=128, where 0.49 models 1.38-1.39x. cuDNN
# stays ahead (its forward+backward ran 1.06-1.16x fwd-ws's with bwd-ws at d=128, 1.28x at d=64;
# its backward alone more), and the model keeps it so. At d=256 (the warpgroups split by role)
# bwd-ws ran 2.07x bwd's 64x64 w8 s2 and its forward+backward 1.05x cuDNN's (d256_S2048); the
# model gives it 946 us against cuDNN's 1045 (measured: 1004, and about 1060 for cuDNN's backward).
FRACTION = 0.49
# Its query step: with 32 rows, S^T = K Q^T and dP^T = V dO^T are wgmma 32 wide, which read
# their K and V operand from shared memory faster than the tensor cores use it. At d=64 (where
# 64 rows fit) 32x128 w8 s3 ran 0.89-0.94x 64x128 w8 s2 (same A/B, three runs), and two stages
# ran 0.95-1.0x three (1.0x at 32x128 on long_S16384, 0.98x at 64x128 and d=64).
BWD_WS_STEP_EXPONENT = 0.15
BWD_WS_TWO_STAGES = 0.98


def bwd_ws_keys(config: AttentionConfig) -> int:
    """Keys a bwd-ws dK/dV program owns: two warpgroups' 64, or at wide heads 64 shared by both."""
    return 64 if config.head_dim_qk in BWD_WS_WIDE_HEAD_DIMS else 128


def bwd_ws_dq_keys(config: AttentionConfig) -> int:
    """Keys a bwd-ws dQ program steps (see BWD_WS_DQ_ROWS)."""
    return 32 if config.head_dim_qk > 128 else 64


def shared_memory(config: AttentionConfig) -> int:
    """Rows of one side stay, blocks of the other stream; P and dS stay in registers."""
    size = config.dtype.itemsize
    qk, dv = padded(config.head_dim_qk), padded(config.head_dim_v)
    stages = max(config.num_stages, 1)
    dkdv = size * (config.block_n + stages * config.block_m) * (qk + dv)
    if config.head_dim_qk in BWD_WS_WIDE_HEAD_DIMS:  # P^T handed between the warpgroups, fp32 a stage
        dkdv += stages * config.block_n * config.block_m * 4
    dq = size * (BWD_WS_DQ_ROWS + stages * bwd_ws_dq_keys(config)) * (qk + dv)
    return max(dkdv, dq) + WS_BARRIER_BYTES


def validate(config: AttentionConfig, arch) -> list:
    out = (tile_findings(config, arch, shared_memory(config)) + tma_findings(config, arch)
           + warpgroup_findings(config, arch, head_dims=BWD_WS_HEAD_DIMS, owned="block_n", rows=bwd_ws_keys(config),
                                arch_fix="use bwd", head_dim_fix="use bwd"))
    most_rows = 64 if config.head_dim_qk <= 64 else 32
    if config.block_m not in BWD_WS_QUERY_BLOCKS or config.block_m > most_rows:
        out.append(error(AttentionRule.WARPGROUP_ROWS, f"bwd-ws steps 32 query rows, or 64 at d=64, not "
                         f"{config.block_m} at d={config.head_dim_qk}: the score blocks and dK, dV outgrow a "
                         "warpgroup's registers", "block_m=32"))
    return out + loader_stages_findings(config)


def supports(config: AttentionConfig, problem: AttentionProblem) -> str | None:
    return tile_supports(config, problem) or tma_supports(config, problem, "bwd")


def _terms(config: AttentionConfig, p: AttentionProblem, t: TileTerms) -> TileTerms:
    """Its loader warp keeps two stages nearly as busy as three."""
    shape = min(1.0, config.block_m / 64) ** BWD_WS_STEP_EXPONENT
    latency = BWD_WS_TWO_STAGES if config.num_stages < 3 else 1.0
    return replace(t, shape=shape, latency=latency)


def score(config: AttentionConfig, problem: AttentionProblem, arch) -> Score:
    return tile_score(config, problem, arch, FRACTION, _terms)


_POINTERS = [("LSE", "*fp32"), ("DELTA", "*fp32")]


def dkdv_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """K, V, dK and dV by warpgroup (64 keys; at wide heads the program's 64, shared), Q and dO by
    query block."""
    rows = 64
    return {"q_desc": (1, 1, config.block_m, config.head_dim_qk), "k_desc": (1, 1, rows, config.head_dim_qk),
            "v_desc": (1, 1, rows, config.head_dim_v), "do_desc": (1, 1, config.block_m, config.head_dim_v),
            "dk_desc": (1, 1, rows, config.head_dim_qk), "dv_desc": (1, 1, rows, config.head_dim_v)}


def dq_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """Q, dO and dQ by warpgroup (64 rows), K and V by key block."""
    rows, keys = BWD_WS_DQ_ROWS // 2, bwd_ws_dq_keys(config)
    return {"q_desc": (1, 1, rows, config.head_dim_qk), "k_desc": (1, 1, keys, config.head_dim_qk),
            "v_desc": (1, 1, keys, config.head_dim_v), "do_desc": (1, 1, rows, config.head_dim_v),
            "dq_desc": (1, 1, rows, config.head_dim_qk)}


def kernel_units(config: AttentionConfig, variant: AttentionVariant, arch) -> tuple[KernelUnit, ...]:
    """The preprocess, then the dK/dV stage (at wide heads the role-split kernel, which shares the
    narrow one's helpers) and the dQ stage."""
    wide = config.head_dim_qk in BWD_WS_WIDE_HEAD_DIMS
    module, function = (WIDE_MODULE, "attention_bwd_dkdv_ws_wide") if wide else (MODULE, "attention_bwd_dkdv_ws")
    constexprs = {"HAS_SOFTCAP": variant.softcap, "STAGES": config.num_stages}
    dkdv = gluon_unit("dkdv", module, function, dkdv_blocks(config), _POINTERS, constexprs, config, variant, arch)
    dq = gluon_unit("dq", MODULE, "attention_bwd_dq_ws", dq_blocks(config), _POINTERS, constexprs, config, variant,
                    arch)
    return preprocess_unit(config, variant), dkdv, dq


def plan(config: AttentionConfig, ops: AttentionOperands) -> Plan:
    p = ops.problem
    start = backward_start(config, ops)
    # TMA takes no zero stride: an expanded dO (a loss's sum broadcast) is made dense first
    grad_out = ops.grad_out
    if any(s == 0 and n > 1 for s, n in zip(grad_out.stride(), grad_out.shape)):
        grad_out = grad_out.contiguous()
    grads = start.grads
    tensors = {"q_desc": ops.q, "k_desc": ops.k, "v_desc": ops.v, "do_desc": grad_out, "dk_desc": grads.dk,
               "dv_desc": grads.dv, "dq_desc": grads.dq}
    dkdv = {**start.common, **{name: tensor_descriptor(tensors[name], block)
                               for name, block in dkdv_blocks(config).items()}}
    dq = {**start.common, **{name: tensor_descriptor(tensors[name], block)
                             for name, block in dq_blocks(config).items()}}
    return start.plan(
        Launch("dkdv", (cdiv(p.seqlen_kv, bwd_ws_keys(config)), p.heads_kv, p.batch),
               bound_values(start.units["dkdv"], dkdv)),
        Launch("dq", (cdiv(p.seqlen_q, BWD_WS_DQ_ROWS), p.heads_q, p.batch),
               bound_values(start.units["dq"], dq)))


FAMILY = FAMILIES.register(AttentionFamily(
    op="attention", name=Family.BWD_WS.value, config_type=AttentionConfig, direction=Direction.BACKWARD,
    shared_memory=shared_memory, validate=validate, supports=supports, score=score,
    kernel_units=kernel_units, plan=plan, correction=tile_correction,
))
