"""NVIDIA's nvMatmulHeuristics as a picker (heuristics/nvmmh.py): the mapping of our GEMM problems and
configs to its own, tested without the package through a fake estimator; the picker's skip where the
package is missing; and one check against the real library where it is installed."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tiledispatch.heuristics import evaluate as ev
from tiledispatch.heuristics import nvmmh
from tiledispatch.heuristics.nvmmh import MatmulLayout, NvKernel
from tiledispatch.ops.gemm import GemmLayout, GemmProblem, GemmTypes
from tiledispatch.ops.gemm.config import Family, GemmConfig, VendorConfig
from tiledispatch.ops.gemm.problem import Epilogue

SWEEP = Path(__file__).resolve().parents[2] / "benchmarks/results/h200/selection/gemm_bf16_sweep.parquet"
BF16 = GemmTypes.parse("bf16")
RCR = GemmLayout.parse("rcr")


def config(family=Family.TILED, block=(128, 128, 64), warps=4, **options) -> GemmConfig:
    return GemmConfig(family, BF16, RCR, Epilogue(), *block, num_warps=warps, **options)


def problem(m=4096, n=4096, k=4096, layout="rcr", dtype="bf16") -> GemmProblem:
    return GemmProblem(m=m, n=n, k=k, types=GemmTypes.parse(dtype), layout=GemmLayout.parse(layout))


@pytest.fixture
def no_package(monkeypatch):
    """nvMMH as if not installed: its import fails, and no estimator built before is reused."""
    monkeypatch.setitem(sys.modules, "nvMatmulHeuristics", None)
    nvmmh.library.cache_clear()
    yield
    nvmmh.library.cache_clear()


@pytest.mark.parametrize("letters, expected", [
    ("rrr", MatmulLayout.NN_ROW), ("rcr", MatmulLayout.NT_ROW), ("crr", MatmulLayout.TN_ROW),
    ("ccr", MatmulLayout.TT_ROW), ("ccc", MatmulLayout.NN_COL), ("rrc", MatmulLayout.TT_COL),
    ("rcc", MatmulLayout.TN_COL), ("src", None), ("rrs", None)])
def test_layouts_name_the_operand_stored_transposed(letters, expected):
    # C row-major: a column-major operand is the transposed one (rcr, F.linear's B stored N x K, is NT);
    # C column-major: BLAS's convention, a row-major operand is the transposed one.
    assert nvmmh.layout_of(GemmLayout.parse(letters)) is expected


def test_precision_is_16_bit_operands_accumulated_in_fp32():
    assert nvmmh.precision_of(GemmTypes.parse("bf16")) == "TST"
    assert nvmmh.precision_of(GemmTypes.parse("fp16")) == "HSH"
    assert nvmmh.precision_of(replace(GemmTypes.parse("fp16"), c=GemmTypes.parse("fp32").c)) == "HSS"
    assert nvmmh.precision_of(GemmTypes.parse("fp8e4m3")) is None
    assert nvmmh.precision_of(GemmTypes.parse("tf32")) is None
    assert nvmmh.problem_of(problem(12, 34, 56, "crr")) == nvmmh.NvProblem(12, 34, 56, 1, MatmulLayout.TN_ROW, "TST")
    assert nvmmh.problem_of(problem(dtype="fp8e4m3")) is None


@pytest.mark.parametrize("block_m, block_n, warps, expected", [
    (128, 128, 4, (32, 128)), (128, 128, 8, (16, 128)), (64, 64, 8, (16, 32)), (256, 128, 8, (32, 128)),
    (16, 32, 4, (16, 8)), (16, 32, 2, (16, 16)), (16, 16, 4, None), (128, 128, 3, None)])
def test_warp_tile_splits_along_m_first_and_keeps_one_mma(block_m, block_n, warps, expected):
    tile = nvmmh.warp_tile(block_m, block_n, 64, warps)
    assert tile == (None if expected is None else (*expected, 64))


def test_tile_families_map_and_the_others_do_not():
    tiled = config(split_k=4, num_stages=3, group_m=8)
    assert nvmmh.kernel_of(tiled) == NvKernel((128, 128, 64), (32, 128, 64), 4, 3, 8)
    for family in (Family.TMA_PERSISTENT, Family.WS_PERSISTENT):
        assert nvmmh.kernel_of(config(family, warps=8)).warp == (16, 128, 64)
    for family in (Family.STREAM_K, Family.GEMV, Family.WS_PINGPONG):
        assert nvmmh.kernel_of(config(family)) is None
    assert nvmmh.kernel_of(VendorConfig(BF16, RCR, Epilogue())) is None


def test_pick_takes_the_least_estimate_among_what_nvmmh_expresses():
    seen = []

    def fake(nv_problem, kernel):  # a bigger CTA tile is faster; 64x64 is refused (0)
        seen.append((nv_problem, kernel))
        m, n, _ = kernel.cta
        return 0.0 if (m, n) == (64, 64) else 1.0 / (m * n)

    configs = [config(block=(64, 128, 64)), config(Family.STREAM_K, block=(256, 256, 64)),
               VendorConfig(BF16, RCR, Epilogue()), config(block=(128, 128, 32)), config(block=(128, 128, 64)),
               config(block=(64, 64, 64))]
    names = ["a", "streamk", "vendor", "b", "c", "refused"]
    assert nvmmh.pick(names, problem(), configs, fake) == "b"  # b and c tie: the first in order wins
    assert [k.cta for _, k in seen] == [(64, 128, 64), (128, 128, 32), (128, 128, 64), (64, 64, 64)]
    assert nvmmh.pick(names[1:3], problem(), configs[1:3], fake) is None
    assert nvmmh.pick(["refused"], problem(), configs[5:], fake) is None
    assert nvmmh.pick(names, problem(layout="srr"), configs, fake) is None  # strided: no nvMMH problem


@pytest.mark.parametrize("name, arch, expected", [
    ("NVIDIA H200", "sm_90", "H200_SXM"), ("NVIDIA H100 80GB HBM3", "sm_90", "H100_SXM"),
    ("NVIDIA H100 PCIe", "sm_90", "H100_PCIE"), ("NVIDIA H20", "sm_90", "H20_SXM")])
def test_gpu_descriptor_comes_from_the_device_name(name, arch, expected):
    assert nvmmh.gpu_of([name], arch) == expected


@pytest.mark.parametrize("names, arch, why", [
    (["NVIDIA H200 NVL"], "sm_90", "no descriptor"), (["NVIDIA H200"], "sm_100", "no descriptor"),
    (["NVIDIA A100-SXM4-80GB"], "sm_80", "no descriptor"), (["NVIDIA H100 PCIe", "NVIDIA H200"], "sm_90", "2 devices"),
    ([], "sm_90", "0 devices")])
def test_no_descriptor_is_said_never_guessed(names, arch, why):
    with pytest.raises(nvmmh.Unavailable, match=why):
        nvmmh.gpu_of(names, arch)


def test_estimator_for_says_why_there_is_none():
    loaded = []
    assert nvmmh.estimator_for("conv", "sm_90", ["NVIDIA H200"], loaded.append) == (
        None, "nvMMH ranks GEMM tiles only, not conv")
    estimator, why = nvmmh.estimator_for("gemm", "sm_90", ["NVIDIA H200"] * 3, lambda gpu: gpu)
    assert (estimator, why, loaded) == ("H200_SXM", None, [])
    estimator, why = nvmmh.estimator_for("gemm", "sm_90", ["NVIDIA H200 NVL"], loaded.append)
    assert estimator is None and "H200 NVL" in why and loaded == []


@pytest.fixture(scope="module")
def sweep():
    """Three problems of the committed H200 bf16 sweep (rows of every family, cuBLAS among them)."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    frame = pd.read_parquet(SWEEP)
    return frame[frame["problem_id"].isin(frame["problem_id"].unique()[:3])]


