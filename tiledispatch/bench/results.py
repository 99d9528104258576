"""The suite benchmarks' CSV tables as one long-format table per results folder (issue 41).

The sweep engine writes one row per (problem, kernel) timing with `table.COLUMNS`; the suite
runners (benchmarks/gemm.py, conv.py, attention.py, models.py) each write a CSV of their own
columns. This module turns the rows of each CSV format into rows of the sweep's columns, followed
by the columns a benchmark has and a sweep has not (`BENCHMARK_COLUMNS`), so one reader reads a
sweep table and `benchmarks/results/<gpu>/results.parquet` alike.

A field a CSV lacks (the GEMM and conv CSVs name no GPU, versions or date) is filled from an
`Environment` the caller passes: what the running process knows, or what a results folder's
README states (benchmarks/results_table.py). Nothing is inferred beyond that: a value neither
gives stays null.
"""

from __future__ import annotations

import csv
import datetime as _dt
import enum
import functools
import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .table import COLUMNS, Status, write_file

TABLE_NAME = "results.parquet"

# After the sweep's columns: which runner and file a row came from, the suite case, who ran it
# ("provider", as the CSV says), the models' mode, the sizes the CSV gives (JSON), the runner's note.
BENCHMARK_COLUMNS = ("benchmark", "source", "case", "provider", "mode", "shape", "note",
                     "ratio_vs_vendor", "rel_error")
TABLE_COLUMNS = COLUMNS + BENCHMARK_COLUMNS

# The columns that name one unit of a runner's work (a case in one dtype and direction, a model in
# one mode): a run replaces the table's rows of the units it ran, the others stay.
RUN_KEY = ("benchmark", "source", "case", "dtype", "direction", "mode")


class Benchmark(enum.Enum):
    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"
    MODELS = "models"


@dataclass(frozen=True)
class CsvFormat:
    """The columns one runner writes, and how they map onto the table's."""

    benchmark: Benchmark
    header: tuple[str, ...]  # exactly as the runner writes it, in order
    case: str  # the column naming the case
    time: str  # the column of milliseconds
    shape: tuple[str, ...]  # size columns, kept together as JSON in `shape`
    baseline: str  # the provider that `ratio_vs_vendor` divides by (its own row has none)
    op: str | None  # the op every row times (None: whole models)
    family_token: int | None  # where a kernel's name states its family (`gemm_bf16_rcr_tiled_...`)
    direction: str | None = None  # where the CSV has no direction column: the one the runner times


FORMATS = {f.benchmark: f for f in (
    CsvFormat(Benchmark.GEMM, ("case", "dtype", "m", "n", "k", "batch", "provider", "kernel", "ms", "tflops",
                               "ratio_vs_vendor", "rel_error"),
              "case", "ms", ("m", "n", "k", "batch"), "cublas", "gemm", 3, direction="forward"),
    CsvFormat(Benchmark.CONV, ("case", "direction", "dtype", "n", "c", "k", "g", "provider", "kernel", "ms",
                               "tflops", "tbps", "ratio_vs_vendor", "rel_error"),
              "case", "ms", ("n", "c", "k", "g"), "cudnn", "conv", 3),
    CsvFormat(Benchmark.ATTENTION, ("op", "case", "dtype", "direction", "provider", "time_ms", "tflops",
                                    "rel_error", "note", "gpu", "torch", "triton", "date"),
              "case", "time_ms", (), "sdpa-cudnn", "attention", 4),
    CsvFormat(Benchmark.MODELS, ("model", "batch", "mode", "provider", "time_ms", "rel_error", "status", "gpu",
                                 "torch", "triton", "date"),
              "model", "time_ms", ("batch",), "pytorch", None, None),
)}

# The committed CSVs each results folder's table is built from: every CSV there in one of the four
# formats (all written by the suite runners: the main runs, their reruns at other commits, and runs
# on other suite files or case lists; each folder's README says which). The A/B, sweep and study
# CSVs have columns of their own and stay out.
SUITE_CSVS = {gpu: tuple(f"{stem}.csv" for stem in stems.split()) for gpu, stems in {
    "h200": """gemm gemm_picks gemm_subset gemm_odd gemm_picks_recheck conv conv_depthwise_extra
               conv_depthwise_shapes conv_tma conv_toeplitz_weight conv_toeplitz_weight_shapes attention models
               models_compile_rules models_eager_direct models_graph_learned models_joint_backward
               models_train_lists models_fe03cfe_x2host""",
    "h100": """gemm_picks gemm_decode gemm_square512 conv conv_8x8_in_default conv_bwd_data_intake
               conv_depthwise_capped conv_depthwise_strided conv_depthwise_strided_5bf3c28
               conv_depthwise_strided_before conv_depthwise_strided_bwd_data conv_depthwise_strided_e3355c0
               conv_depthwise_widen conv_mamba_before_one_row conv_pointwise_1x1 conv_sampling_100x11
               conv_stem_space_to_depth_probe conv_tma_bwd_data conv_tma_rows conv_tma_turned_bwd_data
               conv_toeplitz_filter_stage_before conv_toeplitz_fit_extra conv_toeplitz_fit_main
               conv_toeplitz_fit_shapes conv_toeplitz_inkernel_filter conv_replicate_44d8ecb conv_replicate_48efbea
               conv_replicate_5435a99 conv_replicate_5987945 conv_replicate_89e2bea conv_replicate_a00603a
               conv_replicate_b13d5aa conv_replicate_b13d5aa_before_refit conv_replicate_b52355c
               conv_replicate_b631512 conv_replicate_b631512_2 conv_replicate_d6f1601 conv_replicate_ee79f75
               conv_replicate_f987d39 attention attention_d256 attention_softcap_before attention_softcap_d256""",
}.items()}

