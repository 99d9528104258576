"""Whether larger trees rank better now that the sweeps hold more problems: grouped 5-fold CV (the
figures `tiledispatch train` records) of the shipped slices at 15 leaves a tree (shipped) and 31,
two seeds each. A setting ships only where it gains beyond the seeds' spread on every slice.

    python benchmarks/studies/model_leaves.py
"""

from __future__ import annotations

import pandas as pd

from tiledispatch.bench.table import SelectionKey
from tiledispatch.heuristics import training

from model_rounds import by_seed  # benchmarks/studies/model_rounds.py, beside this one

TABLES = "benchmarks/results/h200/selection/"
SLICES = (("gemm_bf16_sweep", SelectionKey("gemm", "forward", "bf16", "sm_90")),
          ("conv_forward_bf16_sweep", SelectionKey("conv", "forward", "bf16", "sm_90")),
          ("conv_forward_fp16_sweep", SelectionKey("conv", "forward", "fp16", "sm_90")),
          ("conv_bwd_data_bf16_sweep", SelectionKey("conv", "bwd_data", "bf16", "sm_90")),
          ("conv_bwd_weight_bf16_sweep", SelectionKey("conv", "bwd_weight", "bf16", "sm_90")),
          ("attention_fwd_bf16_sweep", SelectionKey("attention", "fwd", "bf16", "sm_90")),
          ("attention_bwd_bf16_sweep", SelectionKey("attention", "bwd", "bf16", "sm_90")))
LEAVES = (15, 31)


def main() -> None:
    for table, key in SLICES:
        data = training.featurize(training.rows_of(pd.read_parquet(TABLES + table + ".parquet"), key), key)
        for leaves in LEAVES:
            print(f"{key.name}: {leaves} leaves: mean / P10 by seed {by_seed(data, {'num_leaves': leaves})}",
                  flush=True)


if __name__ == "__main__":
    main()
