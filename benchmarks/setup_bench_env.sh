#!/usr/bin/env bash
# Create (idempotently) the contenders' environments, with the packages the
# benchmarks compare torchbucket against, kept out of .venv:
#   .venv-bench  gcs-torch-dataflux 1.4.0 and google-cloud-storage<3 (dataflux's
#                checkpoint module imports helpers that 3.x removed);
#   .venv-gcsfs  gcsfs (current) and webdataset: gcsfs 2026.x requires
#                google-cloud-storage>=3.14.1 and imports its asyncio module on
#                import, so it cannot share .venv-bench.
#
#   benchmarks/setup_bench_env.sh            # at the repository root, or anywhere
#   BENCH_VENV=/path FSSPEC_VENV=/path PYTHON=python3.11 benchmarks/setup_bench_env.sh
#
# torch is installed first, pinned, so that pip never pulls another torch build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$ROOT/.venv-bench}"
PYTHON="${PYTHON:-python3}"
FSSPEC_VENV="${FSSPEC_VENV:-$ROOT/.venv-gcsfs}"
STAMP="$VENV/.bench-installed-v3"
FSSPEC_STAMP="$FSSPEC_VENV/.bench-installed-v1"
CHECK="import torch, dataflux_pytorch.dataflux_checkpoint, google.cloud.storage, psutil, aiohttp, numpy"
FSSPEC_CHECK="import torch, gcsfs, webdataset, psutil, aiohttp, numpy"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "setup_bench_env: $VENV is ready"
else
    if [[ ! -x "$VENV/bin/python" ]]; then
        "$PYTHON" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q torch==2.13.0
    "$VENV/bin/python" -m pip install -q 'google-cloud-storage<3' gcs-torch-dataflux==1.4.0 psutil aiohttp numpy
    "$VENV/bin/python" -c "$CHECK"
    touch "$STAMP"
    echo "setup_bench_env: $VENV is ready"
fi

if [[ -f "$FSSPEC_STAMP" ]] && "$FSSPEC_VENV/bin/python" -c "$FSSPEC_CHECK" 2>/dev/null; then
    echo "setup_bench_env: $FSSPEC_VENV is ready"
else
    if [[ ! -x "$FSSPEC_VENV/bin/python" ]]; then
        "$PYTHON" -m venv "$FSSPEC_VENV"
    fi
    "$FSSPEC_VENV/bin/python" -m pip install -q --upgrade pip
    "$FSSPEC_VENV/bin/python" -m pip install -q torch==2.13.0
    # gcsfs for the fsspec contenders; webdataset for benchmarks/shards.py.
    "$FSSPEC_VENV/bin/python" -m pip install -q gcsfs webdataset psutil aiohttp numpy
    "$FSSPEC_VENV/bin/python" -c "$FSSPEC_CHECK"
    touch "$FSSPEC_STAMP"
    echo "setup_bench_env: $FSSPEC_VENV is ready"
fi
