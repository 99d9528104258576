"""Which LightGBM objective picks better on unseen problems: a regression of log time or
LambdaRank over each problem's kernels (the shipped one). No GPU: it reads a sweep's table (one op, direction, dtype and arch).

Both learn from the same rows and features (heuristics.training's), in the same grouped 5-fold
split by problem (bench.problemsets.fold_of); each fold's model picks, on the problems it never
saw, the kernel it ranks first. Printed per objective: the pick's efficiency against the oracle
(mean, P10 by nearest rank, min), and against the vendor kernel (geomean, picks below 0.98x).

    python benchmarks/studies/selection_objective.py [benchmarks/results/h200/selection/gemm_bf16_sweep.parquet]
"""

from __future__ import annotations

import math
import sys

import lightgbm
import numpy as np
import pandas as pd

from tiledispatch.bench.problemsets import fold_of
from tiledispatch.bench.table import SelectionKey
from tiledispatch.heuristics import training

TABLE = "benchmarks/results/h200/selection/gemm_bf16_sweep.parquet"
FOLDS = 5


def costs_by_fold(data, params: dict, label: np.ndarray) -> np.ndarray:
    """Each row's cost (lower first) from the fold's model that did not see its problem."""
    folds = np.array([fold_of(str(p), FOLDS) for p in data.problem_ids])
    costs = np.zeros(len(folds))
    for f in range(FOLDS):
        train, valid = folds != f, folds == f
        groups = [end - start for start, end in training._groups(data.problem_ids[train])]
        dataset = lightgbm.Dataset(data.matrix[train], label[train], feature_name=data.spec.names,
                                   categorical_feature=data.spec.categorical, group=groups)
        booster = lightgbm.train(params, dataset, training.ROUNDS)
        predicted = booster.predict(data.matrix[valid])
        costs[valid] = predicted if params["objective"] == "regression" else -predicted
    return costs


def report(name: str, data, costs: np.ndarray, vendor: np.ndarray) -> None:
    efficiency, against_vendor = [], []
    for start, end in training._groups(data.problem_ids):
        times = np.exp(data.log_ms[start:end])
        pick = int(np.argmin(costs[start:end]))
        efficiency.append(times.min() / times[pick])
        vendors = np.flatnonzero(vendor[start:end])
        against_vendor.append(times[vendors[0]] / times[pick] if len(vendors) else 1.0)
    e, v = np.sort(efficiency), np.array(against_vendor)
    p10 = e[math.ceil(len(e) / 10) - 1]
    print(f"{name:12s} mean {e.mean():.4f}  P10 {p10:.4f}  min {e.min():.3f}  | vs vendor geomean "
          f"{np.exp(np.log(v).mean()):.4f}, below 0.98x: {int((v < 0.98).sum())} of {len(v)}")


def main() -> None:
    table = pd.read_parquet(sys.argv[1] if len(sys.argv) > 1 else TABLE)
    first = table.iloc[0]
    key = SelectionKey(first["op"], first["direction"], first["dtype"], first["arch"])  # one key a table
    rows = training.rows_of(table, key)
    data = training.featurize(rows, key)
    vendor = rows["kernel"].str.contains("_vendor_").to_numpy()
    ranker = dict(training.DEFAULT_PARAMS, seed=0)
    regression = {k: v for k, v in ranker.items() if k not in ("eval_at", "lambdarank_truncation_level", "label_gain")}
    regression.update(objective="regression", metric="rmse")
    report("regression", data, costs_by_fold(data, regression, data.log_ms), vendor)
    report("lambdarank", data, costs_by_fold(data, ranker, training.grades(data.log_ms, data.problem_ids)), vendor)


if __name__ == "__main__":
    main()
