"""Warm-up ahead of time (tiledispatch/warmup.py): the problems a model poses are recorded with the
dispatcher's own picks, nothing compiled runs while recording, the shapes survive a JSON round trip,
and a bad shapes file is refused naming the entry."""

from __future__ import annotations

import json

import pytest
import torch

import tiledispatch
from tiledispatch.core.dispatcher import default_dispatcher, dispatcher_or_default
from .conftest import requires_interpreter
from tiledispatch.recording import Recorder, build_shapes, load_shapes, record, save_shapes, warmup


class Tiny(torch.nn.Module):
    """A conv and a linear layer through tiledispatch: fp32, CPU-sized."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(8, 4, 3, 3, generator=g) * 0.2)
        self.fc = torch.nn.Parameter(torch.randn(8 * 6 * 6, 16, generator=g) * 0.05)

    def forward(self, x):
        y = tiledispatch.conv(x, self.w, padding=1)
        return tiledispatch.gemm(y.reshape(y.shape[0], -1), self.fc)


def _input() -> torch.Tensor:
    return torch.randn(2, 4, 6, 6).to(memory_format=torch.channels_last)


def test_recording_poses_the_model_s_problems_with_the_default_picks():
    model, x = Tiny(), _input()
    with torch.no_grad():
        shapes = record(model, x)
    assert [s.problem.op.value for s in shapes] == ["conv", "gemm"]
    dispatcher = dispatcher_or_default(None, x)  # the CPU tensors' default, on a GPU host too
    for shape in shapes:
        assert shape.kernel == dispatcher.select(shape.problem).name
    gemm = shapes[1].problem
    assert (gemm.m, gemm.n, gemm.k) == (2, 16, 8 * 36)


@requires_interpreter
def test_recording_launches_no_compiled_kernel():
    """The recorder's stages are skipped: the output keeps the poison the caller put there."""
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    out = torch.full((8, 8), float("nan"))
    shapes = record(lambda a, b: tiledispatch.gemm(a, b, out=out), a, b)  # the dispatcher of a's device
    assert len(shapes) == 1 and torch.isnan(out).all()
    tiledispatch.gemm(a, b, out=out)  # the real call after it: its bound call is not the recorder's
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


def test_backward_records_the_gradients_problems():
    model, x = Tiny(), _input().requires_grad_()
    shapes = warmup(model, x, backward=True)
    ops = [(s.problem.op.value, getattr(s.problem, "direction", None)) for s in shapes]
    assert len(shapes) > 2 and ("conv", None) not in ops
    assert {str(getattr(d, "value", d)) for op, d in ops if op == "conv"} >= {"forward", "bwd_data", "bwd_weight"}


def test_shapes_round_trip_and_build_nothing_on_the_interpreter(tmp_path):
    with torch.no_grad():
        shapes = record(Tiny(), _input())
    path = save_shapes(shapes, tmp_path / "shapes.json")
    assert load_shapes(path) == shapes
    assert build_shapes(shapes, dispatcher=dispatcher_or_default(None, _input())) == []  # interpreter kernels


def test_build_shapes_compiles_each_kernel_once_per_specialization_in_one_pool(monkeypatch):
    """An sm_90 shapes list (no GPU needed to plan it): one pool for every (kernel, specialisation)
    pair, each once however many shapes share it. A pool per specialisation spawned its workers (and
    their imports) again for each and waited for the slowest compile of each."""
    from tiledispatch import arch as arch_facts
    from tiledispatch.core import registry as registry_module
    from tiledispatch.core.dispatcher import Dispatcher
    from tiledispatch.core.kernel import compiles
    from tiledispatch.core.op import all_ops
    from tiledispatch.ops.gemm import check_operands
    from tiledispatch import recording

    def problem(m, n, k):
        return check_operands(torch.empty(m, k, device="meta", dtype=torch.bfloat16),
                              torch.empty(k, n, device="meta", dtype=torch.bfloat16)).problem

    sm90 = arch_facts.load("sm_90")
    dispatcher = Dispatcher(registry_module.Registry.from_rule_sets([d.kind for d in all_ops()], "default", sm90),
                            sm90)
    problems = [problem(m, n, k) for m, n, k in ((512, 512, 512), (512, 512, 512), (100, 200, 72), (1000, 1000, 1000),
                                                (33, 40, 24))]
    shapes = [recording.Shape(p, dispatcher.select(p).name) for p in problems]
    calls = []
    monkeypatch.setattr(recording, "build_each", lambda work, cache, jobs: calls.append((list(work), jobs)) or [])
    assert recording.build_shapes(shapes, dispatcher=dispatcher, jobs=3) == []
    assert len(calls) == 1 and calls[0][1] == 3
    pairs = [(spec.name, specializations) for spec, specializations in calls[0][0]]
    wanted = set()
    for shape in shapes:  # the vendor's picks compile nothing
        spec = dispatcher.registry.get(shape.kernel)
        specialization = spec.definition.specialization_of(shape.problem)
        if compiles(spec, specialization):
            wanted.add((shape.kernel, (specialization,)))
    assert len(pairs) == len(set(pairs)) == len(wanted) and set(pairs) == wanted
    assert len({sp for _, sp in pairs}) > 1  # several specialisations, one pool


