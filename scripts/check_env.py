"""Exits 0 where this Python environment already satisfies the project, so `setup.sh` runs no pip.

Satisfied means: every requirement of pyproject.toml's `dependencies` and of its `test` extra
(markers honoured) is met by an installed distribution, and `tiledispatch` resolves to this
checkout (an editable install of it). It reads installed metadata only: no network, and no
import of torch or Triton, so it answers offline in a fraction of a second. Otherwise it exits
1 and says on stderr what is missing.

    python scripts/check_env.py [PROJECT_ROOT]
"""

from __future__ import annotations

import sys
from importlib import metadata, util
from pathlib import Path

EXTRA = "test"


def _requirement_type():
    try:
        from packaging.requirements import Requirement
    except ModuleNotFoundError:  # pip vendors it, and every venv has pip
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(path.read_text(encoding="utf-8"))


def problems(root: Path) -> list[str]:
    """What this environment lacks for the project at `root`, empty where nothing."""
    try:
        project = _load_toml(root / "pyproject.toml")["project"]
        requirement = _requirement_type()
    except (OSError, KeyError, ModuleNotFoundError, ValueError) as e:
        return [f"cannot read {root / 'pyproject.toml'}: {type(e).__name__}: {e}"]
    wanted = list(project.get("dependencies", [])) + list(project.get("optional-dependencies", {}).get(EXTRA, []))
    missing = []
    for text in wanted:
        req = requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": EXTRA}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{req} is not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            missing.append(f"{req} is wanted, {req.name} {have} is installed")
    spec = util.find_spec(project["name"])
    here = (root / project["name"] / "__init__.py").resolve()
    if spec is None or spec.origin is None or Path(spec.origin).resolve() != here:
        found = "nowhere" if spec is None else spec.origin
        missing.append(f"{project['name']} is not installed from this checkout ({here} wanted, found {found})")
    return missing


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = problems(root.resolve())
    for problem in found:
        print(f"check_env: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
