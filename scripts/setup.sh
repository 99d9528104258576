#!/usr/bin/env bash
# Creates .venv (if missing) and installs tiledispatch with its test tools into it.
# PyTorch is installed first and pinned, so pip never swaps it for a multi-GB CUDA build.
# Once the environment satisfies the project (the stamp matches pyproject.toml and the
# packages import), pip is not run again: the commands then work offline.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
STAMP=.venv/.tiledispatch-setup
WANT=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
   && python -c "import tiledispatch, torch, triton, numpy, typer, rich, filelock, pytest, xdist" 2>/dev/null; then
  exit 0
fi
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
python -m pip install -q -e ".[test]"
echo "$WANT" > "$STAMP"