@pytest.mark.parametrize("bad", [
    {"format": "other"},
    {"format": "tiledispatch-shapes", "format_version": 1, "shapes": {}},
    {"format": "tiledispatch-shapes", "format_version": 1, "shapes": [{"op": "gemm", "problem": {"m": -1},
                                                                         "kernel": "x"}]},
    {"format": "tiledispatch-shapes", "format_version": 1, "shapes": [{"op": "nope", "problem": {}, "kernel": "x"}]},
])
def test_a_bad_shapes_file_is_refused(tmp_path, bad):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="shapes"):
        load_shapes(path)


def test_the_recorder_keeps_no_bound_call():
    recorder = Recorder(default_dispatcher())
    assert recorder.memo("key", lambda: 1) == 1 and recorder.memo("key", lambda: 2) == 2


def test_the_cli_warms_from_a_shapes_file(tmp_path):
    from typer.testing import CliRunner

    from tiledispatch.cli.main import app

    with torch.no_grad():
        path = save_shapes(record(Tiny(), _input()), tmp_path / "shapes.json")
    result = CliRunner().invoke(app, ["warmup", str(path), "-j", "1"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["status"], document["shapes"]) == ("ok", 2)
    if not torch.cuda.is_available():  # a GPU host builds its own arch's picks for the recorded problems
        assert document["built"] == 0
    path.write_text("[]")
    result = CliRunner().invoke(app, ["warmup", str(path)])
    assert result.exit_code == 3 and "shapes file" in json.loads(result.stdout)["error"]["message"]


def test_a_shapes_file_of_another_arch_builds_this_arch_s_picks():
    """A kernel name of another arch (a file recorded elsewhere) is not in this registry: the
    problem is what the file ships, and this dispatcher's pick builds instead."""
    from tiledispatch.recording import Shape, _spec_of

    with torch.no_grad():
        shapes = record(Tiny(), _input())
    dispatcher = dispatcher_or_default(None, _input())
    for shape in shapes:
        foreign = Shape(shape.problem, shape.kernel + "_sm90")
        assert _spec_of(dispatcher, foreign) == dispatcher.select(shape.problem)


def test_backward_finds_the_tensors_of_a_mapping_output():
    """A model returning a mapping (transformers' ModelOutput is one) has its backward recorded too."""
    model, x = Tiny(), _input().requires_grad_()
    shapes = warmup(lambda inp: {"logits": model(inp), "note": "not a tensor"}, x, backward=True)
    directions = {str(getattr(getattr(s.problem, "direction", None), "value", None)) for s in shapes}
    assert {"bwd_data", "bwd_weight"} <= directions


@requires_interpreter
def test_after_a_warmup_the_first_real_call_ranks_and_loads_nothing(monkeypatch):
    """The recorder's selections are the dispatcher's own, and warmup loads what it built."""
    model, x = Tiny(), _input()
    dispatcher = dispatcher_or_default(None, x)
    with torch.no_grad():
        shapes = warmup(model, x)
    ranked, loaded = [], []
    monkeypatch.setattr(dispatcher, "_rank", lambda problem: ranked.append(problem))
    monkeypatch.setattr(dispatcher, "_load", lambda spec, specialization: loaded.append(spec.name))
    with torch.no_grad():
        got = model(x)
    assert ranked == [] and loaded == []
    want = Tiny()(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert [s.kernel for s in shapes] == [dispatcher.select(s.problem).name for s in shapes]


@requires_interpreter
def test_under_autotune_the_recorder_times_nothing_and_records_every_finalist(tmp_path):
    """A skipped stage has no time: recording under autotune must neither store a timing nor pick
    by one; it names each finalist, for the real call to time them all built."""
    from tiledispatch.core.cache import KernelCache
    from tiledispatch.core.dispatcher import Dispatcher, Strategy
    from tiledispatch.core.op import OpKind, RuleSet
    from tiledispatch.core.registry import Registry
    from tiledispatch.core.tuning import policy

    arch = tiledispatch.arch.load("interpreter")  # the CPU tensors' arch, on a GPU host too
    tuned = Dispatcher(Registry.from_rule_set(OpKind.GEMM, RuleSet.TESTS, arch), arch, strategy=Strategy.AUTOTUNE,
                       cache=KernelCache(tmp_path))
    a, b = torch.randn(40, 24).half(), torch.randn(24, 56).half()
    shapes = record(lambda: tiledispatch.gemm(a, b), dispatcher=tuned)
    problem = shapes[0].problem
    finalists = {c.spec.name for c in policy().finalists(list(tuned.ranked(problem)))}
    assert len(finalists) > 1 and finalists <= {s.kernel for s in shapes}
    assert list(tuned.tuning.dir.glob("*.json")) == []


@requires_interpreter
def test_a_training_warmup_leaves_inference_nothing_to_rank_or_load_either(monkeypatch):
    """warmup(backward=True) records the no-grad forward too: a model that trains is evaluated. A
    conv with an activation poses another problem there: the activation fused, where a recorded
    call fuses the bias alone and applies the activation outside (autograd needs its input)."""
    class Activated(Tiny):
        def forward(self, x):
            y = tiledispatch.conv(x, self.w, padding=1, bias=self.fc[0, :8], activation="relu")
            return tiledispatch.gemm(y.reshape(y.shape[0], -1), self.fc)

    model, x = Activated(), _input().requires_grad_()
    dispatcher = dispatcher_or_default(None, x)
    warmup(model, x, backward=True)
    ranked, loaded = [], []
    monkeypatch.setattr(dispatcher, "_rank", lambda problem: ranked.append(problem))
    monkeypatch.setattr(dispatcher, "_load", lambda spec, specialization: loaded.append(spec.name))
    with torch.no_grad():
        model(x.detach())
    assert ranked == [] and loaded == []
