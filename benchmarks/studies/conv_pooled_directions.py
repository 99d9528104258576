"""Would one conv model over the three directions' rows rank better than a model per direction?

Trains LightGBM rankers as `tiledispatch train` does (`heuristics.training`: the same features,
grades and parameters) on the H200 conv sweeps, and scores each direction's picks on problems its
fold's model never saw: efficiency against the oracle (mean, P10, min) and the pick against cuDNN
(geomean, picks below 0.98x). Each direction is judged twice: by a model of its own rows ("alone")
and by one of every direction's rows, the direction a feature ("pooled"). Folds are drawn two ways:
by problem, as `tiledispatch evaluate --cv` draws them, and by the layer's shape with its direction
left out, so that a held-out problem's twins (the same layer in the other directions) train no model
that judges it. Runs on the CPU; needs LightGBM and pandas.

    python benchmarks/studies/conv_pooled_directions.py [--table-dir benchmarks/results/h200/selection]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from tiledispatch.bench.problemsets import fold_of
from tiledispatch.bench.table import SelectionKey
from tiledispatch.cli.train import read_complete
from tiledispatch.heuristics import training

DIRECTIONS = ("forward", "bwd_data", "bwd_weight")
FOLDS = 5


def scores(data, costs, seen, vendor, vendor_name: str = "cuDNN") -> str:
    """Efficiency against the oracle of the `seen` rows' picks (lowest cost), and the picks against
    the vendor's kernel (`vendor` marks its rows)."""
    ids = data.problem_ids[seen]
    chosen = training.selection(data.log_ms[seen], costs[seen], ids)
    ratios = []
    for start, end in training._groups(ids):
        log_ms, cost, is_vendor = data.log_ms[seen][start:end], costs[seen][start:end], vendor[seen][start:end]
        if is_vendor.any():
            ratios.append(np.exp(log_ms[is_vendor][0] - log_ms[np.argmin(cost)]))
    ratios = np.array(ratios)
    return (f"mean {chosen['mean']:.3f}  P10 {chosen['p10']:.3f}  min {chosen['min']:.3f}  "
            f"vs {vendor_name} {np.exp(np.log(ratios).mean()):.3f}  below 0.98x {int((ratios < 0.98).sum())}")


def held_out_costs(data, fold: np.ndarray, own: np.ndarray, pooled: bool) -> np.ndarray:
    """Each `own` row's cost by the model of its fold's others (every row's with `pooled`, else the
    own rows'); NaN elsewhere."""
    import lightgbm

    costs = np.full(len(fold), np.nan)
    for f in range(FOLDS):
        judged = own & (fold == f)
        if not judged.any():
            continue
        trained = (fold != f) & (True if pooled else own)
        booster = lightgbm.train(dict(training.DEFAULT_PARAMS), training._dataset(data, trained), training.ROUNDS)
        costs[judged] = -booster.predict(data.matrix[judged])
    return costs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table-dir", default="benchmarks/results/h200/selection")
    parser.add_argument("--dtype", default="bf16")
    args = parser.parse_args()
    keys = {d: SelectionKey("conv", d, args.dtype, "sm_90") for d in DIRECTIONS}
    frames = [training.rows_of(read_complete(Path(f"{args.table_dir}/conv_{d}_{args.dtype}_sweep.parquet"))[0], keys[d])
              for d in DIRECTIONS]
    rows = pd.concat(frames).sort_values(["problem_id", "kernel"], kind="stable").reset_index(drop=True)
    data = training.featurize(rows, keys["forward"])  # one feature spec over every direction's rows
    # a problem's layer: its JSON without the direction, the same for a forward and its gradients
    info = {pid: (json.loads(text)["direction"], training.shape_of(text, without=("direction",)))
            for pid, text in zip(rows.problem_id, rows.problem)}
    direction = np.array([info[p][0] for p in data.problem_ids])
    shape = np.array([info[p][1] for p in data.problem_ids])
    vendor = rows["kernel"].str.contains("_vendor_").to_numpy()
    print(f"{len(set(data.problem_ids))} problems, {len(set(shape))} layer shapes, {len(rows)} rows")
    for by, groups in (("problem", data.problem_ids), ("shape", shape)):
        fold = np.array([fold_of(str(g), FOLDS) for g in groups])
        for target in DIRECTIONS:
            own = direction == target
            for pooled in (False, True):
                costs = held_out_costs(data, fold, own, pooled)
                label = "pooled" if pooled else "alone"
                print(f"folds by {by:7s}  {target:10s}  {label:6s}  {scores(data, costs, ~np.isnan(costs), vendor)}")


if __name__ == "__main__":
    main()
