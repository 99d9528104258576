"""GEMM on a real GPU: bf16 (which the interpreter lacks), native compiles and the cache.

Skipped without a GPU; run on the H200 with `python -m pytest tests/ops/gemm/test_gpu.py`.
"""

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import tiledispatch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.core.dtypes import DType
from tiledispatch.ops.gemm import Align, Alignment, GemmLayout, GemmProblem, GemmTypes, check_operands
from tiledispatch.ops.gemm.inputs import make_inputs
from tiledispatch.ops.gemm.problem import Activation, Epilogue
from tiledispatch.ops.gemm.reference import compare

from ...conftest import requires_gpu

pytestmark = requires_gpu

SHAPES = [(1, 1, 1), (96, 80, 72), (33, 65, 127), (257, 129, 1000), (64, 64, 8192), (1024, 1024, 1024)]
EPILOGUES = [Epilogue(), Epilogue(True, Activation.GELU, True), Epilogue(False, Activation.SILU, False),
             Epilogue(True, Activation.RELU, False)]


_TRITON = []


def triton_only() -> Dispatcher:
    """The default registry without the vendor candidate, so these tests exercise our kernels."""
    if not _TRITON:
        arch = current_arch()
        registry = Registry.from_rule_set("gemm", "default", arch).filter(lambda s: s.family != "vendor")
        _TRITON.append(Dispatcher(registry, arch))
    return _TRITON[0]


def _check(problem: GemmProblem, dispatcher=None, kernel=None, seed=0):
    inputs = make_inputs(problem, device="cuda", seed=seed)
    ops = check_operands(inputs.a, inputs.b, activation=problem.epilogue.activation,
                         allow_tf32=problem.types.allow_tf32, **inputs.kwargs())
    # A dim of size 1 makes the layout ambiguous (any stride is "contiguous"), so the
    # detected letters may differ from the requested ones there.
    if min(problem.m, problem.n, problem.k) > 1:
        assert ops.problem == replace(problem, alignment=ops.problem.alignment)
    out = (dispatcher or triton_only()).run(ops, kernel=kernel)
    torch.cuda.synchronize()
    result = compare(out, ops)
    assert result.passed, (problem, kernel, result)
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["rrr", "rcr", "crr", "ccr", "sss"])
def test_bf16_layouts(shape, layout):
    m, n, k = shape
    _check(GemmProblem(m, n, k, types=GemmTypes.parse("bf16"), layout=GemmLayout.parse(layout)))


def test_launch_bound_call_runs_the_weighed_pick_eagerly_and_the_replay_pick_in_a_graph():
    """16x16: eager calls run the pick weighed against an eager call's host time (core.hostcost),
    a captured graph the kernel fastest on the device; both kernels are bound before the capture,
    and both compute."""
    from tiledispatch.core.hostcost import for_eager
    from tiledispatch.ops.gemm import check_operands, fastpath
    from tiledispatch.ops.gemm.ranking import replay_pick

    dispatcher = Dispatcher(Registry.from_rule_set("gemm", "default", current_arch()), current_arch())
    a = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    out = torch.full((16, 16), float("nan"), device="cuda", dtype=torch.bfloat16)
    tiledispatch.gemm(a, b, out=out, dispatcher=dispatcher)
    assert _rel(out, _ref(a, b)) < 1.6e-2
    (bound,) = dispatcher._bound.values()
    problem = check_operands(a, b, out=out).problem
    pick = dispatcher.select(problem)
    eager_spec, replayed_spec = for_eager(dispatcher, problem, pick), replay_pick(dispatcher, problem, pick)
    eager, replayed = (bound.eager, bound.replayed) if isinstance(bound, fastpath.ByCapture) else (bound, bound)
    assert isinstance(bound, fastpath.ByCapture) == (eager_spec.name != replayed_spec.name)
    assert isinstance(eager, fastpath.DirectMatmul) == eager_spec.is_vendor
    assert isinstance(replayed, fastpath.DirectMatmul) == replayed_spec.is_vendor
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiledispatch.gemm(a, b, out=out, dispatcher=dispatcher)
    a.copy_(torch.randn_like(a))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out, _ref(a, b)) < 1.6e-2
    assert len(dispatcher._bound) == 1


