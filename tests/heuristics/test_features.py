"""The featurizer's field-by-field reading (kept codes, scalars read straight) against the plain
reading it stands for: `dict(flatten(obj))`, each column encoding its path's leaf."""

import numpy as np

from tiledispatch import arch
from tiledispatch.core.op import OpKind, RuleSet, get_op
from tiledispatch.core.registry import Registry
from tiledispatch.heuristics import features
from tiledispatch.heuristics.features import Source
from tiledispatch.ops.conv.problem import ConvProblem, ConvTypes, Direction

SM90 = arch.load("sm_90")
CONV = get_op(OpKind.CONV)


def plain_matrix(spec, problem, configs, scores):
    """The matrix as read without any kept codes: each column from its source's flattened values."""
    rows = []
    for config, score in zip(configs, scores):
        values = {Source.PROBLEM: features.problem_values(problem), Source.CONFIG: features.config_values(config),
                  Source.KERNEL: features.kernel_values(spec.op, config),
                  Source.DERIVED: features.derived_values(problem), Source.SCORE: features.score_values(score),
                  Source.ARCH: features.arch_values(SM90)}
        rows.append([c.encode(values[c.source].get(c.path)) for c in spec.columns])
    return np.array(rows, dtype=np.float64)


def test_a_conv_matrix_is_the_plain_reading_to_the_bit():
    problems = [ConvProblem(Direction.FORWARD, 8, 64, 64, 1, (56, 56), (3, 3), 1, 1, 1, ConvTypes.parse("bf16")),
                ConvProblem(Direction.FORWARD, 4, 128, 256, 1, (28, 28), (1, 1), 2, 0, 1, ConvTypes.parse("bf16")),
                ConvProblem(Direction.FORWARD, 2, 32, 32, 1, (14, 14), (5, 5), 1, 2, 1, ConvTypes.parse("bf16"))]
    registry = Registry.from_rule_sets([OpKind.CONV], RuleSet.DEFAULT, SM90)
    cases = []
    for p in problems:
        configs = [s.config for s in registry.candidates(OpKind.CONV, p) if CONV.supports(s.config, p) is None]
        cases.append((p, configs, [CONV.rule_score(c, p, SM90) for c in configs]))
    spec = features.fit_spec("conv", [p for p, _, _ in cases[:2]], [c for _, cs, _ in cases[:2] for c in cs],
                             [s for _, _, ss in cases[:2] for s in ss], SM90)
    featurizer = features.Featurizer(spec)
    for _ in range(2):  # the second time from the kept codes and rows
        for p, configs, scores in cases:
            got = featurizer.matrix(p, configs, SM90, scores)
            assert got.tobytes() == plain_matrix(spec, p, configs, scores).tobytes()


def test_an_unknown_category_is_named_as_flatten_spells_it():
    p = ConvProblem(Direction.FORWARD, 8, 64, 64, 1, (56, 56), (3, 3), 1, 1, 1, ConvTypes.parse("bf16"))
    spec = features.fit_spec("conv", [p], [], [], SM90)
    direction = next(c for c in spec.columns if c.path == "direction")
    narrowed = features.FeatureSpec("conv", tuple(
        features.Column(c.source, c.path, c.kind, c.transform, ("backward-data",)) if c is direction else c
        for c in spec.columns))
    featurizer = features.Featurizer(narrowed)
    assert featurizer.unknown_categories(p) == ("direction='forward'",)
