"""Where stream-K's time goes, on three suite shapes in bf16 (GPU only; triton.testing.do_bench,
median, L2 flushed between runs).

For each stream-k tile: the kernel as planned; the same with its flags preset to 1, so no owner
waits (its sums are then wrong: timing only); the stream-k kernel given no stream-K tiles (whole
tiles only, one per program in turn); its tma-persistent twin (same tile); and cuBLAS. The flags'
memset is timed alone and taken off the first two.

    python benchmarks/studies/gemm_stream_k_ablation.py
"""
import importlib

import torch
import triton
from triton.testing import do_bench
from tiledispatch import Dispatcher, Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.core.dispatcher import stream_getter
from tiledispatch.ops.gemm import check_operands

gemm_plan = importlib.import_module("tiledispatch.ops.gemm.plan")
arch = current_arch()
reg = Registry.from_rule_set("gemm", "full", arch)
disp = Dispatcher(reg, arch)
stream = stream_getter(torch.device("cuda"))


def bench(fn):
    return do_bench(fn, warmup=50, rep=300, return_mode="median") * 1e3  # us


for m, n, k in [(128, 6144, 4096), (256, 57344, 8192), (4096, 4096, 4096)]:
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16().t()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ops = check_operands(a, b, out=out)
    print(f"{m}x{n}x{k}: cuBLAS {bench(lambda: torch.mm(a, b, out=out)):.1f} us", flush=True)
    for tile in ("128x128x128_w8_s3", "64x128x128_w4_s4", "128x128x64_w8_s4"):
        sk_name = f"gemm_bf16_rcr_stream-k_{tile}_g8_k1_none_{arch.tag}"
        dp_name = f"gemm_bf16_rcr_tma-persistent_{tile}_g8_k1_e1_none_{arch.tag}"
        spec, launchers = disp.prepare(ops, kernel=sk_name)
        plan = spec.definition.plan(spec.config, ops)
        (launch,) = plan.launches
        (flags,) = plan.zeroed
        names = [name for name, _ in gemm_plan.kernel_units(spec.config, ops.problem.alignment)[0].signature]
        i_sk = names.index("sk_tiles")
        main = launchers["main"]

        def planned():
            flags.zero_()
            main(launch.grid, launch.args, stream())

        def no_wait():
            flags.fill_(1)
            main(launch.grid, launch.args, stream())

        tiles = triton.cdiv(m, spec.config.block_m) * triton.cdiv(n, spec.config.block_n)
        args_dp = list(launch.args)
        args_dp[i_sk] = 0
        grid_dp = (min(tiles, launch.grid[0]), 1, 1)

        def whole_tiles():
            main(grid_dp, tuple(args_dp), stream())

        planned()
        torch.cuda.synchronize()
        err = ((out.float() - (a.float() @ b.float())).abs().max() / (a.float() @ b.float()).abs().max()).item()
        t_zero = bench(lambda: flags.zero_())
        row = {"sk": bench(planned) - t_zero, "sk_no_wait": bench(no_wait) - t_zero, "sk_kernel_whole_tiles": bench(whole_tiles)}
        try:
            dspec, dl = disp.prepare(ops, kernel=dp_name)
            dplan = dspec.definition.plan(dspec.config, ops)
            row["persistent_twin"] = bench(lambda: dl["main"](dplan.launches[0].grid, dplan.launches[0].args, stream()))
        except Exception:  # no such twin in the rule set
            row["persistent_twin"] = float("nan")
        print(f"  {tile}: sk_tiles {launch.args[i_sk]} of {tiles} over {launch.grid[0]}; err {err:.1e}; memset {t_zero:.1f} us; "
              + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
