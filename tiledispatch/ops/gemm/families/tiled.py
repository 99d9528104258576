"""The tiled family (kernels/tiled.py): pointer loads in a grouped tile order, every arch and
every stride, split-K over a second launch that sums the fp32 partials in a fixed order."""

from __future__ import annotations

from ....core.dtypes import DType
from ..config import Family, GemmConfig
from ..family import FAMILIES, GemmFamily, register
from .. import plan, ranking, rules
from . import realign

MODULE = f"{plan.KERNELS}.tiled"
# Fractions of the model's ideal that the tiled kernels reach at their best, measured on an H200
# (benchmarks/results/h200/gemm_smoke.csv, 2026-11-21): 8192^3 bf16 ran at 610 TFLOP/s
# with the best tiled kernel and 786 with cuBLAS, of a 989 TFLOP/s peak.
TILED_FRACTION = 0.62
# Of the memory bandwidth, on the memory-bound (M <= 16) cases of benchmarks/results/h200/gemm.csv,
# the small-M tiled tiles reached 4.1-4.3 TB/s of 4.8.
TILED_BANDWIDTH_FRACTION = 0.88
KERNEL = ranking.TileKernel(TILED_FRACTION, TILED_BANDWIDTH_FRACTION)


def validate(config: GemmConfig, arch):
    yield from rules.output_tile_findings(config, rules.tensor_core_minimum(config))
    yield from rules.pointer_options(config)
    yield from rules.resource_and_dtype_findings(config, arch)


def shared_memory_bytes(config: GemmConfig) -> int:
    return rules.pipeline_bytes(config)


def accumulator_registers(config: GemmConfig) -> int:
    return rules.tile_registers(config, config.num_warps)


def kernel_units(config: GemmConfig, alignment, arch=None):
    t = config.types
    constexprs = {
        "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
        "GROUP_M": config.group_m, "SPLIT_K": config.split_k, **plan.epilogue_constexprs(config),
        "DOT_PRECISION": "tf32" if t.allow_tf32 else "ieee",
        "ACC_DTYPE": _accumulator(t.acc),
    }
    return plan.with_reduce(config, alignment, plan.pointer_unit(config, alignment, MODULE, "gemm_tiled", constexprs))


def device_score(config: GemmConfig, problem, arch):
    return ranking.tile_score(config, problem, arch, KERNEL)


FAMILY = register(realign.variant(GemmFamily(
    op=FAMILIES.op, name=Family.TILED.value, config_type=GemmConfig, validate=validate,
    supports=rules.tile_reason, score=ranking.rule_score, kernel_units=kernel_units, plan=plan.pointer_plan,
    correction=rules.tile_correction, device_score=device_score, host_launches=ranking.split_launches,
    shared_memory_bytes=shared_memory_bytes, accumulator_registers=accumulator_registers, tile_kernel=KERNEL,
)))


def _accumulator(dtype: DType):
    """The kernel's accumulator type: Triton's, imported with the first kernel built."""
    import triton.language as tl

    return tl.float16 if dtype is DType.FP16 else tl.float32
