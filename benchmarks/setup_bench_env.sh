#!/usr/bin/env bash
# Create (idempotently) the contenders' environment, .venv-bench: the packages the
# benchmarks compare torchbucket against, kept out of .venv because
# gcs-torch-dataflux 1.4.0 needs google-cloud-storage<3.
#
#   benchmarks/setup_bench_env.sh            # at the repository root, or anywhere
#   BENCH_VENV=/path PYTHON=python3.11 benchmarks/setup_bench_env.sh
#
# torch is installed first, pinned, so that pip never pulls another torch build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$ROOT/.venv-bench}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.bench-installed-v1"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "import torch, dataflux_pytorch, google.cloud.storage, psutil, aiohttp, numpy" 2>/dev/null; then
    echo "setup_bench_env: $VENV is ready"
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q 'google-cloud-storage<3' gcs-torch-dataflux==1.4.0 psutil aiohttp numpy
"$VENV/bin/python" -c "import torch, dataflux_pytorch, google.cloud.storage, psutil, aiohttp, numpy"
touch "$STAMP"
echo "setup_bench_env: $VENV is ready"
