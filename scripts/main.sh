#!/usr/bin/env bash
# Sets up .venv and runs the main job: one GEMM, selected, run and validated
# (on the CPU interpreter without a GPU). Extra arguments replace the default problem.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
if [ $# -eq 0 ]; then
  set -- gemm 96 80 72 --dtype fp16 --validate
fi
tiledispatch "$@"
