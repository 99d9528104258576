"""Problem sets: named, deterministic, posed as real calls pose them, saved and loaded, split by problem."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
import torch

from tiledispatch.bench import problemsets as ps
from tiledispatch.bench.problemsets import catalog
from tiledispatch.bench.problemsets.base import Collector, Request
from tiledispatch.bench.problemsets.conv import TASKS, torchvision_layers
from tiledispatch.bench.table import canonical_json, problem_id, selection_key
from tiledispatch.core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from tiledispatch.core.op import get_op
from tiledispatch.ops.attention import AttentionOptions, check_operands as attention_operands, parse_causal
from tiledispatch.ops.conv.operands import check_operands as conv_operands, to_channels_last
from tiledispatch.ops.gemm import check_operands as gemm_operands

DTYPE_NAME = {("gemm", "fp8e4m3"): "fp8e4m3-bf16"}  # the selection key's spelling where it differs


def _fresh(name: str, **kwargs) -> tuple:
    catalog._generated.cache_clear()
    return ps.problem_set(name, **kwargs)


@pytest.mark.parametrize("name", ps.available())
def test_every_set_is_valid_deterministic_and_unique(name):
    spec = ps.get(name)
    dtype = "bf16"
    for direction in spec.directions:
        problems = ps.problem_set(name, dtype=dtype, direction=direction)
        assert problems, f"{name} {direction} is empty"
        assert _fresh(name, dtype=dtype, direction=direction) == problems
        ids = [problem_id(p) for p in problems]
        assert len(set(ids)) == len(ids)
        for p in problems:
            assert isinstance(p, get_op(spec.op).problem_type)
            key = selection_key(p, "sm_90")
            assert (key.op, key.direction, key.dtype) == (spec.op, direction, DTYPE_NAME.get((spec.op, dtype), dtype))
    every = ps.problem_set(name, dtype=dtype)
    assert len(every) == sum(len(ps.problem_set(name, dtype=dtype, direction=d)) for d in spec.directions)


def test_every_set_has_a_small_twin_of_few_problems():
    names = set(ps.available())
    for name in names:
        if not name.endswith("-small") and name not in {f"conv-{task}" for task in TASKS}:
            assert f"{name}-small" in names
    for name in (n for n in names if n.endswith("-small")):
        assert len(ps.problem_set(name, dtype="fp16")) <= 40
        for p in ps.problem_set(name, dtype="fp16"):
            assert p.flops() < 2**24, f"{name}: {p} is too large for the interpreter"


def test_the_real_sets_span_real_use():
    llm = ps.problem_set("gemm-llm", dtype="bf16")
    assert {p.m for p in llm} >= {1, 3, 7, 33, 255, 1000, 2047, 5555, 12000, 16384}
    assert {(p.n, p.k) for p in llm} >= {(6144, 4096), (4096, 14336), (128256, 4096), (1152, 896)}
    assert {p.layout.name for p in llm} == {"rcr"}
    assert {p.layout.name for p in ps.problem_set("gemm-llm-train", dtype="bf16")} == {"rrr", "crr"}
    assert any(p.batch > 1 for p in ps.problem_set("gemm-moe", dtype="bf16"))
    shapes = ps.problem_set("gemm-shapes", dtype="fp16")
    assert any(p.k >= 64 * max(p.m, p.n) for p in shapes) and any(p.m == p.n == p.k == 4093 for p in shapes)
    layers = torchvision_layers()
    assert {layer.model for _, layer in layers} >= {"resnet50", "densenet121", "fasterrcnn_resnet50_fpn", "r2plus1d_18"}
    convs = ps.problem_set("conv-torchvision", dtype="bf16", direction="forward")
    assert any(p.depthwise for p in convs) and any(p.spatial_dims == 3 for p in convs)
    assert any(1 < p.groups < p.c for p in convs) and any(p.epilogue.bias for p in convs)
    serving = ps.problem_set("attention-serving", dtype="bf16")
    assert {p.group for p in serving} >= {1, 4, 8} and {p.head_dim_qk for p in serving} >= {64, 128, 256, 80}
    assert any(p.seqlen_q == 1 and p.seqlen_kv == 32768 for p in serving)
    assert {p.mask.value for p in serving} >= {"causal", "causal-br", "window", "none"}
    assert any(p.variant.varlen for p in serving)


def test_set_problems_equal_those_of_real_tensors():
    """A set's problem is the one the dispatcher builds from real tensors of that shape and layout."""
    for p in ps.problem_set("gemm-llm-small", dtype="fp16"):
        a = torch.randn(p.m, p.k, dtype=torch.float16)
        w = torch.randn(p.n, p.k, dtype=torch.float16)
        bias = torch.randn(p.n, dtype=torch.float16) if p.epilogue.bias else None
        assert gemm_operands(a, w.t(), bias=bias).problem == p
    for p in ps.problem_set("conv-torchvision-small", dtype="fp32"):
        x = to_channels_last(torch.randn(p.n, p.c, *p.input_size))
        w = to_channels_last(torch.randn(p.k, p.c_per_group, *p.filter_size))
        dy = to_channels_last(torch.randn(p.n, p.k, *p.output_size))
        geometry = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation, "groups": p.groups}
        tensors = {"forward": {"x": x, "w": w, "bias": torch.randn(p.k) if p.epilogue.bias else None},
                   "bwd_data": {"dy": dy, "w": w, "input_size": tuple(x.shape)},
                   "bwd_weight": {"x": x, "dy": dy, "weight_size": tuple(w.shape)}}[p.direction.value]
        assert conv_operands(p.direction, **tensors, **geometry).problem == p
    prefill = [p for p in ps.problem_set("attention-serving-small", dtype="fp16") if p.layout.value == "bshd"]
    for p in prefill:
        q = torch.randn(p.batch, p.seqlen_q, p.heads_q, p.head_dim_qk, dtype=torch.float16).transpose(1, 2)
        k = torch.randn(p.batch, p.seqlen_kv, p.heads_kv, p.head_dim_qk, dtype=torch.float16).transpose(1, 2)
        causal = "top_left" if p.mask.value == "causal" else "bottom_right"
        options = AttentionOptions(causal=parse_causal(causal))
        assert attention_operands(q, k, k, options=options).problem == p


