"""The suite CSVs as one long-format table (tiledispatch/bench/results.py, benchmarks/results_table.py):
each runner's format converts with its values kept, the sweep's columns come first so the sweep's
reader reads the table, one benchmark's rows are replaced and the rest kept, a field no one
states stays null, and the committed H200 CSVs convert with the times they hold."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tiledispatch.bench import sweep
from tiledispatch.bench.results import (
    BENCHMARK_COLUMNS,
    FORMATS,
    SUITE_CSVS,
    TABLE_COLUMNS,
    TABLE_NAME,
    Benchmark,
    Environment,
    format_of,
    read_csv,
    record_run,
    update,
    write_table,
)
from tiledispatch.bench.table import COLUMNS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:  # benchmarks/ is no package: importable from the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import gemm as gemm_runner  # noqa: E402
from benchmarks import models as models_runner  # noqa: E402
from benchmarks import results_table  # noqa: E402

ENV = Environment(gpu="NVIDIA H200", torch="2.11.0+cu130", triton="3.6.0", arch="sm_90")
GEMM_KERNEL = "gemm_bf16_rcr_tma-persistent_64x64x128_w4_s5_g8_k1_e1_none_sm90"
CONV_KERNEL = "conv_fwd_bf16_igemm-tma_8x8x128x64_w4_s4_k1_none_sm90"
ATTENTION_KERNEL = "attention_fwd_bf16_d128x128_fwd-tma_64x64_w4_s3_sm90"

GEMM_ROWS = [  # as benchmarks/gemm.py writes them (a --picks-only run's oracle row among them)
    ["square_512", "bf16", 512, 512, 512, 1, "triton-candidate", GEMM_KERNEL, "0.00346", "77.61", "1.0414", "1.66e-03"],
    ["square_512", "bf16", 512, 512, 512, 1, "triton-rejected", GEMM_KERNEL.replace("64x64", "32x32"), "", "",
     "", "4.10e-01"],
    ["square_512", "bf16", 512, 512, 512, 1, "cublas", "torch.matmul", "0.0036", "74.57", "", "1.65e-03"],
    ["square_512", "bf16", 512, 512, 512, 1, "triton-oracle", "", "", "", "", ""],
    ["square_512", "bf16", 512, 512, 512, 1, "dispatcher", "gemm_bf16_sss_vendor_none_sm90", "0.00351", "76.4",
     "1.0256", ""],
    ["odd_1000", "fp8e4m3", 1000, 1000, 1000, 1, "cublas",
     "unavailable: Expected trailing dimension of mat1 to be divisible by 16", "", "", "", ""],
]
CONV_ROWS = [
    ["resnet50_3x3", "forward", "bf16", 32, 256, 256, 1, "triton-candidate", CONV_KERNEL, "0.01647", "449.128",
     "0.4615", "1.0887", "1.66e-03"],
    ["resnet50_3x3", "forward", "bf16", 32, 256, 256, 1, "triton-failed", CONV_KERNEL.replace("8x8", "8x16"), "", "",
     "", "", ""],
    ["resnet50_3x3", "forward", "bf16", 32, 256, 256, 1, "cudnn", "torch F.conv", "0.01793", "412.5", "0.4239", "",
     "1.70e-03"],
    ["depthwise_3x3", "bwd_data", "bf16", 32, 96, 96, 96, "copy", "kernel copy of the same bytes (bench/copy.py)",
     "0.0125", "", "2.95", "1.21", ""],
]
DATE = "2026-11-21T06:43:40+00:00"
ATTENTION_ROWS = [
    ["attention", "mha_S1024_D128", "bf16", "fwd", "tiledispatch", "0.2", "600.8", "0.0022", "", "NVIDIA H200",
     "2.11.0+cu130", "3.6.0", DATE],
    ["attention", "mha_S1024_D128", "bf16", "fwd", f"triton:{ATTENTION_KERNEL}", "0.3", "441.0", "0.0022", "",
     "NVIDIA H200", "2.11.0+cu130", "3.6.0", DATE],
    ["attention", "mha_S1024_D128", "bf16", "fwd", "sdpa-cudnn", "0.25", "540.0", "0.0021", "K/V expanded",
     "NVIDIA H200", "2.11.0+cu130", "3.6.0", DATE],
    ["attention", "mha_S1024_D128", "bf16", "fwd", "sdpa-flash", "nan", "nan", "nan", "", "NVIDIA H200",
     "2.11.0+cu130", "3.6.0", DATE],
]
MODELS_ROWS = [
    ["resnet50", 32, "graph", "pytorch", "20.0", "0.0064", "ok", "NVIDIA H200", "2.11.0+cu130", "3.6.0", DATE],
    ["resnet50", 32, "graph", "tiledispatch", "16.0", "0.0065", "ok", "NVIDIA H200", "2.11.0+cu130", "3.6.0", DATE],
    ["resnet50", 32, "train", "tiledispatch", "", "", "error: RuntimeError: conv is broken", "NVIDIA H200",
     "2.11.0+cu130", "3.6.0", DATE],
    ["llama_decode", 4, "compile", "pytorch", "", "", "skipped: time budget (--budget-s)", "NVIDIA H200",
     "2.11.0+cu130", "3.6.0", DATE],
]
LITERAL = {Benchmark.GEMM: GEMM_ROWS, Benchmark.CONV: CONV_ROWS, Benchmark.ATTENTION: ATTENTION_ROWS,
           Benchmark.MODELS: MODELS_ROWS}


def write_csv(path: Path, benchmark: Benchmark, rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FORMATS[benchmark].header)
        writer.writerows(rows)
    return path


def by(rows: list[dict], **match) -> dict:
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def converted(folder: Path, benchmark: Benchmark) -> list[dict]:
    """The literal rows of `benchmark`, written as its runner would, read back as table rows."""
    return read_csv(write_csv(folder / f"{benchmark.value}.csv", benchmark, LITERAL[benchmark]), ENV)


def csv_times(path: Path) -> list[float]:
    """The timed rows' milliseconds, in the CSV's order."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    column = "ms" if "ms" in rows[0] else "time_ms"
    return [float(r[column]) for r in rows if r[column] not in ("", "nan")]


