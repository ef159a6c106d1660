"""``benchmarks/sizes.py --decode --smoke``: JPEGs decoded in ``data_format_fn``, end to end.

No assertion on speed: that the decode sweep's contenders run, every decoded
image is checked (the contender fails otherwise) and its RESULT keys are there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A benchmark smoke: `make test-smoke` runs it, not `make test`.
pytestmark = [
    pytest.mark.emulator,
    pytest.mark.slow,
    pytest.mark.bench_smoke,
    pytest.mark.timeout(600),
]

ROOT = Path(__file__).resolve().parents[2]


def test_sizes_decode_smoke_reports_every_size_key(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *(sys.executable, str(ROOT / "benchmarks" / "sizes.py"), "--decode", "--smoke"),
            *("--only", "map_default,iter_default,loop"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, TORCHBUCKET_BENCH_OUTPUT=str(tmp_path)),
        cwd=ROOT,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), proc.stdout[-2000:]
    result = json.loads(last[len("RESULT ") :])
    assert json.loads((tmp_path / "sizes_decode.json").read_text())["result"] == result
    for size in ("16kib", "1mib"):
        assert result[f"decode_default_fraction_of_loop_{size}"] > 0
        assert result[f"decode_client_cpu_ms_per_mib_{size}"] > 0
        assert result[f"decode_megapixels_{size}"] > 0
        # Sized at setup to about the size named.
        target = {"16kib": 16 << 10, "1mib": 1 << 20}[size]
        assert 0.8 * target < result[f"decode_jpeg_bytes_{size}"] < 1.2 * target
        assert f"decode_speedup_vs_dataflux_{size}" in result  # null: not run here
