"""Generate a registry from a rule set, export it to JSON, read it back, and compare.

    python examples/02_registry_json.py
"""

import tempfile
from pathlib import Path

from tiledispatch import arch
from tiledispatch.core.registry import Registry

registry = Registry.from_rule_set("gemm", "tiny", arch.load("sm_90"))
hopper_bf16 = registry.filter(lambda spec: spec.dtype == "bf16" and spec.config.layout.name == "rcr")
print(f"{len(registry)} kernels in gemm/tiny for sm_90; {len(hopper_bf16)} of them bf16 rcr")

path = Path(tempfile.mkdtemp()) / "registry.json"
hopper_bf16.save(path)
loaded = Registry.load(path)
assert [s.name for s in loaded] == [s.name for s in hopper_bf16]
assert [s.config for s in loaded] == [s.config for s in hopper_bf16]
print(f"wrote and re-read {path}: {len(loaded)} kernels, identical; first is {next(iter(loaded)).name}")
