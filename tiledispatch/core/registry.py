"""The registry: the set of kernel specs a dispatcher may choose from.

Iteration order is insertion order, which is deterministic because rule sets generate
in a fixed order; the `first` strategy relies on it. A re-registration replaces an
entry only at strictly higher priority, so a user's hand-tuned kernel can shadow a
generated one of the same name, and a later import cannot silently undo it.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .. import arch as arch_facts
from .errors import RegistryFormatError, UnknownKernelError
from .jsonio import JsonFileError, read_json
from .memo import LruTable
from .op import OpKind, RuleSet, get_op
from .spec import KernelSpec

log = logging.getLogger("tiledispatch.registry")

FORMAT = "tiledispatch-registry"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Entry:
    spec: KernelSpec
    priority: int


class Registry:
    """Kernel specs by name, in insertion order.

    A registry made by `from_rule_sets` is lazy: it generates, validates and names the kernels of
    one class of problems (an op's `problem_class`: gemm's dtypes, epilogue and layout, say) when a problem
    of that class first asks for `candidates`, so that a process starts without enumerating whole
    rule sets. Anything that reads the whole registry (iteration, `len`, export, a kernel forced by
    a name not generated yet) generates the rest once, in the order an eager registry has.
    """

    def __init__(self, specs: Iterable[KernelSpec] = (), priority: int = 0) -> None:
        self._table: dict[str, Entry] = {}
        self._lock = threading.RLock()
        self._pending: tuple[RuleSetSource, ...] = ()  # lazy sources not yet generated whole
        self._by_op: dict[OpKind, tuple[KernelSpec, ...]] | None = None
        for spec in specs:
            self.add(spec, priority)

    @property
    def _entries(self) -> dict[str, Entry]:
        """Every entry: the lazy sources are generated whole on first use."""
        if self._pending:
            with self._lock:  # a thread that finds none pending finds the table whole
                for source in self._pending:
                    for spec in source.everything():
                        self._table.setdefault(spec.name, Entry(spec, 0))
                self._pending = ()
        return self._table

    @classmethod
    def from_rule_sets(cls, ops: Iterable[OpKind | str], rule_set: RuleSet | str, arch,
                       keep: Callable[[KernelSpec], bool] | None = None) -> "Registry":
        """A lazy registry of each op's `rule_set` on `arch` (see the class docstring); with
        `keep`, of the specs it keeps only."""
        registry = cls()
        registry._pending = tuple(RuleSetSource(get_op(op), RuleSet.parse(rule_set), arch, keep) for op in ops)
        return registry

    def candidates(self, op: OpKind, problem) -> tuple[KernelSpec, ...]:
        """The specs that may take `problem`, in registry order: those of its class where a lazy
        source generates by class, else all of the op's."""
        if self._pending:
            for source in self._pending:
                if source.definition.kind is op and source.by_class:
                    return source.of_class(problem)
        by_op = self._by_op
        if by_op is None:
            grouped: dict[OpKind, list[KernelSpec]] = {}
            for entry in self.entries():
                grouped.setdefault(entry.spec.op, []).append(entry.spec)
            by_op = self._by_op = {kind: tuple(specs) for kind, specs in grouped.items()}
        return by_op.get(op, ())

    # -- building -----------------------------------------------------------------
    def add(self, spec: KernelSpec, priority: int = 0) -> bool:
        """Adds `spec`; returns False when an entry of that name with equal or higher priority stays."""
        name = spec.name
        with self._lock:
            entries = self._entries
            old = entries.get(name)
            if old is not None and priority <= old.priority:
                return False
            entries[name] = Entry(spec, priority)
            self._by_op = None
            return True

    @classmethod
    def from_rule_set(cls, op: OpKind | str, rule_set: RuleSet | str, arch) -> "Registry":
        """The specs of a rule set that are valid on `arch`. Duplicate names are a bug, and raise."""
        rule_set = RuleSet.parse(rule_set)
        return cls.from_configs(op, get_op(op).rule_sets[rule_set](), arch, source=f"rule set {rule_set.value!r}")

    @classmethod
    def from_configs(cls, op: OpKind | str, configs: Iterable, arch, source: str = "configs") -> "Registry":
        """The specs of `configs` that are valid on `arch` (a sweep's own tile space, say).
        Duplicate names are a bug, and raise."""
        return cls(_valid_specs(get_op(op), configs, arch, source))

    def merge(self, other: "Registry") -> "Registry":
        """A new registry with both; on equal names the higher priority wins, ties keep ours."""
        merged = Registry()
        for entry in [*self.entries(), *other.entries()]:
            merged.add(entry.spec, entry.priority)
        return merged

    def filter(self, predicate: Callable[[KernelSpec], bool]) -> "Registry":
        kept = Registry()
        for entry in self.entries():
            if predicate(entry.spec):
                kept.add(entry.spec, entry.priority)
        return kept

    def for_arch(self, arch) -> "Registry":
        name = arch if isinstance(arch, str) else arch.name
        if self._pending and all(source.arch.name == name for source in self._pending) and not self._table:
            return self  # lazy, and of this arch only: stays lazy
        return self.filter(lambda spec: spec.arch == name)

    def for_op(self, op: OpKind | str) -> "Registry":
        op = OpKind.parse(op)
        return self.filter(lambda spec: spec.op is op)

    # -- reading ------------------------------------------------------------------
    def get(self, name: str) -> KernelSpec:
        for source in self._pending:  # a kernel of a class generated already needs no whole registry
            spec = source.generated(name)
            if spec is not None:
                return spec
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else "; `tiledispatch registry list` shows them"
            raise UnknownKernelError(f"no kernel named {name!r} in the registry ({len(self)} kernels){hint}")
        return entry.spec

    def priority(self, name: str) -> int:
        spec = self.get(name)
        entry = self._table.get(name)
        return entry.priority if entry is not None and entry.spec is spec else 0

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def __iter__(self) -> Iterator[KernelSpec]:
        return iter([e.spec for e in self.entries()])

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def lazy(self) -> bool:
        """Whether some rule set is still generated one problem class at a time."""
        return bool(self._pending)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def counts(self) -> dict[str, dict[str, int]]:
        specs = list(self)
        return {
            "by_op": dict(Counter(s.op.value for s in specs)),
            "by_dtype": dict(Counter(s.dtype for s in specs)),
            "by_family": dict(Counter(s.family for s in specs)),
            "by_arch": dict(Counter(s.arch for s in specs)),
        }

    # -- JSON -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        entries = self.entries()
        arches = sorted({e.spec.arch for e in entries})
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "arch": arches[0] if len(arches) == 1 else arches,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "total": len(entries),
            "counts": self.counts(),
            "kernels": [{**e.spec.to_dict(), "priority": e.priority} for e in entries],
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def from_json(cls, data: Any, source: str = "registry") -> "Registry":
        """Reads what `to_json` wrote, checking every field; a bad file raises RegistryFormatError."""

        def bad(message: str) -> RegistryFormatError:
            return RegistryFormatError(f"{source} is not a valid tiledispatch registry: {message}")

        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise bad(f"expected a JSON object with \"format\": \"{FORMAT}\"")
        if data.get("format_version") != FORMAT_VERSION:
            raise bad(f"format_version {data.get('format_version')!r} is not {FORMAT_VERSION}; re-export it")
        kernels = data.get("kernels")
        if not isinstance(kernels, list):
            raise bad("\"kernels\" must be a list")
        if data.get("total") != len(kernels):
            raise bad(f"\"total\" says {data.get('total')!r} but the file holds {len(kernels)} kernels (truncated?)")
        from ..arch import load as load_arch

        registry = cls()
        for i, item in enumerate(kernels):
            try:
                spec = KernelSpec.from_dict(item)
                name = spec.name  # loads the arch: an unknown one raises here, inside the try
                canonical = load_arch(spec.arch).name
                if spec.arch != canonical:  # Dispatcher.for_arch would silently drop it
                    raise ValueError(f"arch {spec.arch!r} is not a canonical arch name; use {canonical!r}")
                priority = item.get("priority", 0)
                if isinstance(priority, bool) or not isinstance(priority, int):
                    raise ValueError(f"priority must be an integer, got {priority!r}")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise bad(f"kernels[{i}]: {e}") from None
            except Exception as e:  # e.g. an unknown op or arch
                raise bad(f"kernels[{i}]: {e}") from None
            if item.get("name") != name:
                raise bad(f"kernels[{i}]: name {item.get('name')!r} does not match its config ({name})")
            if spec.name in registry:
                raise bad(f"kernels[{i}]: {spec.name} appears twice")
            result = spec.definition.validate(spec.config, arch_facts.load(spec.arch))
            if not result.ok:
                raise bad(f"kernels[{i}]: {spec.name} breaks a rule on {spec.arch}: {result.errors[0]}")
            registry.add(spec, priority)
        return registry

    @classmethod
    def load(cls, path: str | Path) -> "Registry":
        """The registry in a JSON file that `save` wrote. The file is untrusted input: it is read
        through jsonio (a regular file only, bounded in size and nesting, never waited on), and
        anything wrong with it raises RegistryFormatError naming the file."""
        path = Path(path)
        try:
            data = read_json(path)
        except FileNotFoundError:
            raise RegistryFormatError(f"registry file {path} does not exist") from None
        except OSError as e:  # no permission, a symlink loop, a name too long, ...
            raise RegistryFormatError(f"cannot read registry file {path}: {e.strerror or e}") from None
        except JsonFileError as e:  # not a regular file, too large, too deep, not UTF-8, not JSON
            reason = str(e).removeprefix(f"{path} ")
            if reason.startswith("is not UTF-8"):  # JSON text is UTF-8 (RFC 8259)
                reason = "is not valid JSON: " + reason.removeprefix("is ")
            raise RegistryFormatError(
                f"cannot read registry file {path}: it {reason}; a registry file is the JSON that "
                "`tiledispatch registry export` writes, whole (was it truncated or edited?)") from None
        return cls.from_json(data, str(path))