def test_the_table_starts_with_the_sweeps_columns_in_order(tmp_path):
    assert TABLE_COLUMNS[:len(COLUMNS)] == COLUMNS
    assert TABLE_COLUMNS[len(COLUMNS):] == BENCHMARK_COLUMNS
    assert {"benchmark", "case", "provider", "mode", "ratio_vs_vendor", "rel_error"} <= set(BENCHMARK_COLUMNS)
    path = tmp_path / TABLE_NAME
    write_table(path, read_csv(write_csv(tmp_path / "gemm.csv", Benchmark.GEMM, GEMM_ROWS), ENV))
    schema = pq.read_schema(path)
    assert tuple(schema.names) == TABLE_COLUMNS
    for field in sweep.schema():  # the sweep's types too, so one reader reads both
        assert schema.field(field.name).type == field.type, field.name


def test_gemm_rows_convert(tmp_path):
    rows = converted(tmp_path, Benchmark.GEMM)
    assert len(rows) == 5  # the --picks-only oracle row holds no measurement: left out
    timed = by(rows, provider="triton-candidate")
    assert (timed["op"], timed["direction"], timed["dtype"], timed["arch"]) == ("gemm", "forward", "bf16", "sm_90")
    assert (timed["kernel"], timed["family"], timed["vendor"], timed["status"]) == (
        GEMM_KERNEL, "tma-persistent", False, "ok")
    assert (timed["time_ms"], timed["tflops"], timed["ratio_vs_vendor"], timed["rel_error"]) == (
        0.00346, 77.61, 1.0414, 1.66e-3)
    assert json.loads(timed["shape"]) == {"m": 512, "n": 512, "k": 512, "batch": 1}
    assert (timed["benchmark"], timed["source"], timed["case"], timed["gpu"]) == (
        "gemm", "gemm.csv", "square_512", "NVIDIA H200")
    rejected = by(rows, provider="triton-rejected")
    assert (rejected["status"], rejected["time_ms"], rejected["rel_error"]) == ("wrong", None, 0.41)
    cublas = by(rows, provider="cublas", case="square_512")
    assert (cublas["family"], cublas["vendor"], cublas["time_ms"], cublas["ratio_vs_vendor"]) == (
        "vendor", True, 0.0036, None)
    dispatcher = by(rows, provider="dispatcher")
    assert (dispatcher["family"], dispatcher["vendor"], dispatcher["ratio_vs_vendor"]) == ("vendor", True, 1.0256)
    refused = by(rows, case="odd_1000")
    assert (refused["status"], refused["kernel"], refused["dtype"]) == ("unsupported", None, "fp8e4m3")
    assert refused["error"] == "Expected trailing dimension of mat1 to be divisible by 16"


