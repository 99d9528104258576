"""Would a model rank better trained on a sibling dtype's sweep as well as its own?

fp16 and bf16 run the same kernels at the same tensor-core rate and move the same bytes, so one
dtype's sweep may teach the other's model. For each slice with both sweeps (conv's three
directions, GEMM), this trains LightGBM rankers as `tiledispatch train` does (`heuristics.training`:
the same features, grades and parameters) and scores the picks on the target dtype's problems a
fold's model never saw (efficiency against the oracle: mean, P10, min; the pick against the
vendor): by a model of the target's rows alone, and by one of both dtypes' rows, the dtype a
feature. Folds are drawn by the layer (`training.shape_of`: the problem without its types), so a
held-out problem's twin in the other dtype trains no model that judges it. Runs on the CPU; needs
LightGBM and pandas.

    python benchmarks/studies/pooled_dtypes.py [--target fp16] [--table-dir benchmarks/results/h200/selection]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from tiledispatch.bench.problemsets import fold_of
from tiledispatch.bench.table import SelectionKey
from tiledispatch.cli.train import read_complete
from tiledispatch.heuristics import training

from conv_pooled_directions import FOLDS, held_out_costs, scores  # a study beside this one (on the path)

DTYPES = ("fp16", "bf16")
SLICES = (("conv", "forward"), ("conv", "bwd_data"), ("conv", "bwd_weight"), ("gemm", "forward"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table-dir", default="benchmarks/results/h200/selection")
    parser.add_argument("--target", default="fp16", choices=DTYPES, help="the dtype whose problems are judged")
    args = parser.parse_args()
    other = next(d for d in DTYPES if d != args.target)
    for op, direction in SLICES:
        paths = {d: Path(args.table_dir) / f"{op}_{'' if op == 'gemm' else direction + '_'}{d}_sweep.parquet"
                 for d in (args.target, other)}
        if not all(p.exists() for p in paths.values()):
            continue
        keys = {d: SelectionKey(op, direction, d, "sm_90") for d in paths}
        frames = [training.rows_of(read_complete(paths[d])[0], k) for d, k in keys.items()]
        own_ids = set(frames[0]["problem_id"])
        rows = pd.concat(frames).sort_values(["problem_id", "kernel"], kind="stable").reset_index(drop=True)
        data = training.featurize(rows, keys[args.target])  # one feature spec over both dtypes' rows
        layer = dict(zip(rows.problem_id, map(training.shape_of, rows.problem)))
        own = np.array([p in own_ids for p in data.problem_ids])
        fold = np.array([fold_of(layer[p], FOLDS) for p in data.problem_ids])
        vendor = rows["kernel"].str.contains("_vendor_").to_numpy()
        print(f"{op} {direction}: {len(set(data.problem_ids[own]))} {args.target} problems, "
              f"{len(set(data.problem_ids[~own]))} {other}, {len(rows)} rows", flush=True)
        for pooled in (False, True):
            costs = held_out_costs(data, fold, own, pooled)
            label = f"with {other}" if pooled else f"{args.target} alone"
            print(f"  {label:14s} {scores(data, costs, ~np.isnan(costs), vendor, 'vendor')}", flush=True)


if __name__ == "__main__":
    main()
