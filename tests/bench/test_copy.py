"""The benchmarks' copy kernel: the bandwidth baseline of the depthwise figures must copy exactly."""

import pytest
import torch

from tiledispatch.bench.copy import BLOCK, EVEN_ELEMENTS, copy_elements, kernel_copy

from ..conftest import on_gpu

DEVICE = "cuda" if on_gpu() else "cpu"  # the interpreter reads CPU tensors


@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK, 3 * BLOCK + 5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_copies_every_element(n, dtype):
    src = torch.randn(n, dtype=torch.float64).to(dtype).to(DEVICE)
    dst = torch.full((n,), float("nan"), dtype=dtype, device=DEVICE)
    kernel_copy(src, dst)
    assert torch.equal(dst, src)


def test_refuses_mismatched_tensors():
    with pytest.raises(ValueError, match="contiguous tensors of one dtype and size"):
        kernel_copy(torch.zeros(8), torch.zeros(9))
    with pytest.raises(ValueError, match="contiguous"):
        kernel_copy(torch.zeros(4, 4).t(), torch.zeros(4, 4))


@pytest.mark.parametrize("moved", [57_805_344, 24_096_480, 38_542_080, 4, 100])
def test_copy_elements_stay_even_and_close(moved):
    """The benchmark's copy of a conv's bytes: a multiple of 16 elements (vectorized loads), under 32 short."""
    n = copy_elements(moved, 2)
    assert n % EVEN_ELEMENTS == 0
    assert 0 <= moved // 4 - n < 2 * EVEN_ELEMENTS
