"""benchmarks/models.py's smoke path, in-process: tiny stand-ins of each workload through
tiledispatch's ops and through PyTorch, every row checked against the float64 (GPU: fp32)
reference; a failing mode is a row, not a crash; the summary's targets follow the rows.
And benchmarks/startup.py's children: their sources compile, and the import child reports."""

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is no package: importable from the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import models, startup  # noqa: E402
import tiledispatch.nn as tdnn  # noqa: E402

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def rows_of(out: Path) -> list[dict]:
    with (out / "models.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed (the Llama stand-in needs it; "
                    "pip install transformers)")
def test_smoke_run_checks_every_workload(tmp_path):
    summary = models.main(["--smoke", "--out", str(tmp_path), "--modes", "eager,train"])
    rows = rows_of(tmp_path)
    expected = {(m, mode) for m in models.SMOKE_NAMES for mode in ("eager", "train")} - {("tiny_llama_decode", "train")}
    assert {(r["model"], r["mode"]) for r in rows} == expected
    tolerance = 5e-2 if models.torch.cuda.is_available() else 1e-4  # bf16 on a GPU, fp32 against float64 on the CPU
    for row in rows:
        where = f"{row['model']} {row['mode']} {row['provider']}"
        assert row["status"] == "ok", where + ": " + row["status"]
        assert float(row["time_ms"]) > 0, where
        assert 0 <= float(row["rel_error"]) <= tolerance, where + f": rel error {row['rel_error']}"
        assert row["torch"] and row["triton"] and row["date"] and row["gpu"]
    for name, firsts in summary["first_call_s"].items():  # warmup ran: a duration, not an error's text
        assert isinstance(firsts.get("tiledispatch warmup"), float), f"{name}: {firsts}"
    entry = summary["models"]["tiny_cnn"]["train"]
    # the ratio is written to 4 decimals
    assert entry["ratio"] == pytest.approx(entry["pytorch_ms"] / entry["tiledispatch_ms"], rel=1e-3, abs=1e-4)
    assert set(summary["targets"]) >= {"eager_and_train_each_at_least_1.0x", "cuda_graph_each_at_least_1.0x",
                                       "cuda_graph_geomean_at_least_1.1x",
                                       "compile_each_at_least_1.0x_of_torch_compile"}


def test_a_failing_mode_is_a_row_and_the_run_goes_on(tmp_path, monkeypatch):
    def broken(self, x):
        raise RuntimeError("conv is broken\nsecond line")

    monkeypatch.setattr(tdnn.Conv2d, "forward", broken)
    models.main(["--smoke", "--out", str(tmp_path), "--models", "tiny_cnn", "--modes", "eager,graph"])
    by_key = {(r["mode"], r["provider"]): r for r in rows_of(tmp_path)}
    assert by_key["eager", "tiledispatch"]["status"] == "error: RuntimeError: conv is broken"
    assert by_key["eager", "pytorch"]["status"] == "ok" and float(by_key["eager", "pytorch"]["time_ms"]) > 0
    assert ("graph", "pytorch") in by_key  # the next mode ran (or was recorded as skipped on the CPU)


def test_rows_of_another_run_are_kept_and_targets_follow_them(tmp_path):
    def row(model, mode, provider, ms, err=1e-3):
        return {"model": model, "batch": 1, "mode": mode, "provider": provider, "time_ms": ms, "rel_error": err,
                "status": "ok"}

    earlier = [row("a", "graph", "pytorch", 2.0), row("a", "graph", "tiledispatch", 1.0),
               row("b", "graph", "pytorch", 1.0), row("b", "graph", "tiledispatch", 1.1, err=5e-3)]
    with (tmp_path / "models.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=models.FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(earlier)
    merged = models.merged_rows(tmp_path / "models.csv", [row("a", "eager", "pytorch", 1.0),
                                                         row("a", "eager", "tiledispatch", 0.5)], fresh=False)
    assert len(merged) == 6
    summary = models.summarize(merged)
    graph = summary["targets"]["cuda_graph_each_at_least_1.0x"]
    assert graph["below"] == ["b graph"] and not graph["pass"]
    geomean = summary["targets"]["cuda_graph_geomean_at_least_1.1x"]
    assert geomean["geomean"] == pytest.approx((2.0 / 1.1) ** 0.5, rel=1e-3)
    assert geomean["pass"]  # 1.35x: met, though one model is below 1.0x (the target above says so)
    assert summary["targets"]["eager_and_train_each_at_least_1.0x"]["pass"]
    assert summary["models"]["b"]["graph"]["error_within_2x_of_pytorch"] is False
    assert summary["models"]["a"]["graph"]["error_within_2x_of_pytorch"] is True
    assert models.merged_rows(tmp_path / "models.csv", [], fresh=True) == []


def test_startup_children_compile_and_report():
    for case in (*startup.GPU_CASES, *startup.SMOKE_CASES):
        for smoke in (False, True):
            compile(startup.op_source(case, smoke, 3), f"<{case.name} child>", "exec")
    args = type("Args", (), {"cache_dir": None})()
    imports = startup.measure_imports(startup.child_env(args, smoke=True), repeats=1)
    assert imports["import_torch_s"] > 0 and imports["import_tiledispatch_s"] > 0
    assert imports["pass"] == (imports["import_tiledispatch_s"] <= startup.IMPORT_TARGET_S)
