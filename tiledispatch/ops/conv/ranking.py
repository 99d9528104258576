"""The `rules` score of a conv config for a problem: a small time model, no timing.

Each family models its own kernels (``families/``: `score` of each): what it computes,
how its tiles fill the machine, and where its time goes. `rule_score` asks the config's
family. Here are the parts they share: the ideal time every score is measured against,
the busiest SM's share of the tiles, and the terms that compare families with each other.
Score = ideal time / modelled time, in (0, 1].
"""

from __future__ import annotations

import math

from ...core.dtypes import DType
from ...core.op import Score
from ...heuristics.roofline import fma_flops, tensor_flops
from ...heuristics.roofline import ideal_seconds as roofline_seconds
from ...heuristics.roofline import per_problem
from .problem import ConvProblem
from .signature import FAMILIES

# Operand re-reads served from L2, as a multiple of DRAM bandwidth. A kernel term, not a machine
# fact: the multiple follows the kernels' tile order and re-reads (the GEMM op's grouped tile order
# takes 5.0).
L2_REUSE = 4.0
SPILL_PENALTY = 0.15
# Warps an SM needs issuing wgmma/mma to keep its tensor cores busy: two warpgroups (the
# 8-warp 128x128 and 128x256 tiles of the GEMM op's fastest H200 kernels).
WARPS_TO_FILL_SM = 8
# Atomic split-K sums in a different order each run: taken only when clearly faster.
NONDETERMINISTIC_PENALTY = 0.97
VENDOR_CALL_SECONDS = 2e-6  # GPU-side fixed cost of a cuDNN call (the benchmark times graph replays)
# The dispatcher takes a Triton kernel over cuDNN only when the model says it is faster by
# more than its own error: modelled / measured of the Triton kernels the rules pick on
# conv.csv spans 0.8-1.9x (grouped implicit GEMMs with narrow N run 1.2-1.9x slower than
# modelled), so the vendor's modelled time is divided by this before they are compared.
VENDOR_TRUST = 1.3


@per_problem  # every candidate's score reads it: once a problem
def peak_flops(p: ConvProblem, arch) -> float:
    """The problem's compute peak: CUDA-core FMAs for strict fp32, the tensor cores otherwise."""
    t = p.types
    if t.dtype is DType.FP32 and not t.allow_tf32:
        return fma_flops(arch)
    return tensor_flops(arch, t.dtype)


@per_problem
def ideal_seconds(p: ConvProblem, arch) -> float:
    return roofline_seconds(p.flops(), p.bytes(), peak_flops(p, arch), arch)


def sm_efficiency(tiles: int, resident: int, num_warps: int, sm_count: int,
                  warps_to_fill: int = WARPS_TO_FILL_SM) -> tuple[float, int]:
    """Busy fraction of the tensor cores, and the programs each SM runs at once.

    Time follows the busiest SM: it runs ceil(tiles / SMs) tiles, min(that, resident) at
    a time, and its tensor cores are full once WARPS_TO_FILL_SM warps issue MMAs. So 98
    tiles of 128x128 (8 warps) on 132 SMs keep 98 SMs full (0.74), where counting slots
    of two resident programs would say 0.37 and prefer twice as many half-size tiles.
    """
    per_sm = math.ceil(tiles / sm_count)
    concurrent = min(resident, per_sm)
    balance = tiles / (sm_count * per_sm)
    return balance * min(1.0, concurrent * num_warps / warps_to_fill), concurrent


def rule_score(config, problem: ConvProblem, arch) -> Score:
    """`config`'s score for `problem` on `arch`, by its family's model."""
    return FAMILIES.of(config).score(config, problem, arch)