def test_conv_rows_convert(tmp_path):
    rows = converted(tmp_path, Benchmark.CONV)
    timed = by(rows, provider="triton-candidate")
    assert (timed["op"], timed["direction"], timed["family"], timed["time_ms"], timed["ratio_vs_vendor"]) == (
        "conv", "forward", "igemm-tma", 0.01647, 1.0887)
    assert timed["gbps"] == pytest.approx(461.5)  # the CSV's TB/s in the sweep's GB/s
    assert json.loads(timed["shape"]) == {"n": 32, "c": 256, "k": 256, "g": 1}
    failed = by(rows, provider="triton-failed")
    assert (failed["status"], failed["time_ms"], failed["family"], failed["vendor"]) == (
        "failed", None, "igemm-tma", False)
    cudnn = by(rows, provider="cudnn")
    assert (cudnn["family"], cudnn["vendor"], cudnn["time_ms"], cudnn["rel_error"]) == ("vendor", True, 0.01793, 1.7e-3)
    copy = by(rows, provider="copy")
    assert (copy["direction"], copy["family"], copy["vendor"], copy["ratio_vs_vendor"]) == (
        "bwd_data", None, False, 1.21)


def test_attention_rows_convert_and_get_their_ratio_to_cudnn(tmp_path):
    rows = converted(tmp_path, Benchmark.ATTENTION)
    candidate = by(rows, provider="triton-candidate")  # the CSV's "triton:<kernel>", split
    assert (candidate["kernel"], candidate["family"], candidate["vendor"]) == (ATTENTION_KERNEL, "fwd-tma", False)
    assert candidate["ratio_vs_vendor"] == pytest.approx(0.25 / 0.3)
    ours = by(rows, provider="tiledispatch")
    assert (ours["kernel"], ours["vendor"], ours["ratio_vs_vendor"]) == (None, None, pytest.approx(1.25))
    assert (ours["timestamp"], ours["direction"], ours["op"]) == (DATE, "fwd", "attention")
    cudnn = by(rows, provider="sdpa-cudnn")
    assert (cudnn["family"], cudnn["vendor"], cudnn["note"], cudnn["ratio_vs_vendor"]) == (
        "sdpa-cudnn", True, "K/V expanded", None)
    flash = by(rows, provider="sdpa-flash")  # raised when checked: no time, no error, no ratio
    assert (flash["status"], flash["time_ms"], flash["tflops"], flash["rel_error"], flash["ratio_vs_vendor"]) == (
        "failed", None, None, None, None)


def test_models_rows_convert_with_their_own_status(tmp_path):
    rows = converted(tmp_path, Benchmark.MODELS)
    ours = by(rows, provider="tiledispatch", mode="graph")
    assert (ours["case"], ours["op"], ours["dtype"], ours["status"], ours["time_ms"]) == (
        "resnet50", None, None, "ok", 16.0)
    assert ours["ratio_vs_vendor"] == pytest.approx(20.0 / 16.0)
    assert json.loads(ours["shape"]) == {"batch": 32}
    assert by(rows, provider="pytorch", mode="graph")["vendor"] is True
    broken = by(rows, mode="train")
    assert (broken["status"], broken["error"], broken["time_ms"]) == ("error", "RuntimeError: conv is broken", None)
    skipped = by(rows, mode="compile")
    assert (skipped["status"], skipped["error"]) == ("skipped", "time budget (--budget-s)")


def test_a_field_no_one_states_stays_null_and_a_rows_own_value_wins(tmp_path):
    path = tmp_path / TABLE_NAME
    gemm = read_csv(write_csv(tmp_path / "gemm.csv", Benchmark.GEMM, GEMM_ROWS), Environment())
    attention = read_csv(write_csv(tmp_path / "attention.csv", Benchmark.ATTENTION, ATTENTION_ROWS),
                         Environment(gpu="another card", commit="abc1234"))
    write_table(path, gemm + attention)
    table = pd.read_parquet(path)
    gemm_rows = table[table.benchmark == "gemm"]
    for column in ("gpu", "torch", "triton", "arch", "commit", "timestamp", "problem", "host", "mode"):
        assert gemm_rows[column].isna().all(), column
    attention_rows = table[table.benchmark == "attention"]
    assert set(attention_rows.gpu) == {"NVIDIA H200"}  # the CSV's, not the environment's
    assert set(attention_rows.commit) == {"abc1234"}  # the CSV has none: the environment's
    assert attention_rows.arch.isna().all()


