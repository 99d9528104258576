"""The vendor family: cuBLAS (cuBLASLt, or torch._scaled_mm for fp8) through PyTorch, with the
epilogue as separate steps (../vendor.py runs it). It takes any strides, so its layout is
always ``sss``; it picks its own kernel, so it has no tile to rank, tune or correct, and each
epilogue step is one more pass over C, which the ranking charges for."""

from __future__ import annotations

from ....core.launch import Launch, Plan
from ....core.op import KernelUnit, Score, UnitKind
from ....heuristics.roofline import dram_bytes_per_s, soft_max
from ..config import Family, VendorConfig
from ..family import FAMILIES, GemmFamily, register
from ..problem import Activation, GemmProblem, Layout
from .. import plan, ranking, rules, vendor
from ..rules import GemmRule, error

# Fractions of the model's ideal that cuBLAS reaches at its best, measured on an H200
# (benchmarks/results/h200/gemm_smoke.csv, 2026-11-21): 8192^3 bf16 ran at 786 TFLOP/s with
# cuBLAS (610 with the best tiled kernel), of a 989 TFLOP/s peak.
VENDOR_FRACTION = 0.79
# cuBLAS where an operand's base or rows are not 16-byte multiples: 133-138 TFLOP/s on
# odd_4095x4097x4093 in bf16 and fp16 (benchmarks/results/h200/gemm.csv), 0.14 of the peak.
VENDOR_UNALIGNED_FRACTION = 0.14
# torch._scaled_mm reached 1194-1348 TFLOP/s at 4096^3/8192^3 fp8, of a 1979 peak.
VENDOR_FP8_FRACTION = 0.70
# Of the memory bandwidth, on the memory-bound (M <= 16) cases of benchmarks/results/h200/gemm.csv,
# cuBLAS reached 4.1 TB/s of 4.8.
VENDOR_BANDWIDTH_FRACTION = 0.86
# cuBLAS on a few rows (M <= 16) over a deep K takes a fixed ~1.3-3 us more than our one-launch kernels on the
# same bytes (results/h100/gemm_decode.csv: llama3_8b_o_T1 and _T16, 33.5 MB, 15.4-15.7 us against
# 12.5 for gemv and 14.3 for tiled 16x32x512, where on 235 MB all three ran within 3 %), as a
# split K with a reduction would. torch._scaled_mm (fp8) showed no such cost.
VENDOR_SPLIT_ROWS = 16
VENDOR_SPLIT_DEPTH = 1024  # K: the cases measured had 4096-28672; a 16x16x16 call shows no split
VENDOR_SPLIT_SECONDS = 1.5e-6
# torch.mm's host time on an H200 (benchmarks/results/h200/gemm_host_profile.txt, 16x16 bf16):
# 7.3-7.6 us a call, beside the signature (ranking.HOST_SIGNATURE_SECONDS).
HOST_VENDOR_SECONDS = 7.4e-6

UNIT = KernelUnit(
    stage="vendor", module="tiledispatch.ops.gemm.vendor", function="run",
    signature=tuple((name, "python") for name in
                    ("a", "b", "out", "bias", "residual", "scale_a", "scale_b", "activation", "tf32")),
    constexprs=(), num_warps=0, num_stages=0, kind=UnitKind.PYTHON,
)


def validate(config: VendorConfig, arch):
    if arch.is_interpreter:
        yield error(GemmRule.FAMILY_ARCH, "the vendor path is a GPU library; the interpreter target runs Triton "
                    "kernels", "use a GPU arch")
    t = config.types
    if t.a.is_fp8 and not arch.supports_dtype(t.a):
        yield error(GemmRule.DTYPE_ARCH, f"{t.a.value} needs sm_89 or newer")
    if t.acc.value != "fp32":
        yield error(GemmRule.ACCUMULATOR, "cuBLAS through PyTorch accumulates in fp32")
    if config.layout.name != "sss":
        yield error(GemmRule.LAYOUT, "the vendor path takes any strides: use layout sss")


def supports(config: VendorConfig, problem: GemmProblem) -> str | None:
    reason = rules.signature_reason(config, problem)
    if reason is not None:
        return reason
    if problem.types.scaled:
        layout = problem.layout
        if layout.a is not Layout.ROW or layout.b is not Layout.COL or problem.batch > 1:
            return "torch._scaled_mm needs A row-major, B column-major and no batch"
        if problem.k % 16 or problem.n % 16:
            return f"torch._scaled_mm needs K and N multiples of 16 (K={problem.k}, N={problem.n})"
    return None


def vendor_steps(p: GemmProblem) -> int:
    """The passes over C after the vendor's matmul: one per epilogue step, one for a wider output."""
    steps = int(p.epilogue.bias) + int(p.epilogue.activation is not Activation.NONE) + int(p.epilogue.residual)
    if p.types.c is not p.types.a and not p.types.scaled:
        steps += 1  # fp32 output from half inputs: computed in fp32, then copied
    return steps


def device_score(config: VendorConfig, problem: GemmProblem, arch) -> Score:
    """cuBLAS picks its own tile, so no waste terms; but each epilogue step is one more pass."""
    p = problem
    ideal = ranking.problem_ideal_seconds(p, arch)
    steps = vendor_steps(p)
    launch_s = arch.calibration.launch_s
    step_s = 2 * p.batch * p.m * p.n * p.types.c.itemsize / dram_bytes_per_s(arch) + launch_s
    fraction = VENDOR_FP8_FRACTION if p.types.scaled else VENDOR_FRACTION
    if p.alignment.unaligned_operands:
        fraction = VENDOR_UNALIGNED_FRACTION
    compute_s = p.flops() / ranking.peak_flops(p, arch) / fraction
    memory_s = p.bytes() / dram_bytes_per_s(arch) / VENDOR_BANDWIDTH_FRACTION
    # cuBLAS's kernel costs one launch, as a Triton kernel does (the benchmark times device work).
    modelled = soft_max(compute_s, memory_s) + launch_s + steps * step_s
    if p.m <= VENDOR_SPLIT_ROWS and p.k >= VENDOR_SPLIT_DEPTH and not p.types.scaled:
        modelled += VENDOR_SPLIT_SECONDS
    return Score(ideal / modelled, {"epilogue_steps": float(steps), "modelled_us": modelled * 1e6})


def host_launches(config: VendorConfig, problem: GemmProblem) -> int:
    """Each epilogue step is one more PyTorch op after the library's call."""
    return vendor_steps(problem)


def kernel_units(config: VendorConfig, alignment, arch=None) -> tuple[KernelUnit, ...]:
    return (UNIT,)


def launch_plan(config: VendorConfig, ops) -> Plan:
    p = ops.problem
    out = plan.output(ops)
    args = (ops.a, ops.b, out, ops.bias, ops.residual, ops.scale_a, ops.scale_b, p.epilogue.activation,
            vendor.tf32_switch(p.types))
    return Plan((Launch("vendor", (1, 1, 1), args),), out)


FAMILY = register(GemmFamily(
    op=FAMILIES.op, name=Family.VENDOR.value, config_type=VendorConfig, validate=validate,
    supports=supports, score=ranking.rule_score, kernel_units=kernel_units, plan=launch_plan,
    device_score=device_score, host_launches=host_launches, call_overhead_s=HOST_VENDOR_SECONDS,
))
