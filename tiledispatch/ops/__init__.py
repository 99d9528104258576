"""The ops. Importing this package registers each with the core (`core.op.register`): the
package, not the core, knows which ops exist. The order is the order `core.op.all_ops` and a
default dispatcher's registry follow."""

from . import gemm, conv, attention  # noqa: F401  (each registers itself)
