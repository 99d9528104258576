"""Family `igemm`: tensor-core tiles over (pixels x channels), C/G (or K/G) reduced per filter tap,
groups on the grid (kernels/implicit_gemm.py). Its config, rules, model and grid are the implicit
GEMM's (implicit_gemm.py), shared with igemm-flat."""

from __future__ import annotations

from ....core.family import KernelFamily
from ..plan import KERNELS, output_tensor, pointer_plan
from ..problem import Direction
from ..signature import FAMILIES, Family
from . import implicit_gemm
from .implicit_gemm import ImplicitGemmConfig

MODULE = f"{KERNELS}.implicit_gemm"
FUNCTIONS = {Direction.FORWARD: "conv_fwd_igemm", Direction.BWD_DATA: "conv_bwd_data_igemm",
             Direction.BWD_WEIGHT: "conv_bwd_weight_igemm"}


def kernel_units(config: ImplicitGemmConfig, specialization, arch) -> tuple:
    return implicit_gemm.units(config, specialization, MODULE, FUNCTIONS[config.signature.direction])


def plan(config: ImplicitGemmConfig, ops):
    return pointer_plan(config, ops, output_tensor(ops), implicit_gemm.grid)


FAMILY = FAMILIES.register(KernelFamily(
    op="conv", name=Family.IMPLICIT_GEMM.value, config_type=ImplicitGemmConfig,
    validate=implicit_gemm.findings, supports=implicit_gemm.supports, score=implicit_gemm.igemm_score,
    kernel_units=kernel_units, plan=plan, correction=implicit_gemm.correction,
))