def test_one_benchmarks_rows_are_replaced_and_the_others_kept(tmp_path):
    path = tmp_path / TABLE_NAME
    write_table(path, read_csv(write_csv(tmp_path / "gemm.csv", Benchmark.GEMM, GEMM_ROWS), ENV)
                + read_csv(write_csv(tmp_path / "models.csv", Benchmark.MODELS, MODELS_ROWS), ENV))
    rerun = [row[:8] + ["0.002", "88.0", "1.8", "1.6e-03"] for row in GEMM_ROWS[:1]]  # square_512 bf16 again
    count = update(path, read_csv(write_csv(tmp_path / "gemm.csv", Benchmark.GEMM, rerun), ENV))
    table = pd.read_parquet(path)
    assert count == len(table) == 1 + 1 + len(MODELS_ROWS)  # the rerun, odd_1000 fp8 and the models' rows
    square = table[table.case == "square_512"]
    assert square.provider.tolist() == ["triton-candidate"] and square.time_ms.tolist() == [0.002]
    assert table[table.case == "odd_1000"].status.tolist() == ["unsupported"]  # a unit the rerun did not run
    graph = table[(table.benchmark == "models") & (table["mode"] == "graph")]
    assert graph.provider.tolist() == ["pytorch", "tiledispatch"] and graph.time_ms.tolist() == [20.0, 16.0]
    # The same case from another file of the same runner is a different unit: kept.
    update(path, read_csv(write_csv(tmp_path / "gemm_picks.csv", Benchmark.GEMM, GEMM_ROWS[2:3]), ENV))
    table = pd.read_parquet(path)
    assert sorted(table[table.case == "square_512"].source) == ["gemm.csv", "gemm_picks.csv"]


def test_the_sweeps_reader_and_pandas_give_back_the_csvs_times(tmp_path):
    path = write_csv(tmp_path / "conv.csv", Benchmark.CONV, CONV_ROWS)
    write_table(tmp_path / TABLE_NAME, read_csv(path, ENV))
    table = pd.read_parquet(tmp_path / TABLE_NAME)
    assert table.time_ms.dropna().tolist() == csv_times(path) == [0.01647, 0.01793, 0.0125]
    parts = tmp_path / "parts"  # the sweep reads a directory of parts: the table as one
    parts.mkdir()
    shutil.copy(tmp_path / TABLE_NAME, parts / "part-results.parquet")
    swept = sweep.read_table(parts)
    assert tuple(swept.columns) == COLUMNS
    assert swept.time_ms.dropna().tolist() == csv_times(path)
    assert swept.kernel.tolist()[:2] == [CONV_KERNEL, CONV_KERNEL.replace("8x8", "8x16")]


def test_a_csv_of_other_columns_is_refused():
    with pytest.raises(ValueError, match="none of the suite runners'"):
        format_of(["case", "kernel", "us", "vendor_us"])


@pytest.mark.parametrize("name", SUITE_CSVS["h200"])
def test_each_committed_h200_csv_converts_with_its_times(name):
    path = RESULTS / "h200" / name
    rows = read_csv(path, ENV)
    assert rows and {r["source"] for r in rows} == {name}
    assert [r["time_ms"] for r in rows if r["time_ms"] is not None] == csv_times(path)
    assert all(r["status"] in ("ok", "wrong", "failed", "unsupported", "skipped", "error") for r in rows)
    assert all(r["gpu"] for r in rows) and all(r["case"] for r in rows)
    kernels = [r for r in rows if r["provider"].startswith("triton-") and r["kernel"]]
    assert all(r["family"] for r in kernels)  # every Triton kernel's name states its family


@pytest.mark.parametrize("gpu", sorted(SUITE_CSVS))
def test_every_suite_csv_of_a_folder_is_listed(gpu):
    assert results_table.unlisted(RESULTS / gpu, SUITE_CSVS[gpu]) == []
    assert all((RESULTS / gpu / name).exists() for name in SUITE_CSVS[gpu])


