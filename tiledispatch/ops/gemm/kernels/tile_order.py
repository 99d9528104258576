"""The grouped tile order that the tiled GEMM and the implicit-GEMM conv kernels share."""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, grid_m, grid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program `pid`: GROUP_M rows of tiles are walked column by column, so
    the B tiles they share are still in L2 when the next row needs them."""
    tiles_per_group = GROUP_M * grid_n
    first_m = (pid // tiles_per_group) * GROUP_M
    group_rows = min(grid_m - first_m, GROUP_M)
    return first_m + (pid % tiles_per_group) % group_rows, (pid % tiles_per_group) // group_rows
