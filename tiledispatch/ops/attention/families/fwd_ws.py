"""Family `fwd-ws`: the warp-specialised forward in Gluon (kernels/forward_ws.py): a TMA loader
warp and two MMA warpgroups of 64 query rows on sm_90, fp16 and bf16, head dims 64, 128 and 256;
bands, soft-cap, sinks and GQA. O is staged in Q's buffer."""

from __future__ import annotations

from dataclasses import replace

from ....core.op import KernelUnit, Score
from ..config import FAMILIES, AttentionConfig, AttentionFamily, Family
from ..operands import AttentionOperands
from ..plan import KERNELS, forward_start, gluon_unit, lse_strides, runtime_args, tensor_descriptor
from ..problem import AttentionProblem, AttentionVariant, Direction
from ..ranking import TileTerms, tile_score
from ..rules import WS_BARRIER_BYTES, forward_shared_bytes, loader_stages_findings, tile_correction, tile_findings
from ..rules import tile_supports, tma_findings, tma_supports, warpgroup_findings

MODULE = f"{KERNELS}.forward_ws"
HEAD_DIMS = (64, 128, 256)  # 256: 128 x 64 tiles over 2 stages only (shared memory)
WARPGROUP_ROWS = 128  # two MMA warpgroups of 64 query rows
# Of the dense tensor-core peak. fwd-ws against cuDNN, timed in turns on the H100
# (benchmarks/studies/attention_forward_ab.py; results/h100/attention_forward_ab.txt), 128x128 w8
# over four runs: 1.01-1.10x cuDNN at S4096, 1.00-1.09x causal, 1.03-1.12x GQA causal S8192,
# 0.84-0.89x at S1024. With the terms below, 0.80 models it 1.00x, 1.02x, 1.12x and 0.86x there.
FRACTION = 0.80
# fwd-ws gives its MMA warps the registers the loader does not use, and its 8 warps are two
# 64-row warpgroups, so the pointer kernels' pressure and eight-warp terms do not apply, nor the
# stage count (2 and 3 stages ran within 4-9 % of each other, either way). Its own terms (same A/B):
# at d=64 it ran 0.88-0.95x fwd-tma's 64x64 w4 s3, which the model without a factor rated
# above 1.3x; and one program per SM runs its first and last key blocks without overlap, which
# cost S1024 (1024 keys a program) 16 % against S4096: about 280 keys' time. At d=256 (128x64,
# 2 stages) it ran 1.26-1.49x fwd-tma, and 1.09x cuDNN in the A/B and 1.035x in two suite runs
# (results/h100/attention_summary.json: 687 TFLOP/s, more than its 628 at d=128). The rescale
# term charges its 64-key steps 0.71 there, but a d=256 step's MMAs are twice as long, and the
# other warpgroup's run while one rescales: 1.35 undoes most of that charge, so the model
# rates it 1.02x cuDNN (0.76x at a factor of 1, which picks cuDNN's forward).
WS_HEAD_DIM_FACTOR = {64: 0.65, 128: 1.0, 256: 1.35}
WS_PROGRAM_OVERHEAD_KEYS = 280


def shared_memory(config: AttentionConfig) -> int:
    return forward_shared_bytes(config, WS_BARRIER_BYTES)


def validate(config: AttentionConfig, arch) -> list:
    return (tile_findings(config, arch, shared_memory(config)) + tma_findings(config, arch)
            + warpgroup_findings(config, arch, head_dims=HEAD_DIMS, owned="block_m", rows=WARPGROUP_ROWS,
                                 arch_fix="use fwd-tma or fwd", head_dim_fix="use fwd-tma")
            + loader_stages_findings(config))


def supports(config: AttentionConfig, problem: AttentionProblem) -> str | None:
    return tile_supports(config, problem) or tma_supports(config, problem, "fwd")


def _terms(config: AttentionConfig, p: AttentionProblem, t: TileTerms) -> TileTerms:
    latency, pressure, warps = 1.0, 1.0, 1.0
    softmax = t.softmax
    softmax *= WS_HEAD_DIM_FACTOR.get(p.head_dim_qk, 1.0)
    # One program per SM runs its first and last blocks without overlap: short key ranges pay.
    keys = t.computed * p.heads_q / (t.programs * config.block_m)  # keys a program steps over
    latency *= keys / (keys + WS_PROGRAM_OVERHEAD_KEYS)
    return replace(t, latency=latency, pressure=pressure, warps=warps, softmax=softmax)


def score(config: AttentionConfig, problem: AttentionProblem, arch) -> Score:
    return tile_score(config, problem, arch, FRACTION, _terms)


def descriptor_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """Q and O by warpgroup (64 rows each), K and V by key block."""
    rows = config.block_m // 2
    return {"q_desc": (1, 1, rows, config.head_dim_qk), "k_desc": (1, 1, config.block_n, config.head_dim_qk),
            "v_desc": (1, 1, config.block_n, config.head_dim_v), "o_desc": (1, 1, rows, config.head_dim_v)}


def kernel_units(config: AttentionConfig, variant: AttentionVariant, arch) -> tuple[KernelUnit, ...]:
    constexprs = {"HAS_BAND": variant.band, "HAS_SOFTCAP": variant.softcap, "HAS_SINKS": variant.sinks,
                  "STAGES": config.num_stages}
    return (gluon_unit("fwd", MODULE, "attention_fwd_ws", descriptor_blocks(config),
                       [("LSE", "*fp32"), ("SINKS", "*fp32")], constexprs, config, variant, arch),)


def plan(config: AttentionConfig, ops: AttentionOperands):
    start = forward_start(config, ops)
    lse, blocks = start.lse, descriptor_blocks(config)
    tensors = (("q_desc", ops.q), ("k_desc", start.k), ("v_desc", ops.v), ("o_desc", start.out))
    return start.plan({**{name: tensor_descriptor(t, blocks[name]) for name, t in tensors},
                       "LSE": lse, "SINKS": ops.sinks if ops.sinks is not None else lse, **lse_strides(lse, False),
                       **runtime_args(ops)})


FAMILY = FAMILIES.register(AttentionFamily(
    op="attention", name=Family.FWD_WS.value, config_type=AttentionConfig, direction=Direction.FORWARD,
    shared_memory=shared_memory, validate=validate, supports=supports, score=score,
    kernel_units=kernel_units, plan=plan, correction=tile_correction,
))
