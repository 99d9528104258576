"""Family `gemm`: a 1x1, stride-1, unpadded dense conv as one call of the GEMM op (the call: ../pointwise.py).

The GEMM op's own ranking picks the tile among its Triton kernels, so there is one config a
signature, as for the vendor; its score is the GEMM op's modelled time for that kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....core.family import KernelFamily
from ....core.launch import Launch, Plan
from ....core.op import Score
from ....core.runtime import current_arch
from .. import pointwise
from ..plan import output_tensor, python_unit
from ..problem import ConvProblem, Direction
from ..ranking import ideal_seconds
from ..rules import Findings, signature_findings, signature_refusal
from ..signature import FAMILIES, ConvSignature, Family

# The GEMM op's model of its best Triton kernel, against that kernel's time on the suite's 1x1 conv
# (resnet50_1x1, 3.3 GFLOP a direction, H100, a scratch probe's graphs): forward 10.0 us modelled 12.65,
# backward-data 10.3 / 11.2, backward-weight 15.8-16.4 / 20.9. Fitted on larger GEMMs, it over-models
# these by about this much; without it the conv's own TMA kernels, 9-26 % slower, ranked first.
POINTWISE_GEMM_FIT = 0.83


@dataclass(frozen=True)
class PointwiseConfig:
    """A 1x1, stride-1, unpadded dense conv run as one GEMM by the GEMM op's Triton kernels.

    Channels-last, such a conv is a matrix product of its tensors' 2-D views (pixels x
    channels), which the GEMM op's persistent TMA kernels run faster than the conv's
    implicit GEMMs; the GEMM op's own ranking picks the tile, so there is one config a
    signature, as for the vendor.
    """

    signature: ConvSignature
    family: Family = Family.GEMM

    @property
    def name(self) -> str:
        return f"conv_{self.signature.name}_gemm_{self.signature.epilogue.name}"


def findings(config: PointwiseConfig, arch) -> Findings:
    """The signature's rules: beyond them, the GEMM op validates the kernels it picks."""
    out = Findings()
    signature_findings(config.signature, arch, out)
    return out


def supports(config: PointwiseConfig, problem: ConvProblem) -> str | None:
    """Why the GEMM op cannot run `problem` as one matrix product (None: it can)."""
    refusal = signature_refusal(config, problem)
    if refusal is not None:
        return refusal
    if problem.groups != 1:
        return f"the gemm family runs dense convs as one GEMM; this conv has {problem.groups} groups"
    if not problem.pointwise:
        return (f"the gemm family runs 1x1 convs of stride 1 and no padding as a GEMM; this conv has filter "
                f"{problem.filter_size}, stride {problem.stride}, padding {problem.padding}")
    return None


def pointwise_score(config: PointwiseConfig, p: ConvProblem, arch) -> Score:
    """The gemm family: the device time the GEMM op's own ranking models for its best Triton kernel;
    for a forward, none (a score of 0) where the GEMM op would run the product on its vendor library.

    Why: on resnet50's and MobileNet's large 1x1 forwards the family's Triton GEMMs ran 0.57-0.88x
    cuDNN where cuBLAS ran 0.89-1.0x (H200, results/h200/conv_1x1_gemm.txt), and the GEMM op picks
    cuBLAS for those products; its ranking, learned where a model ships, knows its Triton kernels
    lose there better than this score does (measured over modelled time on the conv sweep's 44
    pointwise problems: median 0.72, P90 1.53, no one factor). The backward directions keep the
    score: no measurement says the same of them."""
    gemm = pointwise.gemm_problem(p)
    if p.direction is Direction.FORWARD:
        # The op's ranking holds the family's own: its first Triton kernel by the rules is what
        # `gemm_dispatcher` (the same kernels less the vendor's, ranked by the rules) runs.
        dispatcher = pointwise.gemm_op_dispatcher(arch)
        if dispatcher.select(gemm).is_vendor:
            return Score(0.0, {"gemm_picks_vendor": 1.0})
        best = dispatcher.explain(gemm).refusals.rules_first(lambda c: not c.spec.is_vendor)
    else:
        ranked = pointwise.gemm_dispatcher(arch).ranked(gemm)
        best = ranked[0] if ranked else None
    if best is None:
        return Score(0.0, {"gemm_kernels": 0.0})
    modelled = best.score.terms["modelled_us"] * 1e-6 * POINTWISE_GEMM_FIT
    return Score(ideal_seconds(p, arch) / modelled, {"modelled_us": modelled * 1e6})


_UNIT = python_unit("gemm", "tiledispatch.ops.conv.pointwise", "run", ("operands", "out", "dispatcher"))


def plan(config: PointwiseConfig, ops) -> Plan:
    """The GEMM op's call, which plans and launches its own kernel."""
    out = output_tensor(ops)
    return Plan((Launch("gemm", (1, 1, 1), (ops, out, pointwise.gemm_dispatcher(current_arch()))),), out)


FAMILY = FAMILIES.register(KernelFamily(
    op="conv", name=Family.GEMM.value, config_type=PointwiseConfig, validate=findings, supports=supports,
    score=pointwise_score, kernel_units=lambda config, specialization, arch: (_UNIT,), plan=plan,
))
