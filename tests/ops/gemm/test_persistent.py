"""The tma-persistent family: tensor descriptors, a persistent grid, the C store in slices.

The interpreter executes tensor descriptors, so layouts, batching, broadcast operands,
epilogues and partial edge tiles are checked on the CPU in fp16; on a GPU the default
rule set's persistent tiles run in bf16 and fp8 as well.
"""

from __future__ import annotations

import pytest
import torch

from tiledispatch import Dispatcher
from tiledispatch.core.errors import NoKernelError
from tiledispatch.ops.gemm import Activation, Epilogue, Family, GemmLayout, GemmProblem, GemmTypes, check_operands
from tiledispatch.ops.gemm.inputs import make_inputs

from ...conftest import requires_gpu
from .tma_checks import ARCH, DEVICE, family_dispatcher, run_checked



def persistent_dispatcher(rule_set: str) -> Dispatcher:
    return family_dispatcher(Family.TMA_PERSISTENT, rule_set)


@pytest.fixture(scope="module")
def tests_set() -> Dispatcher:
    return persistent_dispatcher("tests")


def check(dispatcher: Dispatcher, problem: GemmProblem, *, kernel=None, broadcast_b=False, seed=0):
    run_checked(dispatcher, Family.TMA_PERSISTENT, problem, kernel=kernel, broadcast_b=broadcast_b, seed=seed)


@pytest.mark.parametrize("layout", ["rrr", "rcr", "crr", "ccr"])
def test_layouts_with_partial_tiles(tests_set, layout):
    # 80 x 48 x 112: partial tiles in M (block 64) and K (block 32); 16-byte rows throughout.
    check(tests_set, GemmProblem(80, 48, 112, types=GemmTypes.parse("fp16"), layout=GemmLayout.parse(layout)))


def test_batched_with_more_tiles_than_programs(tests_set):
    # 3 batches x 2 x 2 tiles = 12 tiles over 4 programs (the interpreter's "SMs"): each program loops.
    check(tests_set, GemmProblem(96, 48, 64, batch=3, types=GemmTypes.parse("fp16")))


def test_broadcast_operand_is_read_at_batch_zero(tests_set):
    check(tests_set, GemmProblem(64, 32, 48, batch=2, types=GemmTypes.parse("fp16")), broadcast_b=True)


@pytest.mark.parametrize("epilogue", [Epilogue(True, Activation.GELU, True), Epilogue(False, Activation.SILU, True),
                                      Epilogue(True, Activation.RELU, False)], ids=lambda e: e.name)
def test_epilogues(tests_set, epilogue):
    check(tests_set, GemmProblem(64, 96, 64, batch=2, types=GemmTypes.parse("fp16"), epilogue=epilogue))


def test_fp8_rcr(tests_set):
    types = GemmTypes.parse("fp8e4m3")
    check(tests_set, GemmProblem(64, 48, 96, types=types, layout=GemmLayout.parse("rcr")))


@pytest.mark.parametrize("k", [64, 224], ids=["a-split-without-k-tiles", "uneven-splits"])
def test_split_k_partials_reduced_with_the_epilogue(tests_set, k):
    # Split 3 over 2 K tiles of 32 leaves the last split none (its slab must still be zeros);
    # over 7 tiles the splits take 3, 3 and 1. The reduction applies bias, activation, residual.
    problem = GemmProblem(48, 64, k, batch=2, types=GemmTypes.parse("fp16"),
                          epilogue=Epilogue(True, Activation.GELU, True))
    (name,) = [s.name for s in tests_set.registry
               if s.config.split_k == 3 and s.definition.supports(s.config, problem) is None]
    check(tests_set, problem, kernel=name, seed=k)


def test_unaligned_problem_takes_only_the_realign_variant(tests_set):
    problem = GemmProblem(65, 33, 100, types=GemmTypes.parse("fp16"))
    inputs = make_inputs(problem, device=DEVICE)
    ops = check_operands(inputs.a, inputs.b, out=inputs.out)
    assert tests_set.select(ops.problem).config.realign
    plain = tests_set.registry.filter(lambda s: not s.config.realign)
    with pytest.raises(NoKernelError):
        Dispatcher(plain, ARCH).select(ops.problem)
    same_signature = [c for c in tests_set.explain(ops.problem).refused if "built for" not in c.refused]
    assert same_signature and all("16-byte aligned" in c.refused for c in same_signature)


# -- on the GPU: every persistent tile of the shipped rule set ------------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype, layout", [("bf16", "rcr"), ("bf16", "rrr"), ("bf16", "ccr"), ("fp16", "crr"),
                                           ("fp8e4m3", "rcr"), ("fp8e4m3xfp8e5m2", "rcr"), ("tf32", "rcr")])
def test_every_default_tile_on_gpu(dtype, layout):
    dispatcher = persistent_dispatcher("default")
    problem = GemmProblem(272, 400, 336, batch=2, types=GemmTypes.parse(dtype), layout=GemmLayout.parse(layout),
                          epilogue=Epilogue(True, Activation.GELU, False))
    names = [s.name for s in dispatcher.registry if s.definition.supports(s.config, problem) is None]
    assert len(names) >= 4, names
    for seed, name in enumerate(names):
        check(dispatcher, problem, kernel=name, seed=seed)


@requires_gpu
@pytest.mark.parametrize("tile, m, n, k", [("128x128x64_w4_s4_g8_k1_e1", 256, 192, 320),
                                          ("64x128x128_w4_s4_g8_k2_e1", 256, 192, 320),
                                          ("128x128x64_w8_s4_g8_k1_e2_realign", 301, 301, 301)],
                         ids=["whole-k", "split-k", "realign"])
def test_fast_path_rebinds_descriptors_to_each_calls_tensors(tile, m, n, k):
    """The second call with the same signature replays the bound plan: its TMA descriptors
    must point at the new tensors, not at the first call's (split-K: at a fresh workspace,
    the one its reduction reads; realign: at fresh aligned copies, one per operand, though
    at 301^3 the copies of A, B and C all have the same shape)."""
    import tiledispatch

    name = f"gemm_bf16_rcr_tma-persistent_{tile}_none_{ARCH.tag}"
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        b = torch.randn(n, k, device="cuda", generator=g).bfloat16().t()
        out = tiledispatch.gemm(a, b, kernel=name)
        torch.cuda.synchronize()
        want = a.double() @ b.double()
        assert torch.allclose(out.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
