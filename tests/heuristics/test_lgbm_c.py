"""Shipped models predict through LightGBM's C library alone (heuristics/lgbm_c.py): the same
numbers as the package's Booster, and a process's first ranking imports neither the package nor
what it drags in (scipy, pandas)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightgbm")

from tiledispatch.heuristics import lgbm_c  # noqa: E402
from tiledispatch.heuristics.features import ModelFormatError  # noqa: E402
from tiledispatch.heuristics.learned import _booster  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "tiledispatch" / "arch" / "models" / "sm_90"
SHIPPED = sorted(MODELS.glob("*.txt"))
needs_library = pytest.mark.skipif(lgbm_c.library() is None, reason="lib_lightgbm does not load on its own here")


@needs_library
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_c_library_predicts_as_the_package_does(path):
    import lightgbm

    text = path.read_text()
    ours, theirs = lgbm_c.booster_from_text(text), lightgbm.Booster(model_str=text)
    assert isinstance(ours, lgbm_c.CBooster)
    assert ours.feature_name() == theirs.feature_name() and ours.num_feature() == theirs.num_feature()
    rng = np.random.default_rng(7)
    matrix = rng.normal(2.0, 3.0, (64, ours.num_feature()))
    matrix[:, ::3] = rng.integers(0, 4, (64, len(range(0, ours.num_feature(), 3))))  # category codes too
    matrix[rng.random(matrix.shape) < 0.05] = np.nan  # a missing value is a feature's too
    assert np.array_equal(ours.predict(matrix, num_threads=1), theirs.predict(matrix, num_threads=1))
    assert ours.model_to_string() == text
    # A ranking's few rows go one by one through the single-row path, more in one call: the same numbers.
    many = np.concatenate([matrix] * 3)
    assert len(many) > lgbm_c.FAST_ROWS >= len(matrix)
    assert np.array_equal(ours.predict(many, num_threads=1)[:16], ours.predict(many[:16], num_threads=1))
    assert np.array_equal(ours.predict(matrix[::2], num_threads=1), theirs.predict(matrix[::2], num_threads=1))
    with pytest.raises(ValueError, match="features"):
        ours.predict(matrix[:, :-1])


@needs_library
def test_a_text_that_is_no_model_is_refused_by_name(tmp_path):
    with pytest.raises(ModelFormatError, match="not a LightGBM model"):
        _booster("this is not a model", tmp_path / "bad.txt")


@needs_library
def test_a_first_ranking_by_a_shipped_model_imports_no_lightgbm_package():
    script = textwrap.dedent("""
        import json, sys
        from tiledispatch import arch
        from tiledispatch.bench.problemsets import load_problems
        from tiledispatch.core.dispatcher import Dispatcher
        from tiledispatch.core.op import all_ops
        from tiledispatch.core.registry import Registry

        sm90 = arch.load("sm_90")
        problem = load_problems("benchmarks/results/h200/selection/problems/sweep_gemm_main.json")[0]
        registry = Registry.from_rule_sets([d.kind for d in all_ops()], "default", sm90)
        ranking = Dispatcher(registry, sm90, strategy="model")._rank(problem)
        print(json.dumps({"model": ranking.model, "loaded": sorted(m for m in ("lightgbm", "scipy", "pandas")
                                                                   if m in sys.modules)}))
    """)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["model"] and got["model"].startswith("sm_90/gemm_forward_bf16")
    assert got["loaded"] == []
