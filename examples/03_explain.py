"""Why did the dispatcher pick that kernel? Rank the candidates for one problem.

    python examples/03_explain.py
"""

from tiledispatch import arch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.ops.gemm import GemmLayout, GemmProblem, GemmTypes

hopper = arch.load("sm_90")
dispatcher = Dispatcher(Registry.from_rule_set("gemm", "default", hopper), hopper)
problem = GemmProblem(m=64, n=64, k=65536, types=GemmTypes.parse("bf16"), layout=GemmLayout.parse("rcr"))
explanation = dispatcher.explain(problem)

print(f"selected {explanation.selected.name} from {len(explanation.ranked)} candidates "
      f"({len(explanation.refused)} refused)")
for candidate in explanation.ranked[:5]:
    terms = ", ".join(f"{k}={v:.2f}" for k, v in candidate.score.terms.items() if k != "modelled_us")
    print(f"  {candidate.score.value:.3f}  {candidate.spec.name}  [{terms}]")
print(f"  e.g. refused: {explanation.refused[0].spec.name}: {explanation.refused[0].refused}")
