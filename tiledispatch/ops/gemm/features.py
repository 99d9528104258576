"""Numeric features of (problem, config, arch) for a learned ranking model.

Kept beside the rule score so that both see the same quantities; the model's JSON
feature spec lists these names in this order.
"""

from __future__ import annotations

import math

from .config import GemmConfig
from .problem import GemmProblem
from .ranking import rule_score

FEATURE_NAMES = (
    "log2_m", "log2_n", "log2_k", "log2_batch", "itemsize_a", "block_m", "block_n", "block_k",
    "num_warps", "num_stages", "group_m", "split_k", "tile_m", "tile_n", "tile_k", "waves", "feed",
    "resident", "rule_score", "sm_count",
)


def features(problem: GemmProblem, config: GemmConfig, arch) -> tuple[float, ...]:
    score = rule_score(config, problem, arch)
    values = {
        "log2_m": math.log2(problem.m), "log2_n": math.log2(problem.n), "log2_k": math.log2(problem.k),
        "log2_batch": math.log2(problem.batch), "itemsize_a": problem.types.a.itemsize,
        "block_m": config.block_m, "block_n": config.block_n, "block_k": config.block_k,
        "num_warps": config.num_warps, "num_stages": config.num_stages, "group_m": config.group_m,
        "split_k": config.split_k, "rule_score": score.value, "sm_count": arch.sm_count,
        **{k: score.terms[k] for k in ("tile_m", "tile_n", "tile_k", "waves", "feed", "resident")},
    }
    return tuple(float(values[name]) for name in FEATURE_NAMES)