def test_picker_skips_with_a_reason_without_the_package(sweep, no_package):
    report = ev.evaluate(sweep, strategies=["rules", "nvmmh"])
    (key,) = report.keys
    assert ev.Picker.NVMMH not in key.outcomes and len(key.outcomes[ev.Picker.RULES]) == 3
    assert "not usable" in key.skipped[ev.Picker.NVMMH] and "tiledispatch[nvmmh]" in key.skipped[ev.Picker.NVMMH]
    assert key.to_dict()["skipped"] == {"nvmmh": key.skipped[ev.Picker.NVMMH]}


def test_picker_is_not_a_default_strategy():
    assert ev.Picker.NVMMH not in ev.STANDARD and ev.Picker.NVMMH not in ev._pickers(ev.STANDARD)


def test_picker_ranks_the_sweeps_tiles_with_an_injected_estimator(sweep, monkeypatch):
    from tiledispatch.bench.table import config_from_row

    monkeypatch.setattr(nvmmh, "library", lambda gpu: lambda p, k: 1.0 / (k.cta[0] * k.cta[1] * k.split_k))
    (key,) = ev.evaluate(sweep, strategies=["rules", "nvmmh"]).keys
    outcomes = key.outcomes[ev.Picker.NVMMH]
    assert len(outcomes) == 3 and not key.skipped
    for outcome in outcomes:
        rows = sweep[sweep["problem_id"] == outcome.problem_id]
        picked = config_from_row("gemm", rows.loc[rows["kernel"] == outcome.kernel, "config"].iloc[0])
        mapped = [config_from_row("gemm", c) for c in rows["config"]]
        best = max(c.block_m * c.block_n * c.split_k for c in mapped if nvmmh.kernel_of(c) is not None)
        assert picked.family in nvmmh.MAPPED and picked.block_m * picked.block_n * picked.split_k == best


def test_cli_runs_nvmmh_beside_the_others_or_says_why_not(sweep, tmp_path, no_package):
    from typer.testing import CliRunner

    from tiledispatch.cli.main import app

    sweep.to_parquet(tmp_path / "sweep.parquet")
    result = CliRunner().invoke(app, ["evaluate", str(tmp_path / "sweep.parquet"), "--strategies", "rules,nvmmh"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["keys"]
    assert set(entry["strategies"]) == {"rules"} and "not usable" in entry["skipped"]["nvmmh"]


def test_real_library_prefers_a_big_tile_on_a_big_problem():
    nv = pytest.importorskip("nvMatmulHeuristics")
    for member in MatmulLayout:  # our enum is the library's, value for value
        assert nv.NvMatmulHeuristicsMatmulLayout[f"{member.name}_MAJOR"] == member
    assert nvmmh.layout_of(RCR) == nv.boolsToNvMatmulHeuristicsLayout(False, True)  # B transposed
    big, small = config(block=(128, 128, 64), warps=4), config(block=(16, 16, 64), warps=1)
    for metric in nvmmh.Metric:
        estimator = nvmmh.library("H200_SXM", metric)
        big_s, small_s = (nvmmh.estimate(problem(), c, estimator) for c in (big, small))
        assert 2 * 4096**3 / 989e12 < big_s < small_s / 2  # no faster than the H200's dense bf16 peak
        assert nvmmh.pick(["small", "big"], problem(), [small, big], estimator) == "big"
    h100 = nvmmh.estimate(problem(), big, nvmmh.library("H100_SXM", nvmmh.Metric.RUNTIME))
    assert h100 > nvmmh.estimate(problem(), big, nvmmh.library("H200_SXM", nvmmh.Metric.RUNTIME))
