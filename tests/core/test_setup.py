"""Set-up a user can trust: `tiledispatch --version`, the LICENSE and py.typed the package
declares, and `scripts/setup.sh` skipping pip (offline) where the environment satisfies the project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tiledispatch
from tiledispatch.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
CHECK_ENV = ROOT / "scripts" / "check_env.py"


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_prints_every_version_as_json():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["tiledispatch"] == tiledispatch.__version__ == _pyproject()["project"]["version"]
    assert got["torch"] == metadata.version("torch") and got["triton"] == metadata.version("triton")
    assert got["python"] == ".".join(map(str, sys.version_info[:3]))


def test_version_runs_before_any_command_and_needs_none():
    """Eager: it answers even beside a command that would fail, and runs nothing else."""
    result = CliRunner().invoke(app, ["--version", "gemm", "-1", "0", "0"])
    assert result.exit_code == 0 and json.loads(result.stdout)["tiledispatch"] == tiledispatch.__version__


def test_the_license_is_the_apache_2_text_pyproject_names():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "http://www.apache.org/licenses/LICENSE-2.0" in text


def test_the_package_is_typed():
    assert _pyproject()["tool"]["setuptools"]["package-data"]["tiledispatch"] == ["py.typed"]
    assert resources.files("tiledispatch").joinpath("py.typed").is_file()


def _check_env(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK_ENV), str(root)], capture_output=True, text=True, timeout=120)


def _copy_project(tmp_path: Path, dependency: str | None = None) -> Path:
    text = (ROOT / "pyproject.toml").read_text()
    if dependency is not None:
        text = text.replace('dependencies = [\n', f'dependencies = [\n    "{dependency}",\n', 1)
    (tmp_path / "pyproject.toml").write_text(text)
    return tmp_path


def test_check_env_accepts_this_environment():
    if Path(tiledispatch.__file__).resolve().parent != ROOT / "tiledispatch":
        pytest.skip("tiledispatch is not installed from this checkout here")
    out = _check_env(ROOT)
    assert out.returncode == 0, out.stderr


def test_check_env_names_an_unmet_requirement_and_another_checkout(tmp_path):
    out = _check_env(_copy_project(tmp_path, "numpy>=999"))
    assert out.returncode == 1
    assert "numpy>=999 is wanted, numpy " in out.stderr
    assert f"not installed from this checkout ({tmp_path.resolve() / 'tiledispatch' / '__init__.py'} wanted" in out.stderr
    (tmp_path / "other").mkdir()
    out = _check_env(_copy_project(tmp_path / "other", "no-such-distribution-here>=1"))
    assert out.returncode == 1 and "no-such-distribution-here>=1 is not installed" in out.stderr


def test_setup_skips_pip_offline_when_the_environment_satisfies_the_project():
    venv = ROOT / ".venv"
    if Path(sys.prefix).resolve() != venv.resolve() or Path(tiledispatch.__file__).resolve().parent != ROOT / "tiledispatch":
        pytest.skip("runs where the tests run from this checkout's .venv, as scripts/test.sh runs them")
    # No index, no local wheels, no pip configuration: any pip install would fail.
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull,
           "PYTHON": "/nonexistent/python"}  # and a venv made afresh would fail too
    out = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "satisfies the project; pip not run" in out.stderr