def test_the_readmes_state_card_and_versions():
    h200 = results_table.readme_environment(RESULTS / "h200" / "README.md")
    h100 = results_table.readme_environment(RESULTS / "h100" / "README.md")
    assert (h200.gpu, h200.torch, h200.triton) == ("NVIDIA H200", "2.11.0+cu130", "3.6.0")
    assert (h100.gpu, h100.torch, h100.triton) == ("NVIDIA H100 80GB HBM3", "2.11.0+cu130", "3.6.0")
    assert h200.commit is None and h200.timestamp is None and h200.arch is None


def test_the_script_rebuilds_a_folder(tmp_path, capsys):
    folder = tmp_path / "h200"
    folder.mkdir()
    for name in ("README.md", *SUITE_CSVS["h200"]):
        shutil.copy(RESULTS / "h200" / name, folder / name)
    assert results_table.main(["h200", "--root", str(tmp_path)]) == 0
    table = pd.read_parquet(folder / TABLE_NAME)
    counts = table.benchmark.value_counts().to_dict()
    out = capsys.readouterr().out
    for benchmark, n in counts.items():
        assert f"{benchmark:<10} {n}" in out
    assert set(counts) == {"gemm", "conv", "attention", "models"}
    assert set(table.arch) == {"sm_90"} and set(table.gpu) == {"NVIDIA H200"}
    assert table.commit.isna().all()
    gemm = table[table.source == "gemm.csv"]
    assert gemm.time_ms.dropna().tolist() == csv_times(RESULTS / "h200" / "gemm.csv")
    assert (folder / TABLE_NAME).stat().st_size < 2e6


def test_the_gemm_runners_merge_updates_the_table(tmp_path, monkeypatch):
    """benchmarks/gemm.py's --merge (no GPU): the merged CSV's rows into results.parquet, the GPU and
    versions from the shards' summary, nothing from this machine."""
    selected = [GEMM_ROWS[0][:6] + ["triton-selected", GEMM_KERNEL, "0.00346", "77.61", "1.0414", ""]]
    shard = write_csv(tmp_path / "shard.csv", Benchmark.GEMM, GEMM_ROWS[:5] + selected)
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "host_us_dispatch": 9.0}))
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["gemm.py", "--merge", str(shard), "--out", str(out), "--host-json", str(host)])
    assert gemm_runner.main() == 0
    table = pd.read_parquet(out / TABLE_NAME)
    assert len(table) == 5  # the oracle placeholder left out
    assert set(table.gpu) == {"NVIDIA H100 80GB HBM3"}
    assert table.triton.isna().all() and table.commit.isna().all()  # the summary gave no Triton
    assert table.time_ms.dropna().tolist() == csv_times(out / "gemm.csv")


def test_the_gemm_runners_merge_takes_a_case_with_no_pick(tmp_path, monkeypatch):
    """--merge of shards where a case has no `triton-selected` row (its rows all failed, or cuBLAS alone
    was timed): the summary leaves that case out of the ratios instead of failing on it."""
    shard = write_csv(tmp_path / "shard.csv", Benchmark.GEMM, GEMM_ROWS[:5])  # no triton-selected row
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["gemm.py", "--merge", str(shard), "--out", str(out)])
    assert gemm_runner.main() == 0
    summary = json.loads((out / "gemm_summary.json").read_text())
    assert summary["cases"] == 1 and summary["geomean_ratio_triton_selected"] is None


def test_the_models_runner_updates_the_table(tmp_path):
    """benchmarks/models.py --smoke on the CPU: models.csv and results.parquet agree; a rerun of one
    mode replaces that mode's rows."""
    models_runner.main(["--smoke", "--out", str(tmp_path), "--models", "tiny_cnn", "--modes", "eager"])
    first = pd.read_parquet(tmp_path / TABLE_NAME)
    assert sorted(first.provider) == ["pytorch", "tiledispatch"] and set(first["mode"]) == {"eager"}
    assert first.time_ms.tolist() == csv_times(tmp_path / "models.csv")
    here = Environment.current()  # this process's arch and commit (None outside a git checkout)
    assert set(first.arch) == {here.arch} and first.commit.tolist() == [here.commit] * 2
    record_run(tmp_path, "models.csv", ENV)  # the same rows again: replaced, not added
    again = pd.read_parquet(tmp_path / TABLE_NAME)
    assert len(again) == 2 and set(again.arch) == {"sm_90"}
    assert not math.isnan(again.ratio_vs_vendor.dropna().iloc[0])