# The vendor's providers and the family their rows get (None: a whole model, no one family).
VENDOR_FAMILIES = {"cublas": "vendor", "cudnn": "vendor", "sdpa-cudnn": "sdpa-cudnn", "sdpa-flash": "sdpa-flash",
                   "pytorch": None}


class Outcome(enum.Enum):
    """How a row without a time ended, as its CSV tells it; the values it shares with the sweep's
    `Status` mean the same there."""

    OK = Status.OK.value
    WRONG = Status.WRONG.value  # checked, over the tolerance, so not timed
    UNSUPPORTED = Status.UNSUPPORTED.value  # the vendor call refused the problem (its reason in `error`)
    FAILED = "failed"  # raised when checked: a build or a launch, the CSV does not say which


@dataclass(frozen=True)
class Environment:
    """What a run's CSV may not say about the run. A row's own value always wins; a field left None
    here stays null in the rows that lack it."""

    gpu: str | None = None
    torch: str | None = None
    triton: str | None = None
    arch: str | None = None
    commit: str | None = None
    timestamp: str | None = None

    @classmethod
    def current(cls) -> "Environment":
        """This process's: what a runner passes right after it wrote its CSV (needs torch)."""
        import torch
        import triton

        from ..core.runtime import current_arch
        from .sweep import source_commit

        return cls(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                   torch=torch.__version__, triton=triton.__version__, arch=current_arch().name,
                   commit=source_commit(), timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


def format_of(header: Iterable[str]) -> CsvFormat:
    """The format whose header this is; a CSV of other columns is an error that names them."""
    header = tuple(header)
    for fmt in FORMATS.values():
        if fmt.header == header:
            return fmt
    raise ValueError(f"columns {','.join(header)} are none of the suite runners' "
                     f"({', '.join(b.value for b in FORMATS)})")


def _number(value: Any) -> float | None:
    """A CSV field as a float; empty and NaN are None (a value the run did not get)."""
    if value is None or value == "":
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


@functools.lru_cache(maxsize=None)
def _families(op: str) -> frozenset[str]:
    return frozenset(f.value for f in importlib.import_module(f"tiledispatch.ops.{op}").Family)


def family_of(fmt: CsvFormat, kernel: str | None) -> str | None:
    """The family a kernel's name states, if it is one of the op's families; else None."""
    tokens = (kernel or "").split("_")
    if fmt.op is None or fmt.family_token is None or len(tokens) <= fmt.family_token:
        return None
    return tokens[fmt.family_token] if tokens[fmt.family_token] in _families(fmt.op) else None


def _outcome(provider: str, kernel: str | None, ms: float | None, error: float | None) -> Outcome:
    """How a gemm, conv or attention row ended: its CSV has no status column."""
    if ms is not None:
        return Outcome.OK
    if kernel and kernel.startswith("unavailable:"):
        return Outcome.UNSUPPORTED
    if provider.endswith("-rejected") or error is not None:
        return Outcome.WRONG
    return Outcome.FAILED


def _is_vendor(provider: str, family: str | None) -> bool | None:
    """Whether the row timed the vendor's code: its provider, else its kernel's family; None for a
    pick the CSV does not name (attention's `tiledispatch`) and for a whole model of ours."""
    if provider in VENDOR_FAMILIES:
        return True
    if family is not None:
        return family == "vendor"
    return False if provider.startswith("triton") or provider == "copy" else None


def convert(rows: Iterable[Mapping[str, Any]], fmt: CsvFormat, source: str, env: Environment) -> list[dict]:
    """The rows of one CSV (as csv.DictReader gives them) as rows of `TABLE_COLUMNS`."""
    out = []
    for row in rows:
        provider, kernel = str(row["provider"]), _text(row.get("kernel"))
        if provider.startswith("triton:"):  # attention names its candidates in the provider
            provider, kernel = "triton-candidate", provider.split(":", 1)[1]
        ms, rel_error, error = _number(row[fmt.time]), _number(row.get("rel_error")), None
        if "kernel" in fmt.header and not kernel and ms is None and rel_error is None:
            continue  # no measurement: the oracle placeholder of a `--picks-only` run
        if fmt.benchmark is Benchmark.MODELS:  # "ok", "error: RuntimeError: ...", "skipped: time budget"
            status, _, error = str(row["status"]).partition(": ")
        else:
            outcome = _outcome(provider, kernel, ms, rel_error)
            status = outcome.value
            if outcome is Outcome.UNSUPPORTED:
                kernel, error = None, kernel.split(":", 1)[1].strip()
        family = VENDOR_FAMILIES[provider] if provider in VENDOR_FAMILIES else family_of(fmt, kernel)
        tbps = _number(row.get("tbps"))
        shape = {c: int(row[c]) if str(row[c]).lstrip("-").isdigit() else row[c] for c in fmt.shape}
        out.append({
            "op": fmt.op, "direction": _text(row.get("direction")) or fmt.direction, "dtype": _text(row.get("dtype")),
            "arch": env.arch, "kernel": kernel, "family": family, "vendor": _is_vendor(provider, family),
            "status": status, "error": error or None, "time_ms": ms, "tflops": _number(row.get("tflops")),
            "gbps": None if tbps is None else tbps * 1e3,
            "gpu": _text(row.get("gpu")) or env.gpu, "torch": _text(row.get("torch")) or env.torch,
            "triton": _text(row.get("triton")) or env.triton, "commit": env.commit,
            "timestamp": _text(row.get("date")) or env.timestamp,
            "benchmark": fmt.benchmark.value, "source": source, "case": str(row[fmt.case]), "provider": provider,
            "mode": _text(row.get("mode")), "shape": json.dumps(shape, sort_keys=True) if shape else None,
            "note": _text(row.get("note")), "ratio_vs_vendor": _number(row.get("ratio_vs_vendor")),
            "rel_error": rel_error,
        })
    if "ratio_vs_vendor" not in fmt.header:
        _add_ratios(out, fmt.baseline)
    return out


def _add_ratios(rows: list[dict], baseline: str) -> None:
    """vendor time / row time within each unit of work, as the gemm and conv runners write it (the
    runners of attention and models put theirs in their summaries only)."""
    unit = ("case", "dtype", "direction", "mode")
    vendor_ms = {tuple(r[c] for c in unit): r["time_ms"] for r in rows if r["provider"] == baseline}
    for r in rows:
        base = vendor_ms.get(tuple(r[c] for c in unit))
        if r["provider"] != baseline and base and r["time_ms"]:
            r["ratio_vs_vendor"] = base / r["time_ms"]


def read_csv(path: str | Path, env: Environment) -> list[dict]:
    """One runner's CSV as table rows, its file name the `source`."""
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return convert(reader, format_of(reader.fieldnames or ()), path.name, env)


def schema():
    """The sweep's parquet schema (`sweep.schema`) and the benchmark columns after it."""
    import pyarrow as pa

    from .sweep import schema as sweep_schema

    floats = {"ratio_vs_vendor", "rel_error"}
    return pa.schema(list(sweep_schema()) + [(c, pa.float64() if c in floats else pa.string())
                                             for c in BENCHMARK_COLUMNS])


def write_table(path: str | Path, rows: list[dict]) -> int:
    """`rows` as the parquet file at `path`, written under a temporary name and renamed; its row count."""
    import pyarrow as pa

    table = pa.Table.from_pylist([{c: row.get(c) for c in TABLE_COLUMNS} for row in rows], schema=schema())
    return write_file(table, path, compression="zstd")


def update(path: str | Path, rows: list[dict]) -> int:
    """Replaces the rows of the table at `path` (if any) whose `RUN_KEY` unit `rows` has, keeps the
    others, and appends `rows`; the table's row count."""
    import pyarrow.parquet as pq

    path, ran = Path(path), {tuple(r.get(c) for c in RUN_KEY) for r in rows}
    old = pq.read_table(path, schema=schema()).to_pylist() if path.exists() else []
    return write_table(path, [r for r in old if tuple(r[c] for c in RUN_KEY) not in ran] + list(rows))


def record_run(out: str | Path, csv_name: str, env: Environment | None = None) -> int:
    """What a suite runner calls after writing `out/csv_name`: that CSV's rows into
    `out/results.parquet` (`update`), with this process's environment unless one is given."""
    out = Path(out)
    rows = read_csv(out / csv_name, env if env is not None else Environment.current())
    count = update(out / TABLE_NAME, rows)
    print(f"{out / TABLE_NAME}: {len(rows)} rows of {csv_name}, {count} in all")
    return count
