#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite (CPU: kernels under Triton's interpreter),
# spread over every core by pytest-xdist, work-stealing so that no worker idles while another
# still holds a queue of slow tests (TEST_WORKERS=0 runs it in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -n "${TEST_WORKERS:-auto}" --dist worksteal "$@"
