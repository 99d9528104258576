#!/usr/bin/env bash
# Creates .venv (if missing) and installs tiledispatch with its test tools into it.
# Where the environment already satisfies the project (scripts/check_env.py: pyproject's
# requirements met, tiledispatch installed from this checkout), pip is not run: the commands
# then work offline.
# PyTorch is installed first, so that pip never swaps it for another build: on a host with an
# NVIDIA GPU PyPI's CUDA build of torch 2.11 (it requires Triton 3.6.0, the version tested);
# elsewhere PyTorch's CPU build of torch 2.13 (it requires no Triton), from the PyTorch CPU
# index where that index is reachable. TORCH_VERSION and TORCH_CPU_INDEX override these.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
if python scripts/check_env.py 2>/dev/null; then
  echo "setup: .venv satisfies the project; pip not run" >&2
  exit 0
fi
python scripts/check_env.py || true  # says what is missing
if ! python -c "import torch" 2>/dev/null; then
  if nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q "torch==${TORCH_VERSION:-2.11.0}"
  else
    index=${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}
    extra=()
    # An unreachable index costs pip's retries; a host whose pip finds a CPU build anyway skips it.
    if [ -n "$index" ] && python -c "import socket, sys, urllib.parse
socket.getaddrinfo(urllib.parse.urlsplit(sys.argv[1]).hostname, 443)" "$index" 2>/dev/null; then
      extra=(--extra-index-url "$index")
    fi
    python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" ${extra[@]+"${extra[@]}"}
  fi
fi
python -m pip install -q -e ".[test]"