class RuleSetSource:
    """One op's rule set on one arch, generated one problem class at a time.

    The op's `problem_class(problem)` names the class, and its rule set generates that class's
    configs alone (`rule_sets[rule_set](within=class)`), in the order of the whole set: so a
    class's candidates are the whole registry's for that problem, in the same order. An op
    without classes is generated whole on first use.
    """

    def __init__(self, definition, rule_set: RuleSet, arch, keep: Callable[[KernelSpec], bool] | None = None) -> None:
        self.definition, self.rule_set, self.arch, self.keep = definition, rule_set, arch, keep
        self.by_class = definition.problem_class is not None
        self._classes = LruTable(None)  # class -> tuple of specs: bounded by the op's classes
        self._names: dict[str, KernelSpec] = {}

    def of_class(self, problem) -> tuple[KernelSpec, ...]:
        key = self.definition.problem_class(problem)
        return self._classes.get_or_make(key, lambda: self._generate(key))

    def generated(self, name: str) -> KernelSpec | None:
        return self._names.get(name)

    def _generate(self, within) -> tuple[KernelSpec, ...]:
        specs = self._kept(_valid_specs(self.definition, self.definition.rule_sets[self.rule_set](within=within),
                                        self.arch, f"rule set {self.rule_set.value!r}"))
        for spec in specs:
            self._names[spec.name] = spec
        return specs

    def everything(self) -> tuple[KernelSpec, ...]:
        return self._kept(_valid_specs(self.definition, self.definition.rule_sets[self.rule_set](), self.arch,
                                       f"rule set {self.rule_set.value!r}"))

    def _kept(self, specs: tuple[KernelSpec, ...]) -> tuple[KernelSpec, ...]:
        return specs if self.keep is None else tuple(spec for spec in specs if self.keep(spec))


def _valid_specs(definition, configs: Iterable, arch, source: str) -> tuple[KernelSpec, ...]:
    """The specs of `configs` valid on `arch`. Duplicate names are a bug, and raise."""
    specs, skipped, seen = [], 0, set()
    for config in configs:
        spec = KernelSpec(definition.kind, config, arch.name)
        if spec.name in seen:  # also for configs this arch drops: rule sets are arch-independent
            raise ValueError(f"{source} generates {spec.name} twice")
        seen.add(spec.name)
        if not definition.validate(config, arch).ok:
            skipped += 1
            continue
        specs.append(spec)
    if skipped:
        log.debug("%s/%s on %s: %d configs invalid there, left out", definition.kind, source, arch.name, skipped)
    return tuple(specs)
