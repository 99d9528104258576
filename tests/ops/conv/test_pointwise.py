"""The gemm family: 1x1, stride-1, unpadded dense convs as one call of the GEMM op (pointwise.py).

Each run writes into make_inputs' NaN-poisoned output and is checked against PyTorch's
CPU convolution in float64, as test_correctness does; the GEMM op's Triton kernels run
under the interpreter here and natively on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiledispatch import Dispatcher, Registry
from tiledispatch.ops.conv import ConvSignature, Direction, PointwiseConfig, check_operands, fastpath
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.pointwise import gemm_problem
from tiledispatch.ops.conv.problem import ConvEpilogue
from tiledispatch.ops.conv.reference import compare
from tiledispatch.ops.conv.rules import supports
from tiledispatch.ops.gemm.problem import Activation

from .helpers import ARCH, DEVICE, problem, run_and_check, spec_name


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)


def _gemm(p) -> str:
    return spec_name(PointwiseConfig(ConvSignature(p.direction, p.types, p.epilogue)))


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("size", [(7,), (5, 6), (3, 4, 5)], ids=lambda s: f"{len(s)}d")
@pytest.mark.parametrize("direction", list(Direction), ids=lambda d: d.value)
def test_every_direction_and_dimensionality(dispatcher, direction, size, dtype):
    # Odd sizes: 2 images of 24 input and 40 output channels.
    p = problem(direction, 2, 24, 40, 1, size, (1,) * len(size), 1, 0, 1, dtype)
    run_and_check(dispatcher, p, _gemm(p))


@pytest.mark.parametrize("epilogue", [ConvEpilogue(bias=True), ConvEpilogue(activation=Activation.GELU),
                                      ConvEpilogue(bias=True, activation=Activation.RELU, residual=True)],
                         ids=lambda e: e.name)
def test_the_forward_epilogue_is_the_gemm_ops(dispatcher, epilogue):
    p = problem(Direction.FORWARD, 2, 16, 24, 1, (5, 6), (1, 1), 1, 0, 1, "fp32", epilogue=epilogue)
    run_and_check(dispatcher, p, _gemm(p))


def test_an_output_without_a_matrix_view_is_written_back(dispatcher):
    """A caller's out whose pixels are not packed (every other W column of a wider tensor) has no
    2-D view: the product is computed into a copy and written back through its strides."""
    p = problem(Direction.FORWARD, 2, 16, 24, 1, (5, 6), (1, 1), 1, 0, 1, "fp32")
    inputs = make_inputs(p, device=DEVICE, seed=3)
    wide = torch.full((2, 5, 12, 24), float("nan"), device=DEVICE).permute(0, 3, 1, 2)
    out = wide[:, :, :, ::2]
    ops = check_operands(p.direction, **(inputs.kwargs(p) | {"out": out}))
    result = dispatcher.run(ops, kernel=dispatcher.resolve(_gemm(p), ops.problem))
    reference = torch.nn.functional.conv2d(inputs.x.double(), inputs.w.double())
    assert result.data_ptr() == out.data_ptr() and torch.allclose(out.double(), reference, rtol=1e-4, atol=1e-4)
    assert torch.isnan(wide[:, :, :, 1::2]).all(), "the columns between out's must stay untouched"


@pytest.mark.parametrize("epilogue", [ConvEpilogue(), ConvEpilogue(bias=True, activation=Activation.RELU,
                                                                     residual=True)], ids=lambda e: e.name)
def test_a_bound_forward_is_the_gemms_own_bound_call_on_views(dispatcher, epilogue):
    """fastpath.PointwiseConv: a 1x1 forward bound to this family replays the GEMM op's bound call on
    matrix views of new tensors, its product viewed as channels-last y; a copied x keeps the plan."""
    p = problem(Direction.FORWARD, 2, 16, 24, 1, (5, 6), (1, 1), 1, 0, 1, "fp32", epilogue=epilogue)
    first = make_inputs(p, device=DEVICE, seed=1)
    ops = check_operands(p.direction, **(first.kwargs(p) | {"out": None}))
    bound = fastpath.bind(dispatcher, ops, _gemm(p))
    assert isinstance(bound, fastpath.PointwiseConv)
    fresh = make_inputs(p, device=DEVICE, seed=2)
    y = bound((fresh.x, fresh.w, None, fresh.bias, fresh.residual, None))
    assert y.shape == fresh.out.shape and y.is_contiguous(memory_format=torch.channels_last)
    cmp = compare(y, check_operands(p.direction, **fresh.kwargs(p)))
    assert cmp.passed, cmp.to_dict()
    nchw = check_operands(p.direction, **(first.kwargs(p) | {"out": None, "x": first.x.contiguous()}))
    assert not isinstance(fastpath.bind(dispatcher, nchw, _gemm(p)), fastpath.PointwiseConv)  # x was copied


@pytest.mark.parametrize("case, reason", [
    (("forward", 2, 16, 16, 2, (5, 5), (1, 1), 1, 0, 1), "2 groups"),
    (("forward", 2, 16, 16, 1, (5, 5), (3, 3), 1, 1, 1), "filter (3, 3)"),
    (("bwd_data", 2, 16, 16, 1, (6, 6), (1, 1), 2, 0, 1), "stride (2, 2)"),
    (("bwd_weight", 2, 16, 16, 1, (5, 5), (1, 1), 1, 1, 1), "padding (1, 1)"),
])
def test_refusals_say_why(case, reason):
    p = problem(*case)
    why = supports(PointwiseConfig(ConvSignature(p.direction, p.types)), p)
    assert why is not None and reason in why


def test_the_gemm_each_direction_is():
    """Forward is pixels x K over C with the weight read transposed; backward-data pixels x C over K;
    backward-weight K x C over the pixels, dy read transposed."""
    shapes = {d: problem(d, 2, 24, 40, 1, (5, 6), (1, 1)) for d in Direction}
    fwd, data, weight = (gemm_problem(shapes[d]) for d in Direction)
    assert (fwd.m, fwd.n, fwd.k, fwd.layout.name) == (60, 40, 24, "rcr")
    assert (data.m, data.n, data.k, data.layout.name) == (60, 24, 40, "rrr")
    assert (weight.m, weight.n, weight.k, weight.layout.name) == (40, 24, 60, "crr")


def test_the_gemm_dispatcher_ranks_its_problems_class_alone_and_never_the_vendor():
    """A new 1x1 conv's first sight ranks the GEMM problem's own class of kernels (the whole rule
    set's 31,000 cost 90 ms a problem), and the family runs Triton: cuBLAS is never a candidate."""
    from tiledispatch import arch as arch_facts
    from tiledispatch.ops.conv.pointwise import gemm_dispatcher
    from tiledispatch.ops.gemm import Family as GemmFamily

    sm90 = arch_facts.load("sm_90")
    dispatcher = gemm_dispatcher(sm90)
    assert dispatcher.registry.lazy
    for direction in Direction:
        ranked = dispatcher.ranked(gemm_problem(problem(direction, 8, 64, 256, 1, (56, 56), (1, 1))))
        assert ranked and all(c.spec.config.family is not GemmFamily.VENDOR for c in ranked)
        assert ranked[0].score.value > 0
    assert dispatcher.registry.lazy  # nothing read the whole rule set
    everything = Registry.from_rule_sets(["gemm"], "default", sm90)
    kept = Registry.from_rule_sets(["gemm"], "default", sm90, keep=lambda s: s.config.family is not GemmFamily.VENDOR)
    fwd = gemm_problem(problem(Direction.FORWARD, 8, 64, 256, 1, (56, 56), (1, 1)))
    all_specs, kept_specs = everything.candidates(fwd.op, fwd), kept.candidates(fwd.op, fwd)
    assert [s for s in all_specs if s.config.family is not GemmFamily.VENDOR] == list(kept_specs)
    assert len(kept_specs) < len(all_specs)


# resnet50's and MobileNet's largest 1x1 convs (N, C, H, W, K): the family's Triton GEMMs ran 0.57-0.88x
# cuDNN on them, cuBLAS 0.89-1.0x (H200, benchmarks/results/h200/conv_1x1_gemm.txt)
MEASURED_1X1 = [(32, 64, 56, 56, 256), (32, 256, 56, 56, 64), (32, 1024, 14, 14, 512), (32, 512, 7, 7, 2048),
                (64, 24, 56, 56, 72), (64, 72, 56, 56, 24), (64, 16, 112, 112, 64), (64, 960, 7, 7, 160)]


@pytest.mark.parametrize("strategy", ["rules", "model"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_product_the_gemm_op_gives_its_vendor_is_not_the_familys(strategy, dtype):
    """Where the GEMM op would run the product on cuBLAS, the family scores 0 and cuDNN runs the
    conv: every measured 1x1 shape, by the rules and by the models (which do not rank what the rules
    score 0: `candidate_set.model_shortlist`)."""
    pytest.importorskip("lightgbm")
    from tiledispatch import arch as arch_facts
    from tiledispatch.ops.conv.families.pointwise import pointwise_score
    from tiledispatch.ops.conv.pointwise import gemm_op_dispatcher

    sm90 = arch_facts.load("sm_90")
    conv = Dispatcher(Registry.from_rule_set("conv", "default", sm90), sm90, strategy=strategy)
    for n, c, h, w, k in MEASURED_1X1:
        x = torch.empty(n, c, h, w, dtype=dtype, device="meta").contiguous(memory_format=torch.channels_last)
        wt = torch.empty(k, c, 1, 1, dtype=dtype, device="meta").contiguous(memory_format=torch.channels_last)
        p = check_operands(Direction.FORWARD, x=x, w=wt).problem
        assert gemm_op_dispatcher(sm90).select(gemm_problem(p)).is_vendor
        family = next(s for s in conv.registry.candidates(p.op, p) if isinstance(s.config, PointwiseConfig))
        score = pointwise_score(family.config, p, sm90)
        assert score.value == 0.0 and score.terms == {"gemm_picks_vendor": 1.0}
        assert conv.select(p).is_vendor, (n, c, h, w, k)


def test_the_familys_kernel_read_off_the_gemm_ops_ranking():
    """The forward's score reads the family's Triton GEMM off the GEMM op's own ranking (learned where a
    model ships) rather than ranking the product again: `rules_first` gives the kernel the family's
    dispatcher (no vendor, the rules) ranks first, on every product, whatever reordered the op's."""
    pytest.importorskip("lightgbm")
    from tiledispatch import arch as arch_facts
    from tiledispatch.bench.problemsets import load_problems
    from tiledispatch.ops.conv.pointwise import gemm_dispatcher, gemm_op_dispatcher

    sm90 = arch_facts.load("sm_90")
    op, family = gemm_op_dispatcher(sm90), gemm_dispatcher(sm90)
    assert op.strategy.value == "model"  # the shipped sm_90 GEMM model reorders the op's ranking
    root = Path(__file__).resolve().parents[3]
    products = [gemm_problem(p) for p in load_problems(
        root / "benchmarks/results/h200/selection/problems/sweep_conv_forward.json") if p.pointwise]
    reordered = 0
    for gemm in products:
        ranking = op.explain(gemm).refusals
        first = ranking.rules_first(lambda c: not c.spec.is_vendor)
        assert first.spec.name == family.ranked(gemm)[0].spec.name
        reordered += ranking.model is not None and ranking.accepted[0].spec.name != first.spec.name
    assert len(products) > 20 and reordered > 0  # the model's order differs, and is not what is read