def test_duplicates_are_posed_once():
    spec = ps.get("conv-torchvision")
    collector = Collector()
    spec.generate(Request("bf16", "forward"), collector)
    unique = ps.problem_set("conv-torchvision", dtype="bf16", direction="forward")
    assert len(collector.problems) > len(unique) == len(set(collector.problems))
    assert list(dict.fromkeys(collector.problems)) == list(unique)


def test_limit_max_flops_and_seed():
    full = ps.problem_set("gemm-llm", dtype="bf16")
    some = ps.problem_set("gemm-llm", dtype="bf16", limit=25, seed=3)
    assert len(some) == 25 and some == ps.problem_set("gemm-llm", dtype="bf16", limit=25, seed=3)
    order = {p: i for i, p in enumerate(full)}
    assert [order[p] for p in some] == sorted(order[p] for p in some)
    capped = ps.problem_set("gemm-llm", dtype="bf16", max_flops=1e9)
    assert capped and all(p.flops() <= 1e9 for p in capped) and len(capped) < len(full)
    assert ps.problem_set("gemm-random", dtype="bf16", seed=1) != ps.problem_set("gemm-random", dtype="bf16", seed=2)
    assert len(ps.problem_set("gemm-random", dtype="bf16", seed=2)) == 500


def test_bad_requests_say_what_would_work():
    with pytest.raises(UnsupportedError, match="unknown problem set 'gemm-llama'.*gemm-llm"):
        ps.problem_set("gemm-llama", dtype="bf16")
    with pytest.raises(UnsupportedError, match="dtype one of"):
        ps.problem_set("conv-torchvision", dtype="fp8e4m3")
    with pytest.raises(UnsupportedError, match="direction one of forward, bwd_data, bwd_weight"):
        ps.problem_set("conv-random", dtype="bf16", direction="sideways")
    with pytest.raises(UnsupportedError, match="direction one of fwd"):
        ps.problem_set("attention-training", dtype="fp8e4m3", direction="bwd")
    with pytest.raises(InvalidArgumentError, match="limit"):
        ps.problem_set("gemm-llm", dtype="bf16", limit=-1)
    with pytest.raises(InvalidArgumentError, match="max_flops"):
        ps.problem_set("gemm-llm", dtype="bf16", max_flops="big")
    assert ps.problem_set("conv-random-small", dtype="fp16", direction="backward_data") == \
        ps.problem_set("conv-random-small", dtype="fp16", direction="bwd_data")


def test_refused_combinations_are_listed_not_hidden():
    built = ps.build("attention-serving", dtype="fp8e4m3")
    assert built.problems and all(p.direction.value == "fwd" for p in built.problems)
    reasons = " ".join(r.reason for r in built.refused)
    assert "[fp8-head-dim]" in reasons and "[fp8-features]" in reasons  # d=80/96/192 and packed (varlen)
    assert not ps.build("attention-serving", dtype="bf16").refused


def test_save_and_load_round_trip(tmp_path):
    gemms = ps.problem_set("gemm-shapes-small", dtype="fp16")
    convs = ps.problem_set("conv-torchvision-small", dtype="fp16")
    attns = ps.problem_set("attention-training-small", dtype="fp16")
    for problems in (gemms, convs, attns):
        path = ps.save_problems(problems, tmp_path / "one.json")
        assert json.loads(path.read_text())["op"] == problems[0].op.value
        assert ps.load_problems(path) == problems
    mixed = gemms + convs + attns
    assert ps.load_problems(ps.save_problems(mixed, tmp_path / "mixed.json")) == mixed
    bare = tmp_path / "bare.json"  # canonical problem objects without their op: told apart by their fields
    bare.write_text("[" + ",".join(canonical_json(p) for p in mixed) + "]")
    assert ps.load_problems(bare) == mixed


