"""Would a conv fp16 model rank better trained on the bf16 sweep's rows as well as its own?

fp16 and bf16 run the same kernels at the same tensor-core rate and move the same bytes, so the
bf16 sweeps may stand in for fp16 problems no one swept. For each conv direction with an fp16
sweep, this trains LightGBM rankers as `tiledispatch train` does (`heuristics.training`: the same
features, grades and parameters) and scores the picks on fp16 problems a fold's model never saw
(efficiency against the oracle: mean, P10, min; the pick against cuDNN): by a model of the fp16
rows alone, and by one of the fp16 and bf16 rows together, the dtype a feature. Folds are drawn by
the layer's shape with its dtype left out, so a held-out fp16 problem's bf16 twin trains no model
that judges it. Runs on the CPU; needs LightGBM and pandas.

    python benchmarks/studies/conv_pooled_dtypes.py [--table-dir benchmarks/results/h200/selection]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from tiledispatch.bench.problemsets import fold_of
from tiledispatch.bench.table import SelectionKey
from tiledispatch.heuristics import training

FOLDS = 5


def shape_of(problem_json: str) -> str:
    """The problem without its dtype: the layer an fp16 and a bf16 problem share."""
    fields = json.loads(problem_json)
    fields.get("types", {}).pop("dtype", None)
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def scores(data, costs, judged, vendor) -> str:
    ids = data.problem_ids[judged]
    chosen = training.selection(data.log_ms[judged], costs[judged], ids)
    ratios = []
    for start, end in training._groups(ids):
        log_ms, cost, is_vendor = data.log_ms[judged][start:end], costs[judged][start:end], vendor[judged][start:end]
        if is_vendor.any():
            ratios.append(np.exp(log_ms[is_vendor][0] - log_ms[np.argmin(cost)]))
    ratios = np.array(ratios)
    return (f"mean {chosen['mean']:.3f}  P10 {chosen['p10']:.3f}  min {chosen['min']:.3f}  "
            f"vs cuDNN {np.exp(np.log(ratios).mean()):.3f}  below 0.98x {int((ratios < 0.98).sum())}")


def main() -> None:
    import lightgbm

    parser = argparse.ArgumentParser()
    parser.add_argument("--table-dir", default="benchmarks/results/h200/selection")
    args = parser.parse_args()
    for direction in ("forward", "bwd_data", "bwd_weight"):
        path = Path(args.table_dir) / f"conv_{direction}_fp16_sweep.parquet"
        if not path.exists():
            continue
        keys = {d: SelectionKey("conv", direction, d, "sm_90") for d in ("fp16", "bf16")}
        frames = [training.rows_of(pd.read_parquet(Path(args.table_dir) / f"conv_{direction}_{d}_sweep.parquet"), k)
                  for d, k in keys.items()]
        rows = pd.concat(frames).sort_values(["problem_id", "kernel"], kind="stable").reset_index(drop=True)
        data = training.featurize(rows, keys["fp16"])  # one feature spec over both dtypes' rows
        info = {pid: (json.loads(text)["types"]["dtype"], shape_of(text)) for pid, text in zip(rows.problem_id, rows.problem)}
        own = np.array([info[p][0] == "fp16" for p in data.problem_ids])
        fold = np.array([fold_of(info[p][1], FOLDS) for p in data.problem_ids])
        vendor = rows["kernel"].str.contains("_vendor_").to_numpy()
        print(f"{direction}: {len(set(data.problem_ids[own]))} fp16 problems, "
              f"{len(set(data.problem_ids[~own]))} bf16, {len(rows)} rows", flush=True)
        for pooled in (False, True):
            costs = np.full(len(fold), np.nan)
            for f in range(FOLDS):
                judged = own & (fold == f)
                if not judged.any():
                    continue
                trained = (fold != f) & (True if pooled else own)
                booster = lightgbm.train(dict(training.DEFAULT_PARAMS), training._dataset(data, trained),
                                         training.ROUNDS)
                costs[judged] = -booster.predict(data.matrix[judged])
            print(f"  {'fp16 and bf16' if pooled else 'fp16 alone':14s} {scores(data, costs, ~np.isnan(costs), vendor)}",
                  flush=True)


if __name__ == "__main__":
    main()
