"""Conv correctness on the CPU interpreter (and natively on a GPU): every direction, 1-D/2-D/3-D,
odd sizes, stride/padding/dilation, groups from 1 to depthwise, both Triton families, fp16 and fp32.

Every run writes into a NaN-poisoned output and is compared with PyTorch's CPU
convolution in float64 (relative Frobenius error within the dtype's tolerance, no
element left unwritten). Shapes stay tiny: the interpreter runs each program in NumPy.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import Dispatcher, Registry
from tiledispatch.core.errors import UnsupportedError
from tiledispatch.ops.conv import (
    ConvSignature,
    DirectConfig,
    Direction,
    Family,
    ImplicitGemmConfig,
    SourceLayout,
    SplitMode,
    check_operands,
)
from tiledispatch.ops.conv.inputs import make_inputs
from tiledispatch.ops.conv.problem import ConvEpilogue
from tiledispatch.ops.conv.rulesets import TESTS_DIRECT, TESTS_GEMM
from tiledispatch.ops.gemm.problem import Activation

from .helpers import ARCH, DEVICE, problem, run_and_check, spec_name

DIRECTIONS = list(Direction)
IGEMM_TILES = [t for t in TESTS_GEMM if t.family is Family.IMPLICIT_GEMM]  # the tests that build igemm configs


@pytest.fixture(scope="module")
def dispatcher() -> Dispatcher:
    return Dispatcher(Registry.from_rule_set("conv", "tests", ARCH), ARCH)


def best_of(dispatcher, p, family: Family, padded: bool = False) -> str:
    """The highest-ranked kernel of `family` for `p` (the test forces it), with or without channel padding."""
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    names = [c.spec.name for c in dispatcher.explain(ops.problem).ranked
             if c.spec.family == family.value and getattr(c.spec.config, "pad_channels", False) == padded]
    assert names, f"no {family.value} kernel (padded: {padded}) supports {p.describe()}"
    return names[0]


# -- every tile of the `tests` rule set ------------------------------------------------------
def _tiles(direction):
    weight = direction is Direction.BWD_WEIGHT
    gemm = [t for t in TESTS_GEMM if t.serves(direction) and not t.pad_channels]  # padded: test_padded_channels
    direct = [t for t in TESTS_DIRECT if (t.split_k == 1 or weight) and not t.window]  # windows: test_window.py
    return [(direction, t) for t in gemm + direct]


def _tile_id(case) -> str:
    direction, t = case
    kind = t.family.value if hasattr(t, "block_m") else "direct"
    return f"{direction.short}-{kind}-{'x'.join(str(v) for v in vars(t).values() if isinstance(v, int))}"


def _tile_cases() -> list:
    """(direction, tile, dtype), pairwise: a tile that serves several directions takes fp16 and fp32 in
    turn over them, one that serves a single direction takes both; so every tile meets both dtypes,
    every direction both dtypes and every tile each direction it serves."""
    cases = [c for d in DIRECTIONS for c in _tiles(d)]
    served: dict = {}
    for direction, t in cases:
        served.setdefault(t, []).append(direction)
    out = []
    for direction, t in cases:
        turn = served[t].index(direction) + list(served).index(t)
        dtypes = ["fp16", "fp32"] if len(served[t]) == 1 else [("fp16", "fp32")[turn % 2]]
        out += [pytest.param((direction, t), dtype, id=f"{_tile_id((direction, t))}-{dtype}") for dtype in dtypes]
    return out


def test_every_tile_meets_both_dtypes():
    met: dict = {}
    for param in _tile_cases():
        (direction, t), dtype = param.values
        met.setdefault(t, set()).add(dtype)
        met.setdefault(direction, set()).add(dtype)
    assert all(dtypes == {"fp16", "fp32"} for dtypes in met.values())


@pytest.mark.parametrize(("case", "dtype"), _tile_cases())
def test_every_tile(dispatcher, case, dtype):
    # Odd sizes everywhere: 7x5 pixels, 3 groups of 3 input and 2 output channels, a 3x2 filter.
    direction, t = case
    p = problem(direction, 2, 9, 6, 3, (7, 5), (3, 2), 1, (1, 0), 1, dtype)
    sig = ConvSignature(direction, p.types)
    if hasattr(t, "block_m"):
        config = ImplicitGemmConfig(sig, t.block_m, t.block_n, t.block_k, t.group_m, t.num_warps, t.num_stages,
                                    t.split_k, t.split_mode, t.groups_per_tile, t.family)
    else:
        config = DirectConfig(sig, t.block_p, t.block_c, t.num_warps, t.split_k)
    run_and_check(dispatcher, p, spec_name(config))


# -- dimensionality and geometry ---------------------------------------------------------------
GEOMETRIES = {
    "1d": ((11,), (3,), 1, 0, 1),
    "1d-s2-p1-d2": ((13,), (3,), 2, 1, 2),
    "2d-3x3-p1": ((6, 7), (3, 3), 1, 1, 1),
    "2d-5x3-s2": ((9, 8), (5, 3), 2, 0, 1),
    "2d-d2-p2": ((7, 6), (3, 3), 1, 2, 2),
    "2d-1x1": ((5, 6), (1, 1), 1, 0, 1),
    "2d-mixed": ((8, 9), (2, 3), (2, 1), (0, 1), (1, 2)),
    "3d-3x3x3-p1": ((3, 4, 5), (3, 3, 3), 1, 1, 1),
    "3d-mixed": ((5, 4, 6), (2, 3, 2), (1, 2, 1), (0, 1, 1), (2, 1, 1)),
}


def _geometry_cases() -> list:
    """Every (direction, geometry) pair, the family in turn (igemm, direct): every geometry meets both
    families over its three directions, and every direction both families."""
    families = (Family.IMPLICIT_GEMM, Family.DIRECT)
    return [pytest.param(d, g, families[(i + j) % 2], id=f"{d.value}-{g}-{families[(i + j) % 2].value}")
            for i, d in enumerate(DIRECTIONS) for j, g in enumerate(GEOMETRIES)]


@pytest.mark.parametrize(("direction", "geometry", "family"), _geometry_cases())
def test_dims_and_geometry(dispatcher, direction, geometry, family):
    size, filt, stride, padding, dilation = GEOMETRIES[geometry]
    p = problem(direction, 2, 4, 6, 2, size, filt, stride, padding, dilation)
    run_and_check(dispatcher, p, best_of(dispatcher, p, family))


# -- igemm-flat: few channels a group, the filter's (tap, channel) pairs as one index ------------------
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
def test_flat_geometry(dispatcher, direction, geometry):
    size, filt, stride, padding, dilation = GEOMETRIES[geometry]
    p = problem(direction, 2, 6, 4, 2, size, filt, stride, padding, dilation)  # C/G = 3
    run_and_check(dispatcher, p, best_of(dispatcher, p, Family.IMPLICIT_GEMM_FLAT))


@pytest.mark.parametrize("family", [Family.IMPLICIT_GEMM_FLAT, Family.IMPLICIT_GEMM], ids=lambda f: f.value)
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
def test_stem(dispatcher, direction, family):
    """An image model's stem in small: 3 channels, 7x7 stride 2 (147 flat pairs: 5 steps of 32, the last
    ragged; backward-data's gather meets 16, 12 or 9 taps a pixel by its phase). x and w are not 16-byte
    aligned but dy and y are (K = 16): the kernels' output side is compiled with vectors (VEC_Y), its
    input side without."""
    p = problem(direction, 2, 3, 16, 1, (13, 12), (7, 7), 2, 3, 1)
    ops, _ = run_and_check(dispatcher, p, best_of(dispatcher, p, family))
    assert ops.problem.specialization.tag == "al00-ya"


def test_flat_data_gradient_stages(dispatcher):
    """The flat backward-data is two launches, the tensor-core columns then the gather, over one fp32
    column matrix [G, taps x C/G, output pixels] that the plan makes (its scratch)."""
    from tiledispatch.ops.conv.plan import plan

    p = problem(Direction.BWD_DATA, 2, 6, 4, 2, (9, 8), (5, 3), 2, 1, 1)  # output 4x4 (5x3 taps, stride 2)
    name = best_of(dispatcher, p, Family.IMPLICIT_GEMM_FLAT)
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    made = plan(dispatcher.registry.get(name).config, ops)
    assert [launch.stage for launch in made.launches] == ["main", "col2im"]
    assert made.launches[1].grid == (1, 2, 4)  # 2 images x 5 x 4 pixels of a phase in one block; groups; phases
    (columns,) = made.scratch
    assert columns.dtype == torch.float32 and columns.numel() == 2 * (2 * 4 * 4) * (15 * 3)


# -- igemm-flat on channels padded to 16-byte vectors (pad_channels): x and w copied with zeros, dw cut back
PADDED = {"1d-p1": ((11,), (3,), 1, 1, 1), "2d-stem": ((13, 12), (7, 7), 2, 3, 1),
          "3d-mixed": GEOMETRIES["3d-mixed"]}


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("geometry", PADDED, ids=str)
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_WEIGHT], ids=lambda d: d.value)
def test_padded_channels(dispatcher, direction, geometry, dtype):
    size, filt, stride, padding, dilation = PADDED[geometry]
    p = problem(direction, 2, 3, 16, 1, size, filt, stride, padding, dilation, dtype)
    run_and_check(dispatcher, p, best_of(dispatcher, p, Family.IMPLICIT_GEMM_FLAT, padded=True))


def test_padded_channels_with_epilogue_and_views(dispatcher):
    """The padded forward keeps the epilogue (bias, activation, residual), and takes contiguous NCHW tensors."""
    p = problem("forward", 2, 5, 8, 1, (9, 7), (3, 3), 2, 1, 1, epilogue=ConvEpilogue(True, Activation.RELU, True))
    kernel = best_of(dispatcher, p, Family.IMPLICIT_GEMM_FLAT, padded=True)
    run_and_check(dispatcher, p, kernel)
    run_and_check(dispatcher, p, kernel, channels_last=False)


@pytest.mark.parametrize("c, k, g, reason", [(8, 16, 1, "nothing to pad"), (6, 16, 2, "one group"),
                                             (3, 12, 1, "output side")], ids=["aligned", "grouped", "k12"])
def test_padded_channels_refusals(dispatcher, c, k, g, reason):
    p = problem("forward", 2, c, k, g, (6, 6), (3, 3), 1, 1, 1)
    ops = check_operands(p.direction, **make_inputs(p, device=DEVICE).kwargs(p))
    sig = ConvSignature(p.direction, p.types)
    padded = spec_name(ImplicitGemmConfig(sig, 32, 16, 32, 4, 2, 2, family=Family.IMPLICIT_GEMM_FLAT,
                                          pad_channels=True))
    with pytest.raises(UnsupportedError, match=reason):
        dispatcher.resolve(padded, ops.problem)


# -- backward-data's stride phases ---------------------------------------------------------------
# The igemm kernel visits, for each phase i % stride, only the taps whose residue reaches an output
# pixel: phases that no tap reaches (filter 1 < stride 2; dilation 2 at stride 2 with odd padding)
# must still be written, as zeros; dilation 3 at stride 2 alternates taps between phases.
PHASES = {
    "1d-f1-s2": ((10,), (1,), 2, 0, 1),
    "1d-s2-d2-p1": ((11,), (3,), 2, 1, 2),
    "1d-s3-d2-p2": ((14,), (4,), 3, 2, 2),
    "2d-s3x2-d3x1": ((9, 10), (4, 3), (3, 2), (1, 2), (3, 1)),
    "2d-stem-like": ((12, 11), (7, 7), 2, 3, 1),
    "3d-s2": ((5, 6, 4), (3, 2, 3), (2, 2, 1), (1, 0, 1), 1),
}


@pytest.mark.parametrize("groups", [1, 2], ids=lambda g: f"g{g}")
@pytest.mark.parametrize("geometry", PHASES, ids=str)
def test_bwd_data_phases(dispatcher, geometry, groups):
    size, filt, stride, padding, dilation = PHASES[geometry]
    p = problem("bwd_data", 2, 3 * groups, 4 * groups, groups, size, filt, stride, padding, dilation)
    run_and_check(dispatcher, p, best_of(dispatcher, p, Family.IMPLICIT_GEMM))


# -- groups, from dense to depthwise ------------------------------------------------------------
GROUPS = {
    "dense": (6, 5, 1),
    "g2-aligned": (16, 16, 2),  # 8 fp16 channels per group: 16-byte runs, the vectorised path
    "g4": (8, 12, 4),
    "depthwise": (8, 8, 8),
    "depthwise-x2": (4, 8, 4),  # channel multiplier 2
    "c-gt-k": (12, 4, 2),
}


@pytest.mark.parametrize("groups", GROUPS, ids=str)
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
def test_groups(dispatcher, direction, groups):
    """The dispatcher's own pick or the direct family's best, in turn: every grouping meets both over its
    three directions, every direction both over the groupings."""
    c, k, g = GROUPS[groups]
    p = problem(direction, 2, c, k, g, (5, 6), (3, 3), 1, 1, 1)
    if (DIRECTIONS.index(direction) + list(GROUPS).index(groups)) % 2:
        run_and_check(dispatcher, p, best_of(dispatcher, p, Family.DIRECT))
    else:
        run_and_check(dispatcher, p)


def test_specialisations_are_detected(dispatcher):
    ops, _ = run_and_check(dispatcher, problem("forward", 2, 16, 16, 2, (4, 4), (1, 1)))
    assert ops.problem.specialization.aligned and ops.problem.specialization.pointwise
    assert ops.problem.specialization.tag == "al11-pw-s1-c8-r1"  # a 1x1 filter is one row too
    ops, _ = run_and_check(dispatcher, problem("forward", 2, 16, 16, 16, (4, 4), (3, 3), 1, 1))
    assert ops.problem.specialization.depthwise and not ops.problem.specialization.groups_aligned
    assert ops.problem.specialization.tag == "al10-dw-s1"
    ops, _ = run_and_check(dispatcher, problem("forward", 1, 3, 5, 1, (4, 4), (3, 3)))
    assert not ops.problem.specialization.aligned and not ops.problem.specialization.one_row
    ops, _ = run_and_check(dispatcher, problem("forward", 2, 16, 16, 16, (9,), (4,), 1, 1))
    assert ops.problem.specialization.tag == "al10-dw-s1-r1"


def test_tf32(dispatcher):
    run_and_check(dispatcher, problem("forward", 2, 8, 8, 2, (5, 5), (3, 3), 1, 1, 1, "tf32"))


# -- epilogue ------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", [Family.IMPLICIT_GEMM, Family.IMPLICIT_GEMM_FLAT, Family.DIRECT],
                         ids=lambda f: f.value)
@pytest.mark.parametrize("epilogue", [ConvEpilogue(True, Activation.RELU, True), ConvEpilogue(True, Activation.GELU),
                                      ConvEpilogue(False, Activation.SILU, True)], ids=lambda e: e.name)
def test_forward_epilogue(dispatcher, epilogue, family):
    p = problem("forward", 2, 6, 4, 2, (5, 6), (3, 3), 1, 1, 1, epilogue=epilogue)
    run_and_check(dispatcher, p, best_of(dispatcher, p, family))


# -- split backward-weight --------------------------------------------------------------------------
def _weight_config(p, split_k, mode):
    return spec_name(ImplicitGemmConfig(ConvSignature(p.direction, p.types), 32, 16, 16, 2, 2, 2, split_k, mode))


def test_split_workspace_is_deterministic_and_atomic_agrees(dispatcher):
    # 3 splits over 5 pixel tiles of 16: one split gets a single tile.
    p = problem("bwd_weight", 2, 8, 8, 2, (7, 6), (3, 3), 1, 1, 1, "fp32")
    inputs = make_inputs(p, device=DEVICE, seed=3)
    ops = check_operands(p.direction, **inputs.kwargs(p))
    first = dispatcher.run(ops, kernel=_weight_config(p, 3, SplitMode.WORKSPACE)).clone()
    second = dispatcher.run(ops, kernel=_weight_config(p, 3, SplitMode.WORKSPACE)).clone()
    assert torch.equal(first, second)
    plain_name = spec_name(ImplicitGemmConfig(ConvSignature(p.direction, p.types), 32, 32, 32, 4, 4, 2))
    plain = dispatcher.run(ops, kernel=plain_name).clone()
    torch.testing.assert_close(first, plain, rtol=1e-5, atol=1e-5)
    atomic_name = spec_name(ImplicitGemmConfig(ConvSignature(p.direction, p.types), 16, 32, 32, 1, 2, 2, 2,
                                               SplitMode.ATOMIC))
    atomic = dispatcher.run(ops, kernel=atomic_name)
    torch.testing.assert_close(atomic, plain, rtol=1e-5, atol=1e-5)


def test_an_atomic_split_lists_its_workspace_as_zeroed():
    """Atomic adds need their one fp32 slab made as zeros, on every replay of the plan too (the plan's
    `zeroed`); slabs each written whole need no zeroing, and an unsplit plan has no workspace."""
    from tiledispatch.ops.conv.plan import kernel_units, plan

    p = problem("bwd_weight", 2, 8, 8, 2, (7, 6), (3, 3), 1, 1, 1, "fp32")
    ops = check_operands(p.direction, **make_inputs(p, device="cpu").kwargs(p))
    sig = ConvSignature(p.direction, p.types)
    config = ImplicitGemmConfig(sig, 16, 32, 32, 1, 2, 2, 2, SplitMode.ATOMIC)
    atomic = plan(config, ops)
    (workspace,) = atomic.zeroed
    assert workspace.dtype == torch.float32 and workspace.numel() == 8 * 9 * 4 and not workspace.any()
    names = [name for name, _ in kernel_units(config, ops.problem.specialization)[0].signature]
    assert dict(zip(names, atomic.launches[0].args))["ws_ptr"] is workspace
    assert plan(ImplicitGemmConfig(sig, 32, 16, 16, 2, 2, 2, 3, SplitMode.WORKSPACE), ops).zeroed == ()
    assert plan(ImplicitGemmConfig(sig, 32, 32, 32, 4, 4, 2), ops).zeroed == ()
    # channels padded first: the inner plan's zeroed workspace is the outer plan's
    p = problem("bwd_weight", 2, 3, 16, 1, (9, 7), (3, 3), 1, 1, 1, "fp32")
    ops = check_operands(p.direction, **make_inputs(p, device="cpu").kwargs(p))
    padded = plan(ImplicitGemmConfig(ConvSignature(p.direction, p.types), 32, 16, 32, 4, 2, 2, 2, SplitMode.ATOMIC,
                                     family=Family.IMPLICIT_GEMM_FLAT, pad_channels=True), ops)
    assert len(padded.zeroed) == 1 and not padded.zeroed[0].any()


# -- layouts, the public functions and the output --------------------------------------------------
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
def test_contiguous_inputs_are_converted_and_said_so(dispatcher, direction):
    p = problem(direction, 2, 4, 4, 2, (5, 5), (3, 3), 1, 1)
    ops, _ = run_and_check(dispatcher, p, channels_last=False)
    assert ops.problem.source_layout is SourceLayout.CONVERTED and ops.converted
    assert "converted" in dispatcher.explain(ops.problem).to_dict()["problem"]["layout"]
    ops, _ = run_and_check(dispatcher, p)
    assert ops.problem.source_layout is SourceLayout.CHANNELS_LAST and not ops.converted


def test_public_functions_match_pytorch(dispatcher):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 7, 5, generator=g).to(DEVICE, torch.float32)  # contiguous NCHW
    w = torch.randn(4, 3, 3, 2, generator=g).to(DEVICE, torch.float32)
    bias = torch.randn(4, generator=g).to(DEVICE, torch.float32)
    args = {"stride": (2, 1), "padding": (1, 0), "dilation": 1, "groups": 2}
    y = tiledispatch.conv(x, w, bias=bias, activation="relu", dispatcher=dispatcher, **args)
    want = F.relu(F.conv2d(x.double().cpu(), w.double().cpu(), bias.double().cpu(), **args))
    torch.testing.assert_close(y.double().cpu(), want, rtol=1e-5, atol=1e-5)
    assert y.stride(1) == 1  # channels-last

    dy = torch.randn(*want.shape, generator=g).to(DEVICE, torch.float32)
    dx = tiledispatch.conv_backward_data(dy, w, x.shape, dispatcher=dispatcher, **args)
    torch.testing.assert_close(dx.double().cpu(), torch.nn.grad.conv2d_input(
        x.shape, w.double().cpu(), dy.double().cpu(), **args), rtol=1e-5, atol=1e-5)
    dw = tiledispatch.conv_backward_weight(x, dy, w.shape[2:], dispatcher=dispatcher, **args)
    torch.testing.assert_close(dw.double().cpu(), torch.nn.grad.conv2d_weight(
        x.double().cpu(), w.shape, dy.double().cpu(), **args), rtol=1e-5, atol=1e-5)


def test_public_conv_with_the_default_dispatcher():
    x = torch.randn(1, 4, 6, device=DEVICE, dtype=torch.float16)
    w = torch.randn(4, 1, 3, device=DEVICE, dtype=torch.float16)
    y = tiledispatch.conv(x, w, padding=1, groups=4)
    want = F.conv1d(x.double().cpu(), w.double().cpu(), padding=1, groups=4)
    torch.testing.assert_close(y.double().cpu(), want, rtol=2e-3, atol=2e-3)


def test_out_is_written_in_place(dispatcher):
    x = torch.randn(2, 8, 5, 5, device=DEVICE).to(memory_format=torch.channels_last)
    w = torch.randn(8, 4, 3, 3, device=DEVICE).to(memory_format=torch.channels_last)
    out = torch.full((2, 8, 3, 3), float("nan"), device=DEVICE).to(memory_format=torch.channels_last)
    y = tiledispatch.conv(x, w, groups=2, out=out, dispatcher=dispatcher)
    assert y.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
    torch.testing.assert_close(out.cpu(), F.conv2d(x.cpu(), w.cpu(), groups=2), rtol=1e-4, atol=1e-4)


def test_strided_channels_last_views_are_read_in_place(dispatcher):
    # A crop of a larger channels-last tensor: channels stay contiguous, pixel strides are the big tensor's.
    big = torch.randn(2, 6, 9, 9, device=DEVICE).to(memory_format=torch.channels_last)
    x = big[:, :, 1:7, 2:8]
    w = torch.randn(6, 3, 3, 3, device=DEVICE)
    ops = check_operands("forward", x=x, w=w, groups=2)
    assert ops.converted == ("w",) and ops.x.data_ptr() == x.data_ptr()
    y = tiledispatch.conv(x, w, groups=2, dispatcher=dispatcher)
    torch.testing.assert_close(y.cpu(), F.conv2d(x.cpu(), w.cpu(), groups=2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("merged", [2, 4])
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_DATA], ids=lambda d: d.value)
def test_merged_groups_on_aligned_channels(dispatcher, direction, merged):
    # 8 fp16 channels per group (16 bytes, the vectorised path), 5 groups: the last tile is partial.
    p = problem(direction, 2, 40, 40, 5, (5, 6), (3, 3), 1, 1, 1)
    tile = next(t for t in IGEMM_TILES if t.groups_per_tile == merged)
    config = ImplicitGemmConfig(ConvSignature(direction, p.types), tile.block_m, tile.block_n, tile.block_k,
                                tile.group_m, tile.num_warps, tile.num_stages, groups_per_tile=merged)
    ops, _ = run_and_check(dispatcher, p, spec_name(config))
    assert ops.problem.specialization.groups_aligned


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_DATA], ids=lambda d: d.value)
def test_whole_channel_blocks_and_unit_stride(dispatcher, direction, stride):
    """C/G = K/G = 32 with block_k 32 and 16: the loop without channel masks (EVEN_K). Backward-data
    runs one phase of every tap at stride 1, four phases of their taps at stride 2 (dilation 2 and
    uneven borders on top)."""
    p = problem(direction, 2, 64, 64, 2, (7, 9), (3, 3), stride, 2, 2)
    tiles = [t for t in IGEMM_TILES if t.split_k == 1 and t.groups_per_tile == 1 and t.block_k in (16, 32)]
    turn = ([Direction.FORWARD, Direction.BWD_DATA].index(direction) + stride - 1) % 2
    assert len(tiles) == 4
    for tile in tiles[2 * turn:2 * turn + 2]:  # each tile meets both directions and both strides, not 2 x 2
        config = ImplicitGemmConfig(ConvSignature(direction, p.types), tile.block_m, tile.block_n, tile.block_k,
                                    tile.group_m, tile.num_warps, tile.num_stages)
        ops, _ = run_and_check(dispatcher, p, spec_name(config))
        assert ops.problem.specialization.channel_multiple == 32
        assert ops.problem.specialization.unit_stride == (stride == 1)


@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BWD_DATA], ids=lambda d: d.value)
def test_partial_channel_blocks(dispatcher, direction):
    """C/G = 24, K/G = 40 (fp16: 16-byte aligned, not a multiple of block_k 32): the masked channel loop."""
    p = problem(direction, 2, 48, 80, 2, (5, 6), (3, 3), 1, 1)
    tile = next(t for t in IGEMM_TILES if t.block_k == 32 and t.split_k == 1 and t.groups_per_tile == 1)
    config = ImplicitGemmConfig(ConvSignature(direction, p.types), tile.block_m, tile.block_n, tile.block_k,
                                tile.group_m, tile.num_warps, tile.num_stages)
    ops, _ = run_and_check(dispatcher, p, spec_name(config))
    assert ops.problem.specialization.channel_multiple == 8 and ops.problem.specialization.groups_aligned


PIXEL_WALKS = ("2d-s1", "2d-s2", "3d-mixed", "1x1")


def pixel_walk_tiles(geometry: str) -> list:
    """Tile j of the 7 walks geometries j and j + 1 (mod 4): each tile meets two of them, each of them
    three or four tiles, masked and unmasked channel blocks among them (not every tile x every walk)."""
    tiles = [t for t in IGEMM_TILES if t.groups_per_tile == 1]
    g = PIXEL_WALKS.index(geometry)
    return [t for j, t in enumerate(tiles) if g in (j % 4, (j + 1) % 4)]


def test_the_pixel_walks_meet_every_tile_twice_and_both_channel_loops():
    met = [t for geometry in PIXEL_WALKS for t in pixel_walk_tiles(geometry)]
    tiles = [t for t in IGEMM_TILES if t.groups_per_tile == 1]
    assert sorted(map(tiles.index, met)) == sorted(list(range(len(tiles))) * 2)
    for geometry in PIXEL_WALKS:  # C = K = 32: a 64-wide channel block is masked, a 16 or 32 one not
        assert {max(t.block_m, t.block_n) == 64 for t in pixel_walk_tiles(geometry)} == {True, False}, geometry


@pytest.mark.parametrize("geometry", PIXEL_WALKS, ids=str)
def test_weight_gradient_pixel_walk(dispatcher, geometry):
    """Backward-weight carries its pixel coordinates from step to step (`advance_pixel`): steps of 16-64
    pixels over output rows of 3-7 wrap W, H, D and N at once. C = K = 32 in one group (groups are
    test_groups'): tiles of 16 and 32 drop the channel masks (EVEN_K), 64-wide ones keep them. Every
    tile of `tests`, split or not, on two walks."""
    shapes = {"2d-s1": (2, (7, 9), (3, 3), 1, 2, 2), "2d-s2": (3, (9, 8), (3, 2), 2, 1, 1),
              "3d-mixed": (2, (4, 5, 6), (2, 3, 2), (1, 2, 1), (0, 1, 1), (2, 1, 1)),
              "1x1": (3, (5, 3), (1, 1), 1, 0, 1)}
    n, size, filt, stride, padding, dilation = shapes[geometry]
    p = problem("bwd_weight", n, 32, 32, 1, size, filt, stride, padding, dilation)
    for tile in pixel_walk_tiles(geometry):
        config = ImplicitGemmConfig(ConvSignature(Direction.BWD_WEIGHT, p.types), tile.block_m, tile.block_n,
                                    tile.block_k, tile.group_m, tile.num_warps, tile.num_stages, tile.split_k,
                                    tile.split_mode)
        ops, _ = run_and_check(dispatcher, p, spec_name(config))
        assert ops.problem.specialization.channel_multiple == 32


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_flat_data_gradient_channel_passes(dispatcher, dtype):
    """C/G = 5 takes the gather two passes of 4 channels (the second ragged), in 2 groups and 3-D."""
    p = problem(Direction.BWD_DATA, 2, 10, 4, 2, (4, 6, 5), (2, 3, 3), (1, 2, 2), 1, 1, dtype)
    run_and_check(dispatcher, p, best_of(dispatcher, p, Family.IMPLICIT_GEMM_FLAT))
