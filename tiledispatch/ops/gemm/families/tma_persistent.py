"""The tma-persistent family (kernels/tma_persistent.py, sm_90+): Hopper tensor descriptors, one
program per SM walking the tiles in grouped order, the C tile stored in `epilogue_split` slices,
optionally one software pipeline across tiles (`flatten`), and split-K for few output tiles over
a deep K. Operands 16-byte aligned with a contiguous last dim (its realign variant copies the
others). stream-k runs its main loop and shares `main_unit`."""

from __future__ import annotations

from ....core.dtypes import DType
from ....core.op import KernelUnit
from ..config import Family, GemmConfig
from ..family import FAMILIES, GemmFamily, register
from ..problem import VECTOR_BYTES, Alignment, Layout
from .. import plan, ranking, rules
from . import realign

MODULE = f"{plan.KERNELS}.tma_persistent"
# 744 TFLOP/s at 4096^3 bf16 (benchmarks/results/h200/gemm.csv) of a 989 peak, after its own terms.
TMA_FRACTION = 0.80
KERNEL = ranking.TileKernel(TMA_FRACTION, ranking.TMA_BANDWIDTH_FRACTION, persistent=True)


def validate(config: GemmConfig, arch):
    yield from rules.output_tile_findings(config, rules.tensor_core_minimum(config))
    yield from rules.tma_findings(config, arch)
    yield from rules.resource_and_dtype_findings(config, arch)


def shared_memory_bytes(config: GemmConfig) -> int:
    return rules.pipeline_bytes(config, rules.c_staging_bytes(config))


def accumulator_registers(config: GemmConfig) -> int:
    return rules.tile_registers(config, config.num_warps)


def main_unit(config: GemmConfig, alignment: Alignment, module: str, function: str, schedule: dict,
              scratch: tuple[tuple[str, str], ...] = (), dealt: tuple[tuple[str, str], ...] = ()) -> KernelUnit:
    """The main stage of a TMA family written in Triton: descriptors of A, B and C, `scratch`
    pointers (16-byte aligned buffers of ours), the epilogue's operands and the sizes, `dealt`
    arguments of a schedule, then the tile's and `schedule`'s constexprs."""
    t = config.types
    dtypes = {"a_desc": t.a, "b_desc": t.b, "c_desc": DType.FP32 if config.split_k > 1 else t.c}
    descriptors = [(name, f"tensordesc<{dtypes[name].triton}[{','.join(map(str, block))}]>")
                   for name, block in plan.descriptor_blocks(config).items()]
    args = descriptors + list(scratch) + [
        ("bias_ptr", f"*{t.c.triton}"), ("res_ptr", f"*{t.c.triton}"), ("scale_a_ptr", "*fp32"),
        ("scale_b_ptr", "*fp32"), ("M", "i32"), ("N", "i32"), ("K", "i32"), ("batch", "i32"),
        ("a_batch_step", "i32"), ("b_batch_step", "i32"), *dealt, *plan.EPILOGUE_STRIDES,
    ]
    constexprs = {
        "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
        "GROUP_M": config.group_m, "A_K_MAJOR": config.layout.a is Layout.ROW,
        "B_K_MAJOR": config.layout.b is Layout.COL, **schedule, **plan.epilogue_constexprs(config),
        "DOT_PRECISION": "tf32" if t.allow_tf32 else "ieee",
        "ACC_DTYPE": _accumulator(t.acc),
    }
    signature = tuple(args + [(name, "constexpr") for name in constexprs])
    divisibility = plan.divisibility(alignment, t, signature, False) + tuple(
        (name, VECTOR_BYTES) for name, _ in scratch)
    return KernelUnit(
        stage="main", module=module, function=function, signature=signature,
        constexprs=tuple(sorted(constexprs.items())), num_warps=config.num_warps, num_stages=config.num_stages,
        divisibility=divisibility,
    )


def kernel_units(config: GemmConfig, alignment: Alignment, arch=None) -> tuple[KernelUnit, ...]:
    schedule = {"EPILOGUE_SPLIT": config.epilogue_split, "FLATTEN": config.flatten, "SPLIT_K": config.split_k}
    return plan.with_reduce(config, alignment, main_unit(config, alignment, MODULE, "gemm_tma_persistent", schedule))


def launch_plan(config: GemmConfig, ops):
    return plan.persistent_plan(config, ops, plan.descriptor_blocks(config))


def device_score(config: GemmConfig, problem, arch):
    return ranking.tile_score(config, problem, arch, KERNEL)


def name_options(config: GemmConfig) -> str:
    return f"_e{config.epilogue_split}" + ("f" if config.flatten else "")


FAMILY = register(realign.variant(GemmFamily(
    op=FAMILIES.op, name=Family.TMA_PERSISTENT.value, config_type=GemmConfig, validate=validate,
    supports=rules.tma_tile_reason, score=ranking.rule_score, kernel_units=kernel_units, plan=launch_plan,
    correction=rules.tile_correction, device_score=device_score, host_launches=ranking.split_launches,
    shared_memory_bytes=shared_memory_bytes, accumulator_registers=accumulator_registers,
    fits=rules.tma_fits, name_options=name_options, uses_tma=True, tile_kernel=KERNEL,
)))


def _accumulator(dtype: DType):
    """The kernel's accumulator type: Triton's, imported with the first kernel built."""
    import triton.language as tl

    return tl.float16 if dtype is DType.FP16 else tl.float32
