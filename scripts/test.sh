#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite (CPU: kernels under Triton's interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
python -m pytest -q "$@"
