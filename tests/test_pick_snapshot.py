"""The dispatcher's picks over every committed suite are those of the snapshot (issue 39's guard).

tests/data/picks_sm90.json and picks_sm80.json hold, for every case of benchmarks/suites/ posed
as its benchmark poses it (gemm: 141 problems, conv: 264, attention: 72), the `rules` pick of
the op's default rule set, the Triton pick, gemm's graph replays' pick and the first three
ranked candidates with their scores (benchmarks/picks.py says exactly what). This recomputes
ALL of them, no subset, on the CPU from shape-only tensors, and fails listing every
difference: a refactor that must not change behaviour leaves this passing untouched.

The ranking is pure Python over ~31k gemm kernels a problem (about 35 s of CPU for both
arches, gemm two thirds of it), so the six (arch, op) jobs run in two spawned processes: about
20 s on a free 2-core machine, 35 s where another process holds one of the two cores.

A change that is meant to move picks regenerates the snapshot and commits it with the change,
saying why the picks moved:

    python benchmarks/picks.py --arch sm_90 --check tests/data/picks_sm90.json   (the differences)
    python benchmarks/picks.py --arch sm_90 --out tests/data/picks_sm90.json     (and sm_80)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SNAPSHOTS = {"sm_90": DATA / "picks_sm90.json", "sm_80": DATA / "picks_sm80.json"}
if str(ROOT) not in sys.path:  # benchmarks/ is no package: importable from the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import picks  # noqa: E402


def _jobs() -> list[tuple[str, str]]:
    """(arch, op) pairs, the longest first, so two workers finish together."""
    jobs = [(arch, op) for arch in SNAPSHOTS for op in picks.OPS]
    weight = {"gemm": 3, "conv": 2, "attention": 1}
    return sorted(jobs, key=lambda job: (-weight[job[1]], job[0] != "sm_90"))


@pytest.fixture(scope="module")
def recomputed() -> dict[str, dict]:
    """{arch: {key: record}} for every snapshot, computed in up to two worker processes.

    Spawned, not forked: the parent holds torch's and the dispatchers' threads and locks.
    """
    jobs = _jobs()
    archs, ops = [arch for arch, _ in jobs], [(op,) for _, op in jobs]
    workers = min(2, os.cpu_count() or 1)
    if workers == 1:
        results = list(map(picks.compute, archs, ops))
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(picks.compute, archs, ops))
    out: dict[str, dict] = {arch: {} for arch in SNAPSHOTS}
    for (arch, _), entries in zip(jobs, results):
        out[arch].update(entries)
    return out


@pytest.mark.parametrize("arch", sorted(SNAPSHOTS))
def test_picks_match_the_snapshot(arch, recomputed):
    saved = json.loads(SNAPSHOTS[arch].read_text())
    assert saved["arch"] == arch and saved["top"] == picks.TOP
    found = picks.differences(saved["entries"], recomputed[arch])
    assert not found, (f"{len(found)} of {len(saved['entries'])} picks on {arch} differ from "
                       f"{SNAPSHOTS[arch].name} (python benchmarks/picks.py --check {SNAPSHOTS[arch]} "
                       f"lists them too):\n" + "\n".join(found))


def test_the_snapshot_covers_every_suite():
    """Every op and every suite file of benchmarks/suites/ has entries: a suite added later is
    posed (and its absence from the snapshot is a difference), not silently left out."""
    suites = {p.stem for p in picks.SUITES.glob("*.json")}
    for arch, path in SNAPSHOTS.items():
        entries = json.loads(path.read_text())["entries"]
        assert {key.split("/")[1] for key in entries} == suites, arch
        assert {key.split("/")[0] for key in entries} == set(picks.OPS), arch
