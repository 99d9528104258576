"""Where igemm-tma's backward-weight goes wrong: the tile that swept `wrong`, beside its variants.

The sweeps found `igemm-tma_4x16x128x128_w8_s4_k1` (the one backward-weight tile whose A operand
comes from registers with four pipeline stages) wrong on two problems, the same in bf16 and fp16
and on every rerun, and right on 78 others. For each problem here (the two, and variants with fewer
or more programs), this runs that tile and the other register-A boxes (more and fewer pixels, two
to four stages, four and eight warps) with three operand seeds, each into a NaN-poisoned output
checked against the float64 reference (`core.launch.run_checked`), and prints each run's relative
error and, where it is above 3e-3 (twice the right kernels' bf16 rounding), the taps and 128-row
blocks of K that hold the error. It runs boxes the rules now refuse (REGISTER_A_PIPELINE) too.

    python benchmarks/studies/igemm_tma_wrong.py
"""

from __future__ import annotations

import dataclasses
import json

import torch

from tiledispatch.bench.candidates import CandidatePolicy, planned
from tiledispatch.bench.table import problem_from_row
from tiledispatch.core.dispatcher import Dispatcher, stream_getter
from tiledispatch.core.kernel import build_all
from tiledispatch.core.launch import run_checked
from tiledispatch.core.op import get_op
from tiledispatch.core.registry import Registry
from tiledispatch.core.runtime import current_arch
from tiledispatch.core.spec import KernelSpec

# Each a change of the 8x16x128x128 box over 8 warps and 3 stages (which sums right).
VARIANTS = {"4x16 s4 (swept)": dict(tile_h=4, num_stages=4), "4x16 s3": dict(tile_h=4),
            "4x16 s2": dict(tile_h=4, num_stages=2), "4x16 w4 s4": dict(tile_h=4, num_warps=4, num_stages=4),
            "2x32 s4": dict(tile_h=2, tile_w=32, num_stages=4), "8x8 s3": dict(tile_w=8),
            "2x16x32x32 w4 s3": dict(tile_h=2, block_out=32, block_in=32, num_warps=4),
            "4x8x16x16 w4 s2": dict(tile_h=4, tile_w=8, block_out=16, block_in=16, num_warps=4, num_stages=2),
            "8x16 s3": {}, "16x8 s3": dict(tile_h=16, tile_w=8),
            "8x16x64x64 w4 s3": dict(block_out=64, block_in=64, num_warps=4)}
GROUPED = ('{"c":512,"dilation":[1,1],"direction":"bwd_weight","epilogue":{"activation":"none","bias":false,'
           '"residual":false},"filter_size":[3,3],"groups":32,"input_size":[14,14],"k":512,"n":1,"padding":[1,1],'
           '"source_layout":"channels-last","stride":[1,1],"types":{"allow_tf32":false,"dtype":"bf16"}}')
DENSE_3D = ('{"c":512,"dilation":[1,1,1],"direction":"bwd_weight","epilogue":{"activation":"none","bias":false,'
            '"residual":false},"filter_size":[1,3,3],"groups":1,"input_size":[2,7,7],"k":1152,"n":4,'
            '"padding":[0,1,1],"source_layout":"channels-last","stride":[1,1,1],"types":{"allow_tf32":false,'
            '"dtype":"bf16"}}')


def problems() -> list[tuple[str, dict]]:
    grouped, dense = json.loads(GROUPED), json.loads(DENSE_3D)
    return [("grouped 14x14 G32", grouped), ("grouped G4", grouped | {"c": 64, "k": 64, "groups": 4}),
            ("grouped N8", grouped | {"n": 8}), ("3-D N4 K1152", dense), ("3-D K128", dense | {"k": 128}),
            ("3-D N32", dense | {"n": 32}), ("2-D N8 K1152", dense | {"input_size": [7, 7], "filter_size": [3, 3],
             "padding": [1, 1], "dilation": [1, 1], "stride": [1, 1], "n": 8})]


def where_wrong(out: torch.Tensor, expected: torch.Tensor) -> str:
    """The taps and 128-row blocks of K whose error is above a tenth of the worst."""
    err = (out.double() - expected.double().to(out.device)).abs().reshape(out.shape[0], out.shape[1], -1)
    worst = err.amax()
    taps = [t for t in range(err.shape[2]) if err[:, :, t].amax() > worst / 10]
    blocks = [b for b in range(0, err.shape[0], 128) if err[b:b + 128].amax() > worst / 10]
    nan = int(torch.isnan(out).sum())
    return f"taps {taps} of {err.shape[2]}, K blocks {[b // 128 for b in blocks]}, NaN {nan}"


def main() -> None:
    arch = current_arch()
    definition = get_op("conv")
    device = torch.device("cuda")
    dispatcher = Dispatcher(Registry.from_rule_sets([definition.kind], "default", arch), arch)
    for label, fields in problems():
        problem = problem_from_row("conv", json.dumps(fields))
        problem = dataclasses.replace(problem, specialization=problem.dense_specialization())
        policy = CandidatePolicy(match="igemm-tma_8x16x128x128_w8_s3_k1_")
        base = next(p.spec for p in planned(dispatcher, problem, policy) if not p.vendor and p.refused is None)
        specialization = definition.specialization_of(problem)
        specs = [KernelSpec(base.op, dataclasses.replace(base.config, **change), base.arch) for change in VARIANTS.values()]
        for result in build_all(specs, dispatcher.cache, len(specs), specializations=(specialization,)):
            if not result.ok:
                print(f"{label:18} build of {result.name} failed: {(result.error or '')[:200]}", flush=True)
        for seed in range(3):
            operands = definition.tuning_operands(problem, device, seed)
            expected = definition.reference(operands)
            for name, spec in zip(VARIANTS, specs):
                try:
                    launchers = Dispatcher(Registry((spec,)), arch).launchers(spec, specialization)
                    plan, cmp = run_checked(definition, spec.config, operands, expected, launchers,
                                            stream_getter(device)(), device)
                except Exception as e:  # a variant the compiler refuses is a finding, not a stop
                    print(f"{label:18} seed {seed} {name:14} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                tail = "" if cmp.relative_error < 3e-3 else "  " + where_wrong(plan.output, expected)
                print(f"{label:18} seed {seed} {name:14} {'ok   ' if cmp.passed else 'WRONG'} rel "
                      f"{cmp.relative_error:.2e}{tail}", flush=True)


if __name__ == "__main__":
    main()