def test_bad_problem_files_are_refused(tmp_path):
    bad = tmp_path / "bad.json"
    for text, match in (('{"op": "gemm"}', "problems"), ('[{"m": 1}]', "cannot tell which op"),
                        ('{"op": "gemm", "problems": [{"m": 0, "n": 1, "k": 1}]}', "not a valid gemm problem"),
                        ('{"op": "matmul", "problems": []}', "not one of"), ("[1]", "JSON object"),
                        ("nope", "not valid JSON")):
        bad.write_text(text)
        with pytest.raises(InvalidProblemError, match=match):
            ps.load_problems(bad)


def test_folds_are_stable_disjoint_and_cover_every_row():
    assert [ps.fold_of(i, 5) for i in ("a", "b", "c", "0123456789abcdef")] == [
        ps.fold_of(i, 5) for i in ("a", "b", "c", "0123456789abcdef")]
    assert ps.fold_of("0123456789abcdef", 5) == 4  # a fixed hash: the same fold on every machine
    problems = ps.problem_set("gemm-llm", dtype="bf16")
    rng = random.Random(0)
    rows = [{"op": "gemm", "problem": canonical_json(p), "problem_id": problem_id(p), "kernel": f"k{j}"}
            for p in problems for j in range(rng.randint(1, 3))]
    frame = pd.DataFrame(rows).sample(frac=1.0, random_state=0)
    seen = []
    for fold in range(4):
        train, valid = ps.split(frame, 4, fold)
        assert set(train["problem_id"]).isdisjoint(valid["problem_id"])
        assert len(train) + len(valid) == len(frame) and len(valid) > 0
        seen += list(valid.index)
    assert sorted(seen) == sorted(frame.index)  # each row validates in exactly one fold
    ids = list(dict.fromkeys(frame["problem_id"]))
    train_ids, valid_ids = ps.split(ids, 4, 1)
    assert set(valid_ids) == set(ps.split(frame, 4, 1)[1]["problem_id"]) and not set(train_ids) & set(valid_ids)
    with pytest.raises(InvalidArgumentError, match="fold must be"):
        ps.split(ids, 4, 4)


def test_groups_join_the_token_counts_of_one_layer():
    llm = ps.problem_set("gemm-llm", dtype="bf16")
    by_layer = {}
    for p in llm:
        by_layer.setdefault((p.n, p.k, p.epilogue), set()).add(ps.group_of(p))
    assert all(len(groups) == 1 for groups in by_layer.values())
    assert len({g for groups in by_layer.values() for g in groups}) == len(by_layer)
    train = ps.problem_set("gemm-llm-train", dtype="bf16")
    dw = [p for p in train if p.layout.name == "crr" and (p.m, p.n) == (4096, 6144)]
    assert len(dw) > 1 and len({ps.group_of(p) for p in dw}) == 1
    convs = ps.problem_set("conv-torchvision", dtype="bf16", direction="bwd_weight")
    assert len({ps.group_of(p) for p in convs}) < len(convs)
    serving = ps.problem_set("attention-serving", dtype="bf16")
    assert len({ps.group_of(p) for p in serving}) < len(serving) / 10
    frame = ps.with_groups(pd.DataFrame({"op": "gemm", "problem": [canonical_json(p) for p in llm],
                                         "problem_id": [problem_id(p) for p in llm]}))
    train_rows, valid_rows = ps.split(frame, 5, 2, column="group_id")
    assert set(train_rows["group_id"]).isdisjoint(valid_rows["group_id"])
    with pytest.raises(InvalidArgumentError, match="group_id"):
        ps.split(frame.drop(columns="group_id"), 5, 2, column="group_id")


def test_vendor_only_names_the_problems_no_triton_kernel_takes():
    from tiledispatch import arch
    from tiledispatch.ops.gemm import GemmProblem

    wide = GemmProblem(m=8, n=8, k=8, wide_offsets=True)  # 64-bit offsets: only the vendor indexes them
    small = ps.problem_set("gemm-shapes-small", dtype="fp16")
    assert ps.vendor_only((*small, wide), arch.load("sm_90"), "default") == (wide,)


@pytest.mark.parametrize("name", ["sweep_gemm_fp16", "sweep_conv_forward_more", "sweep_attention_bwd",
                                  "sweep_attention_fwd"])
def test_a_problems_selection_slice_is_what_its_description_names(name):
    """`selection_key` reads (direction, dtype) from the problem's `selection_slice()`, which a first
    sight asks for: it must name the slice the whole description names, for every op."""
    from tiledispatch.bench.table import SelectionKey, selection_key
    from pathlib import Path
    folder = Path(__file__).resolve().parents[2] / "benchmarks/results/h200/selection/problems"
    problems = ps.load_problems(str(folder / f"{name}.json"))
    assert problems
    for problem in problems:
        described = problem.describe()
        want = SelectionKey(problem.op.value, described.get("direction", "forward"), str(described["dtype"]), "sm_90")
        assert selection_key(problem, "sm_90") == want
