"""Compile kernels for an H100/H200 (sm_90) ahead of time, on any machine, into the cache.

    python examples/04_build_ahead_of_time.py
The same as `tiledispatch build --op gemm --rule-set tiny --arch sm_90 --dtype bf16 -j 2
--name-contains _rcr_`. A later process on an sm_90 GPU loads these without compiling.
"""

import tempfile

from tiledispatch import arch
from tiledispatch.core.cache import KernelCache
from tiledispatch.core.kernel import build_all
from tiledispatch.core.registry import Registry

if __name__ == "__main__":  # build workers are spawned processes
    specs = [s for s in Registry.from_rule_set("gemm", "tiny", arch.load("sm_90"))
             if s.dtype == "bf16" and s.config.layout.name == "rcr" and s.config.epilogue.name == "none"]
    cache = KernelCache(tempfile.mkdtemp(prefix="tiledispatch-example-"))
    results = build_all(specs, cache, jobs=2, on_done=lambda r: print(("built " if r.ok else "FAILED ") + r.name))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    again = build_all(specs, cache, jobs=2)  # every key is now a cache hit
    print(f"{len(results)} kernels in {cache.root}: {sum(r.seconds for r in results):.1f} s to build, "
          f"{sum(r.seconds for r in again):.2f} s to find again")
