"""How many trees a selection model needs: grouped 5-fold CV (the `selection` figures that
`tiledispatch train` records) of the shipped slices' sweeps at fewer trees and a larger learning
rate, two seeds each. A model's prediction cost grows with its trees (a first sight predicts a
shortlist of some 17 rows), so the fewest trees that keep the figures within the seeds' spread
are the ones to ship.

    python benchmarks/studies/model_rounds.py
"""

from __future__ import annotations

import pandas as pd

from tiledispatch.bench.table import SelectionKey
from tiledispatch.heuristics import training

TABLES = "benchmarks/results/h200/selection/"
SLICES = (("gemm_bf16_sweep", SelectionKey("gemm", "forward", "bf16", "sm_90")),
          ("conv_forward_bf16_sweep", SelectionKey("conv", "forward", "bf16", "sm_90")),
          ("attention_fwd_bf16_sweep", SelectionKey("attention", "fwd", "bf16", "sm_90")))
SETTINGS = ((300, 0.05), (150, 0.1), (100, 0.15), (60, 0.25))  # (trees, learning rate)


def by_seed(data, params: dict) -> str:
    """`train`'s grouped 5-fold CV of `data` under DEFAULT_PARAMS and `params`, seeds 0 and 1: 'mean / P10' each."""
    figures = []
    for seed in (0, 1):
        cv = training.cross_validate(data, 5, {**training.DEFAULT_PARAMS, **params, "seed": seed})["selection"]
        figures.append(f"{cv['mean']:.3f} / {cv['p10']:.3f}")
    return ", ".join(figures)


def main() -> None:
    shipped = training.ROUNDS
    try:
        for table, key in SLICES:
            data = training.featurize(training.rows_of(pd.read_parquet(TABLES + table + ".parquet"), key), key)
            for rounds, rate in SETTINGS:
                training.ROUNDS = rounds
                print(f"{key.name}: {rounds} trees at {rate}: mean / P10 by seed "
                      f"{by_seed(data, {'learning_rate': rate})}", flush=True)
    finally:
        training.ROUNDS = shipped


if __name__ == "__main__":
    main()
