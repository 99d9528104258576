"""Problem sets that look like real use, for sweeps, training and evaluation of learned selection.

Named sets (`available()`) for each op: GEMM from language models' Linears and MoE experts,
square, odd and deep-K shapes; convolution from every conv layer of torchvision's models;
attention from serving and training of language models; log-uniform random shapes; and a
`-small` twin of each that the CPU interpreter runs. `problem_set` builds one, `save_problems`
and `load_problems` move problem lists through JSON, and `fold_of` / `split` / `group_of`
split them for cross-validation, always by problem (or coarser group), never by row;
`vendor_only` names the problems no Triton kernel of a rule set takes; `suite_problems` poses the
cases of a public benchmark suite file.
"""

from .catalog import Built, available, build, get, problem_set
from .coverage import vendor_only
from .files import load_problems, save_problems
from .folds import fold_of, group_of, split, with_groups
from .suites import is_suite_file, suite_problems

__all__ = ["Built", "available", "build", "fold_of", "get", "group_of", "is_suite_file", "load_problems",
           "problem_set", "save_problems", "split", "suite_problems", "vendor_only", "with_groups"]