def test_a_vendor_call_with_a_bias_alone_is_one_addmm_on_the_callers_tensors():
    from tiledispatch.ops.gemm import fastpath

    vendor = next(s.name for s in tiledispatch.default_dispatcher().registry if s.op.value == "gemm" and s.is_vendor
                  and s.name.startswith("gemm_bf16_") and "_vendor_bias_" in s.name)
    a, w = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16), torch.randn(32, 64, device="cuda",
                                                                                 dtype=torch.bfloat16)
    bias = torch.randn(32, device="cuda", dtype=torch.bfloat16)
    out = torch.full((8, 32), float("nan"), device="cuda", dtype=torch.bfloat16)
    for given in (None, out):
        c = tiledispatch.gemm(a, w.t(), bias=bias, out=given, kernel=vendor)
        want = a.double() @ w.double().t() + bias.double()
        assert _rel(c, want) < 1.6e-2 and (given is None or c.data_ptr() == out.data_ptr())
    kinds = {type(v) for v in tiledispatch.default_dispatcher()._bound.values()}
    assert fastpath.DirectMatmul in kinds  # no plan around PyTorch's addmm


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: e.name)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "tf32", "fp8e4m3", "fp8e4m3xfp8e5m2"])
def test_dtypes_and_epilogues(dtype, epilogue):
    _check(GemmProblem(200, 136, 320, batch=2, types=GemmTypes.parse(dtype), epilogue=epilogue))


def test_every_tests_tile_in_bf16_with_split_k():
    """Forces each tile of the `tests` rule set (split-K included) on one odd bf16 problem."""
    arch = current_arch()
    registry = Registry.from_rule_set("gemm", "tests", arch)
    dispatcher = Dispatcher(registry, arch)
    problem = GemmProblem(77, 93, 515, types=GemmTypes.parse("bf16"), epilogue=Epilogue(True, Activation.GELU, True))
    # Odd sizes leave no operand 16-byte aligned: the data's alignment, not the default, decides support.
    unaligned = replace(problem, alignment=Alignment(*[False] * 6))
    names = [s.name for s in registry if s.definition.supports(s.config, unaligned) is None]
    assert not any("tma-persistent" in n and "realign" not in n for n in names)  # TMA only on aligned copies
    assert any("tma-persistent" in n and "realign" in n for n in names)
    assert any("_k1_" not in n for n in names)
    for name in names:
        _check(problem, dispatcher, kernel=name)


def test_public_gemm_matches_torch_in_bf16():
    a = torch.randn(300, 500, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(500, 700, device="cuda", dtype=torch.bfloat16).t().contiguous().t()
    bias = torch.randn(700, device="cuda", dtype=torch.bfloat16)
    got = tiledispatch.gemm(a, b, bias=bias, activation="gelu")
    ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    rel = (got.double() - ref).norm() / ref.norm()
    assert rel < 1.6e-2


def test_fresh_process_loads_from_cache_without_compiling(tmp_path):
    """A second process finds the kernel in the on-disk cache: no triton.compile call."""
    script = (
        "import torch, triton, tiledispatch\n"
        "calls = []\n"
        "real = triton.compile\n"
        "triton.compile = lambda *a, **k: calls.append(1) or real(*a, **k)\n"
        "a = torch.randn(128, 256, device='cuda', dtype=torch.bfloat16)\n"
        "b = torch.randn(256, 64, device='cuda', dtype=torch.bfloat16)\n"
        # A Triton kernel by name: on so small a problem the rules may pick cuBLAS, which compiles nothing.
        "c = tiledispatch.gemm(a, b, kernel='gemm_bf16_rrr_tiled_32x32x32_w4_s2_g4_k1_none_sm90')\n"
        "torch.cuda.synchronize()\n"
        "assert (c.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm() < 1.6e-2\n"
        "print('compiles', len(calls))\n"
    )
    env = {**__import__("os").environ, "TILEDISPATCH_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "compiles 1" in first.stdout or "compiles 2" in first.stdout, first.stdout
    assert "compiles 0" in second.stdout, second.stdout


def _ref(a, b, bias=None, residual=None, scale=1.0):
    out = (a.double() @ b.double()) * scale
    if bias is not None:
        out = out + bias.double()
    return out if residual is None else out + residual.double()


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("shape", [(96, 80, 72), (64, 64, 8192), (257, 129, 1000)])
def test_fast_path_replays_on_new_tensors(shape):
    """Later calls of one signature skip the checks but must still compute on the new data."""
    m, n, k = shape
    dispatcher = Dispatcher(Registry.from_rule_set("gemm", "default", current_arch()), current_arch())
    for _ in range(3):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        got = tiledispatch.gemm(a, b, bias=bias, residual=residual, out=out, dispatcher=dispatcher)
        assert got.data_ptr() == out.data_ptr()
        assert _rel(got, _ref(a, b, bias, residual)) < 1.6e-2
        plain = tiledispatch.gemm(a, b, dispatcher=dispatcher)
        assert _rel(plain, _ref(a, b)) < 1.6e-2
    assert len(dispatcher._bound) == 2  # one bound call per signature


def test_fast_path_keys_out_by_its_layout():
    """`out=` alone is keyed inline: a column-major out, or one with a bias beside it, binds anew."""
    dispatcher = Dispatcher(Registry.from_rule_set("gemm", "default", current_arch()), current_arch())
    a = torch.randn(96, 72, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(72, 80, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(80, device="cuda", dtype=torch.bfloat16)
    rows = torch.full((96, 80), float("nan"), device="cuda", dtype=torch.bfloat16)
    cols = torch.full((80, 96), float("nan"), device="cuda", dtype=torch.bfloat16).t()
    for out in (rows, cols, rows):
        out.fill_(float("nan"))
        assert _rel(tiledispatch.gemm(a, b, out=out, dispatcher=dispatcher), _ref(a, b)) < 1.6e-2
        assert _rel(out, _ref(a, b)) < 1.6e-2
    out = tiledispatch.gemm(a, b, bias=bias, out=rows, dispatcher=dispatcher)
    assert _rel(out, _ref(a, b, bias)) < 1.6e-2
    assert len(dispatcher._bound) == 3


def test_fast_path_fp8_scales_and_aliasing():
    a = torch.randn(128, 256, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(256, 64, device="cuda").to(torch.float8_e4m3fn)
    for scale in (0.5, 2.0):
        sa = torch.tensor(scale, device="cuda")
        sb = torch.tensor(0.25, device="cuda")
        got = tiledispatch.gemm(a, b, scale_a=sa, scale_b=sb)
        assert _rel(got, _ref(a, b, scale=scale * 0.25)) < 1.6e-2
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    tiledispatch.gemm(x, x.clone(), out=torch.empty_like(x))  # binds the signature
    with pytest.raises(tiledispatch.InvalidProblemError, match="overlaps a in memory"):
        tiledispatch.gemm(x, x.clone(), out=x)


def test_cuda_graph_capture_and_replay():
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(256, 128, device="cuda", dtype=torch.bfloat16)
    tiledispatch.gemm(a, b, out=out)  # compile and bind outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiledispatch.gemm(a, b, out=out)
    a.copy_(torch.randn_like(a))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out, _ref(a, b)) < 1.6e-2


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: e.name)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "fp16-fp32", "fp8e4m3"])
def test_vendor_candidate_with_its_epilogue_steps(dtype, epilogue):
    types = GemmTypes(DType.FP16, DType.FP16, DType.FP32) if dtype == "fp16-fp32" else GemmTypes.parse(dtype)
    problem = GemmProblem(192, 128, 320, types=types, layout=GemmLayout.parse("rcr"), epilogue=epilogue)
    name = f"gemm_{types.name}_sss_vendor_{epilogue.name}_sm90"
    _check(problem, tiledispatch.default_dispatcher(), kernel=name)


def test_dispatcher_explains_the_vendor_candidate():
    problem = GemmProblem(4096, 4096, 4096, types=GemmTypes.parse("bf16"), layout=GemmLayout.parse("rcr"))
    explanation = tiledispatch.default_dispatcher().explain(problem)
    vendor = [c for c in explanation.ranked if c.spec.family == "vendor"]
    assert len(vendor) == 1 and "epilogue_steps" in vendor[0].score.terms


@pytest.mark.parametrize("batched", [False, True], ids=["2d", "batched"])
def test_fast_path_direct_vendor_matmul(batched):
    """A plain call bound to the vendor goes straight to PyTorch's matmul: new data, out=, aliasing."""
    name = "gemm_bf16_sss_vendor_none_sm90"
    rows = (3, 96) if batched else (96,)
    for _ in range(2):
        a = torch.randn(*rows, 72, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(72, 80, device="cuda", dtype=torch.bfloat16)
        out = torch.full((*rows, 80), float("nan"), device="cuda", dtype=torch.bfloat16)
        got = tiledispatch.gemm(a, b, out=out, kernel=name)
        assert got.data_ptr() == out.data_ptr()
        assert _rel(got, _ref(a, b)) < 1.6e-2
        plain = tiledispatch.gemm(a, b, kernel=name)
        assert plain.shape == out.shape and _rel(plain, _ref(a, b)) < 1.6e-2
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    tiledispatch.gemm(x, x.clone(), out=torch.empty_like(x), kernel=name)  # binds the signature
    with pytest.raises(tiledispatch.InvalidProblemError, match="overlaps a in memory"):
        tiledispatch.gemm(x, x.clone(), out=x, kernel=name)


# -- rows that are multiples of 16 bytes but not of 16 elements (Align.BYTES16) ------------------


def test_every_default_tile_on_rows_of_1000_bf16():
    """odd_1000 of the suite: every tile of the default rule set, tma-persistent included, is
    compiled with 16-byte vectors for it (divisibility 8) and must still be exact."""
    problem = GemmProblem(1000, 1000, 1000, types=GemmTypes.parse("bf16"), layout=GemmLayout.parse("rcr"))
    inputs = make_inputs(problem, device="cuda")
    alignment = check_operands(inputs.a, inputs.b, out=inputs.out).problem.alignment
    assert alignment == Alignment(*[Align.BYTES16] * 6)
    dispatcher = triton_only()
    actual = replace(problem, alignment=alignment)
    names = [s.name for s in dispatcher.registry if s.definition.supports(s.config, actual) is None]
    assert sum("tma-persistent" in n for n in names) >= 10 and any("_k1_" not in n for n in names)
    for seed, name in enumerate(names):
        _check(problem, dispatcher, kernel=name, seed=seed)


@pytest.mark.parametrize("layout", ["rrr", "crr", "ccr"])
def test_16_byte_rows_in_other_layouts(layout):
    # 264 x 1000 x 1000: every stride is 264 or 1000 halves (528 or 2000 bytes).
    problem = GemmProblem(264, 1000, 1000, types=GemmTypes.parse("bf16"), layout=GemmLayout.parse(layout))
    dispatcher = triton_only()
    inputs = make_inputs(problem, device="cuda")
    actual = replace(problem, alignment=check_operands(inputs.a, inputs.b, out=inputs.out).problem.alignment)
    names = [s.name for s in dispatcher.registry if s.definition.supports(s.config, actual) is None]
    for family in ("tiled", "tma-persistent"):
        name = next(n for n in names if f"_{family}_" in n and "_k1_" in n)
        _check(problem, dispatcher, kernel=name)


def test_fast_path_keeps_16_byte_and_misaligned_calls_apart():
    """Same shapes and strides, one call 16-byte aligned and one 2 bytes off: the signature's
    alignment bit must send them to different specialisations (a vectorised kernel on the
    misaligned one would fault or read wrong data)."""
    name = "gemm_bf16_rcr_tiled_64x64x32_w4_s3_g8_k1_none_" + current_arch().tag
    flat = torch.randn(2 * 1000 * 1000 + 8, device="cuda").bfloat16()
    for offset in (0, 1, 0, 1):
        a = flat[offset:offset + 1000 * 1000].view(1000, 1000)
        b = flat[1000 * 1000 + offset:2 * 1000 * 1000 + offset].view(1000, 1000).t()
        assert (a.data_ptr() % 16 == 0) == (offset == 0)
        out = tiledispatch.gemm(a, b, kernel=name)
        torch.cuda.synchronize()
        assert _rel(out, _ref(a, b)) < 1.6e-2


@pytest.mark.parametrize("dtype", ["bf16", "fp8e4m3"])
@pytest.mark.parametrize("shape", [(4096, 4096), (4097, 1000), (40, 20000)], ids=lambda s: "x".join(map(str, s)))
def test_every_default_gemv_tile_on_one_row(dtype, shape):
    """Each gemv tile of the default set (bf16 and fp8, which the interpreter cannot run) on a
    decode-like row, a misaligned one (rows of 1000 bf16 are 16-byte multiples, 4097 columns
    are not a multiple of any tile) and a few long columns, with the full epilogue and a batch."""
    n, k = shape
    problem = GemmProblem(1, n, k, batch=2, types=GemmTypes.parse(dtype), layout=GemmLayout.parse("rcr"),
                          epilogue=Epilogue(True, Activation.GELU, True))
    from tiledispatch.ops.gemm.rulesets import DEFAULT_TILES

    dispatcher = triton_only()
    names = [s.name for s in dispatcher.registry
             if s.family == "gemv" and s.definition.supports(s.config, problem) is None]
    itemsize = problem.types.b.itemsize
    tiles = [t for t in DEFAULT_TILES if t.family.value == "gemv" and itemsize in t.b_itemsizes]
    assert len([n for n in names if "_rcr_" in n]) == len(tiles) >= 3  # each tile in the problem's own layout
    for name in names:
        _check(problem, dispatcher, kernel=name)


def test_rules_run_gemv_for_a_decode_row():
    a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16)
    dispatcher = triton_only()
    ops = check_operands(a, w.t())
    assert dispatcher.select(ops.problem).family == "gemv"
    out = tiledispatch.gemm(a, w.t(), dispatcher=dispatcher)
    assert _rel(out, _ref(a, w.t())) < 1.6e-2


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8e4m3", "fp8e4m3xfp8e5m2"])
@pytest.mark.parametrize("shape", [(96, 80, 80, 1), (1000, 1016, 1008, 1), (257, 136, 4112, 3), (2048, 2048, 2048, 1),
                                   (4096, 4096, 512, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_every_warp_specialised_tile(dtype, shape):
    """Each ws-persistent and ws-pingpong tile of the full set (Gluon, compiled for sm_90 only) on
    a problem smaller than one tile, edges of every kind in M, N and K (none a multiple of a
    tile), a batch, and shapes that keep the ring turning over many tiles a program (4096x4096
    over K = 512: 8 tiles a program, each a K loop longer than the ring, the ping-pong turns'
    case). Rows are 16-byte multiples in fp8 too, as TMA needs."""
    m, n, k, batch = shape
    problem = GemmProblem(m, n, k, batch=batch, types=GemmTypes.parse(dtype), layout=GemmLayout.parse("rcr"))
    arch = current_arch()
    registry = Registry.from_rule_set("gemm", "full", arch).filter(
        lambda s: s.config.family.warp_specialised and s.definition.supports(s.config, problem) is None)
    assert {s.family for s in registry} == {"ws-persistent", "ws-pingpong"}
    dispatcher = Dispatcher(registry, arch)
    for spec in registry:
        _check(problem, dispatcher, kernel=spec.name, seed=len(spec.name))


@pytest.mark.parametrize("dtype", ["bf16", "fp8e4m3"])
@pytest.mark.parametrize("epilogue", [Epilogue(True, Activation.GELU, False), Epilogue(False, Activation.SILU, False),
                                      Epilogue(True, Activation.RELU, False)], ids=lambda e: e.name)
def test_warp_specialised_epilogues(dtype, epilogue):
    """Every warp-specialised tile that takes an epilogue (rules.WS_EPILOGUE_REGISTERS: ws-persistent's
    128x128; each ws-pingpong warpgroup holds a whole tile, 128 registers), with bias and
    activations in the partitions' registers, on edges, a batch and 8 tiles a program."""
    arch = current_arch()
    plain = [s.config for s in Registry.from_rule_set("gemm", "full", arch) if s.config.family.warp_specialised
             and s.config.types == GemmTypes.parse(dtype) and s.config.epilogue.plain]
    registry = Registry.from_configs("gemm", [replace(c, epilogue=epilogue) for c in plain], arch)
    assert {s.family for s in registry} == {"ws-persistent"}
    assert all(s.config.block_m * s.config.block_n <= 128 * 128 for s in registry)
    dispatcher = Dispatcher(registry, arch)
    for m, n, k, batch in [(257, 136, 4112, 3), (4096, 4096, 512, 1)]:
        problem = GemmProblem(m, n, k, batch=batch, types=GemmTypes.parse(dtype), layout=GemmLayout.parse("rcr"),
                              epilogue=epilogue)
        for spec in registry:
            _check(problem, dispatcher, kernel=spec.name, seed=len(spec.name))


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
def test_the_vendor_honours_each_calls_tf32_choice_whatever_pytorchs_switch_says(bias):
    """cuBLAS reads PyTorch's process-wide switch: an fp32 call gets exactly what it asked for
    (TF32 or not) under either setting, and the switch is left as it was."""
    a, b = torch.randn(256, 512, device="cuda"), torch.randn(512, 192, device="cuda")
    c = torch.randn(192, device="cuda") if bias else None
    want = _ref(a, b, c)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for switch in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = switch
            for name, tf32 in (("fp32", False), ("tf32", True)):
                kernel = next(s.name for s in tiledispatch.default_dispatcher().registry if s.is_vendor
                              and s.name.startswith(f"gemm_{name}_sss_vendor_{'bias' if bias else 'none'}_"))
                got = tiledispatch.gemm(a, b, bias=c, allow_tf32=tf32, kernel=kernel)
                error = _rel(got, want)
                assert (error > 1e-5) if tf32 else (error < 1e-6), (switch, name, error)
                assert torch.backends.cuda.matmul.allow_tf32 is switch
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
